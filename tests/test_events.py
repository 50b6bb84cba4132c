"""The queue's event stream (issue 30): ``queue.events``, its switch, and its agreement with the journals."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob
from venturi_redis._store import calls_obs

pytestmark = pytest.mark.anyio

LUA = Path(vr.__file__).resolve().parent.parent / "lua"


def test_the_default_switch_is_the_same_in_lua_and_python() -> None:
    m = re.search(r"local EVENTS_DEFAULT = '(\d+)'", (LUA / "include" / "events.lua").read_text())
    assert m is not None and m.group(1) == calls_obs.EVENTS_DEFAULT


async def _take(it: object, n: int, timeout: float = 10) -> list[vr.QueueEvent]:
    """The next ``n`` events of jobs (the switch's own entries, ``events_on``..., skipped)."""
    out: list[vr.QueueEvent] = []
    with anyio.fail_after(timeout):
        async for event in it:  # type: ignore[attr-defined]
            if not event.job_id:
                continue
            out.append(event)
            if len(out) == n:
                break
    return out


async def test_on_by_default_and_off_writes_nothing(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Echo(text="x"))
    await drain(queue, EchoJob)
    assert [(e.event, e.job_id) for e in await _all(queue)] == [
        ("enqueued", jid),
        ("claimed", jid),
        ("completed", jid),
    ]
    await queue.set_events(False)
    n = await queue.client.redis.xlen(queue.keys.events)
    await queue.enqueue(Echo(text="y"))
    await drain(queue, EchoJob)
    assert await queue.client.redis.xlen(queue.keys.events) == n


async def test_every_transition_is_an_event_agreeing_with_the_journal(queue: vr.Queue) -> None:
    await queue.set_events(True, maxlen=1000)
    ok = await queue.enqueue(Echo(text="hi"))
    flaky = await queue.enqueue(Flaky(fail_times=1))
    doomed = await queue.enqueue(Doomed())
    await drain(queue, EchoJob, FlakyJob, DoomedJob)
    events = await _take(queue.events(since="0"), 11, timeout=5)
    by_job: dict[str, list[str]] = {}
    for e in events:
        by_job.setdefault(e.job_id, []).append(e.event)
        assert isinstance(e.at, type(events[0].at)) and e.id
    # The journal's entries, event for event (the journal's `enqueued` is written lazily from the hash).
    for jid in (ok, flaky, doomed):
        journal = [j.event for j in await queue.journal(jid)]
        assert by_job[jid] == journal, (jid, by_job[jid], journal)
    assert by_job[flaky] == ["enqueued", "claimed", "failed", "claimed", "completed"]
    kinds = {e.job_id: e.kind for e in events}
    assert kinds[ok] == Echo.KIND and kinds[doomed] == Doomed.KIND
    failed = next(e for e in events if e.event == "failed")
    assert failed.note == "boom 1" and failed.run == 1 and failed.details["failures"] == "1"
    assert failed.details["error_type"] == "RuntimeError" and "traceback" not in failed.details
    claimed = next(e for e in events if e.event == "claimed")
    assert claimed.details["worker"]


async def test_a_follower_sees_new_events_and_filters_by_kind(queue: vr.Queue) -> None:
    await queue.set_events(True)
    await queue.enqueue(Echo(text="before"))  # before the follower: "$" skips its events
    await drain(queue, EchoJob)
    got: list[vr.QueueEvent] = []

    async def follow() -> None:
        got.extend(await _take(queue.events(kinds=[Echo.KIND]), 3))

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.sleep(0.2)  # the follower has taken its position
        await queue.enqueue(Doomed())  # another kind: filtered out
        jid = await queue.enqueue(Echo(text="after"))
        await drain(queue, EchoJob, DoomedJob)
    assert [(e.job_id, e.event) for e in got] == [(jid, "enqueued"), (jid, "claimed"), (jid, "completed")]


async def test_a_consumer_that_resumes_from_its_last_id_misses_nothing(queue: vr.Queue) -> None:
    await queue.set_events(True)
    ids = [await queue.enqueue(Echo(text=str(i))) for i in range(3)]
    first = await _take(queue.events(since="0"), 2)  # then "disconnects"
    ids += [await queue.enqueue(Echo(text=str(i))) for i in range(3, 5)]
    rest = await _take(queue.events(since=first[-1].id), 3)
    assert [e.job_id for e in first + rest] == ids
    assert all(e.event == "enqueued" for e in first + rest)


async def test_switched_off_again_it_stops_and_a_bad_field_is_the_default(queue: vr.Queue) -> None:
    await queue.set_events(True, maxlen=5)
    await queue.enqueue_many([Echo(text=str(i)) for i in range(300)])
    # MAXLEN ~ trims whole nodes (100 entries each on Redis): near its cap, never at 300.
    assert await queue.client.redis.xlen(queue.keys.events) <= 200
    await queue.set_events(False)
    n = await queue.client.redis.xlen(queue.keys.events)
    await queue.enqueue(Echo(text="off"))
    assert await queue.client.redis.xlen(queue.keys.events) == n
    for bad in ("lots", "99999999999999999999", "1000000001"):  # unusable: the default (on)
        await queue.client.redis.hset(queue.keys.meta, "events", bad)
        jid = await queue.enqueue(Echo(text="bad"))
        (last,) = await queue.client.redis.xrevrange(queue.keys.events, count=1)
        assert last[1][b"job"] == jid.encode()
    with pytest.raises(vr.ConfigurationError):
        await queue.set_events(True, maxlen=0)


async def test_a_workflow_job_is_an_event_from_its_enqueue(queue: vr.Queue) -> None:
    """enqueue_flow.lua emits `enqueued` too; the waiting job's journal entries are events."""
    await queue.set_events(True)
    first = await queue.enqueue(Echo(text="first"))
    then = await queue.enqueue(Echo(text="then"), after=[first])
    await drain(queue, EchoJob)
    events = await _take(queue.events(since="0"), 9)
    mine = [e.event for e in events if e.job_id == then]
    assert mine == [j.event for j in await queue.journal(then)]
    assert mine[:2] == ["enqueued", "waiting"] and mine[-1] == "completed"


async def test_a_scheduled_job_is_an_event_from_its_fire(queue: vr.Queue) -> None:
    """schedule_fire.lua emits the `enqueued` of the job it creates, naming the schedule."""
    await queue.set_events(True)
    await queue.schedule("hourly", Echo(text="tick"), every=3600)
    job_id = await queue.trigger_schedule("hourly")
    (event,) = await _take(queue.events(since="0"), 1)
    assert (event.event, event.job_id, event.kind) == ("enqueued", job_id, Echo.KIND)
    assert event.details["schedule"] == "hourly"


async def test_the_switch_is_in_the_stream_and_a_deleted_stream_is_made_again(queue: vr.Queue) -> None:
    """events_on / events_off entries; a stream deleted by hand is made again by
    the next event (a DEL is not a switch: the meta field is)."""
    await queue.set_events(True, maxlen=100)
    await queue.enqueue(Echo(text="a"))
    await queue.set_events(False)
    await queue.enqueue(Echo(text="not seen"))
    names = [e.event for e in await _all(queue)]
    assert names == ["events_on", "enqueued", "events_off"]
    await queue.set_events(True)
    await queue.client.redis.delete(queue.keys.events)  # an operator's DEL
    jid = await queue.enqueue(Echo(text="b"))
    assert [(e.event, e.job_id) for e in await _all(queue)] == [("enqueued", jid)]


async def _all(queue: vr.Queue) -> list[vr.QueueEvent]:
    raw = await queue.client.redis.xrange(queue.keys.events)
    return [e for i, f in raw for e in vr.QueueEvent.all_from_stream(i, f)]


class Keyed(vr.Task):
    KIND: ClassVar[str] = "keyed"

    def limit_key(self) -> str | None:
        return "tenant-1"


async def test_an_enqueue_in_the_extended_layout_is_an_event_too(queue: vr.Queue) -> None:
    """A job with a limit key takes enqueue.lua's other path (its first EXISTS is the limits hash's)."""
    await queue.set_events(True)
    await queue.set_limit(Keyed.KIND, concurrency=1, per_key=True)
    ids = await queue.enqueue_many([Keyed(), Keyed()])
    got = await _take(queue.events(since="0"), 2)
    assert [(e.event, e.job_id, e.kind) for e in got] == [("enqueued", i, Keyed.KIND) for i in ids]


async def test_a_reclaimed_lease_is_an_event(queue: vr.Queue) -> None:
    """reclaim.lua: the expired lease and the requeue, as the journal says."""
    await queue.set_events(True)
    jid = await queue.enqueue(Echo(text="orphan"))
    gone = make_worker(queue, EchoJob, lease=0.001)
    await gone._runners[0].claim(1)  # claimed, never run: its worker "died"
    await anyio.sleep(0.05)
    await drain(queue, EchoJob)
    events = [e.event for e in await _take(queue.events(since="0"), 5)]
    assert events == [j.event for j in await queue.journal(jid)]
    assert events[:3] == ["enqueued", "claimed", "lease_expired"]


async def test_a_stream_of_the_wrong_type_loses_events_never_a_transition(queue: vr.Queue) -> None:
    """Issue 38 item 6: the event is every script's last write and never fails it; an
    enqueue that raised after writing its job made a caller's retry a duplicate."""
    r = queue.client.redis
    await r.set(queue.keys.events, "not a stream")
    one = await queue.enqueue(Echo(text="one"))
    many = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    doomed = await queue.enqueue(Doomed())
    await drain(queue, EchoJob, DoomedJob, max_failures=1)
    states = {j: (await queue.get(j)).state for j in (one, *many, doomed)}  # type: ignore[union-attr]
    assert states == {**{j: vr.JobState.COMPLETED for j in (one, *many)}, doomed: vr.JobState.DEAD}
    assert await r.get(queue.keys.events) == b"not a stream"


async def test_an_operators_retry_of_many_is_one_entry_with_their_note(queue: vr.Queue) -> None:
    """retry_dead.lua writes one entry per call (events.lua emit_many), the note shared; each
    job's failure count before the retry stays in its journal (``failures_before``)."""
    await queue.set_events(True)
    ids = await queue.enqueue_many([Doomed() for _ in range(3)])
    await drain(queue, DoomedJob)
    before = await queue.client.redis.xlen(queue.keys.events)
    assert sorted(await queue.retry_dead()) == sorted(ids)
    assert await queue.client.redis.xlen(queue.keys.events) == before + 1
    got = [e for e in await _all(queue) if e.event == "retried"]
    assert sorted(e.job_id for e in got) == sorted(ids)
    assert {(e.kind, e.run, e.note) for e in got} == {(Doomed.KIND, 1, "retried by an operator")}
    entry = got[0].id.split("/")[0]
    assert [e.id for e in got] == [f"{entry}/{k}" for k in range(3)]
    # One job (``venturi job retry``): the one-job form, the same fields.
    await drain(queue, DoomedJob)
    assert await queue.retry(ids[0])
    last = (await _all(queue))[-1]
    assert (last.event, last.job_id, last.kind, last.run) == ("retried", ids[0], Doomed.KIND, 2)
    assert last.note == "retried by an operator" and "/" not in last.id
    journal = await queue.journal(ids[0])
    assert [(j.event, j.details.get("failures_before")) for j in journal if j.event == "retried"] == [
        ("retried", "1"),
        ("retried", "1"),
    ]
