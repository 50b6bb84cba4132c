"""Reading a damaged job (queue.get, queue.list_jobs, queue.journal): shown with the damage marked.

On every backend (redis, memory, cluster): one hand-edited field or a wrong-type
key never makes a read raise; the CLI's handling of the same is in test_cli.py.
"""

from __future__ import annotations

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("field", "raw", "typed"),
    [
        ("failures", b"xyz", ("failures", 0)),
        ("state", b"zombie", ("state", vr.JobState.PENDING)),
        ("priority", b"urgent", ("priority", vr.Priority.NORMAL)),
        ("eligible_at", b"nan", ("eligible_at", None)),
        ("payload", b"\xc1\xff", ("payload", None)),
    ],
)
async def test_a_corrupt_field_is_marked_and_defaulted(
    client: vr.Client, queue: vr.Queue, field: str, raw: bytes, typed: tuple[str, object]
) -> None:
    bad, fine = await queue.enqueue_many([Echo(text="a"), Echo(text="b")])
    await client.redis.hset(queue.keys.job(bad), field, raw)
    info = await queue.get(bad)
    assert info is not None and info.corrupt == {field: raw.decode("utf-8", "replace")}
    assert getattr(info, typed[0]) == typed[1]
    listed = {j.id: j for j in await queue.list_jobs()}
    assert set(listed) == {bad, fine} and listed[fine].corrupt == {}
    assert listed[bad].state == vr.JobState.PENDING  # from the index it was listed from


async def test_a_wrong_type_job_key_is_listed_as_unreadable(client: vr.Client, queue: vr.Queue) -> None:
    bad, fine = await queue.enqueue_many([Doomed(), Doomed()])
    await drain(queue, DoomedJob)
    await client.redis.delete(queue.keys.job(bad))
    await client.redis.set(queue.keys.job(bad), "x")
    listed = {j.id: j for j in await queue.list_jobs(state="dead")}
    assert set(listed) == {bad, fine} and "WRONGTYPE" in listed[bad].corrupt["key"]
    assert listed[bad].state == vr.JobState.DEAD and listed[fine].corrupt == {}
    assert [j.id for j in await queue.list_jobs(kind="doomed")] == [fine]


async def test_a_hand_written_journal_entry_is_marked(client: vr.Client, queue: vr.Queue) -> None:
    jid = await queue.enqueue(Doomed())
    await drain(queue, DoomedJob)
    await client.redis.xadd(queue.keys.journal(jid), {"event": "failed", "at": "noon", "run": "2"})
    last = (await queue.journal(jid))[-1]
    assert (last.event, last.run, last.corrupt) == ("failed", 2, {"at": "noon"})


@pytest.mark.parametrize("raw", [b"yesterday", b"nan", b"\xc1\xff", b"1e3"])
async def test_a_job_never_claimed_with_a_corrupt_created_at_is_readable(
    client: vr.Client, queue: vr.Queue, raw: bytes
) -> None:
    """Its journal is the `enqueued` entry made from the hash (no stream yet): marked, not raised."""
    bad, fine = await queue.enqueue_many([Echo(text="a"), Echo(text="b")])
    await client.redis.hset(queue.keys.job(bad), "created_at", raw)
    info = await queue.get(bad)
    assert info is not None and info.corrupt == {"created_at": raw.decode("utf-8", "replace")}
    (entry,) = await queue.journal(bad)
    assert entry.event == "enqueued" and entry.corrupt == {"at": raw.decode("utf-8", "replace")}
    assert [e.event for e in await queue.journal(fine)] == ["enqueued"]
