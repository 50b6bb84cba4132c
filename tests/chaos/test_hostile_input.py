"""Scenario 8: hostile input. Each case gets a clear error with nothing
written, or is stored safely; nothing read from Redis is ever unpickled,
imported or called by name.

Rules exercised (and documented where they live):

* payload and carry size: ``Client(max_payload_bytes=...)``, checked on the
  encoded bytes before anything is sent (``_client.py``);
* queue names and the key namespace: ``_keys.NAME_RULE`` (1-128 characters of
  ``A-Z a-z 0-9 _ . -``), so no name can break the ``{hash tag}`` or alias
  another queue's keys;
* dedup keys: any UTF-8 text of 1 to 1024 bytes; they are hash *fields*,
  length-prefixed with the KIND (``_keys.dedup_field``), never part of a key
  name, so they cannot move a key to another slot or collide across KINDs;
* KINDs: 1 to 256 printable characters (``_task.validate_kind``); they are
  stored in the job hash and the dedup field, never in a key name.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from redis.crc import key_slot
from redis.exceptions import OutOfMemoryError

import venturi_redis as vr
from tests.chaos.conftest import figures
from tests.servers import RedisServer
from tests.tasks import Counter, Echo, EchoJob, Steps, StepsJob

pytestmark = pytest.mark.anyio

HOSTILE = ["{x}", "}{", "a:b", "*", "a b", "a\nb", "ä€𝄞", "\udcff", "k" * 10_000]


class Keyed(vr.Task):
    KIND: ClassVar[str] = "hostile.keyed"
    key: str

    def dedup_key(self) -> str | None:
        return self.key


class KeyedOther(vr.Task):
    """Another KIND whose (kind, key) pairs could alias Keyed's without the length prefix."""

    KIND: ClassVar[str] = "hostile.keyed:x"
    key: str

    def dedup_key(self) -> str | None:
        return self.key


@pytest.fixture
async def rclient(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    client = vr.Client.from_url(redis_server.url, max_payload_bytes=1000)
    try:
        yield client
    finally:
        await client.aclose()


async def _keys_of(client: vr.Client, q: vr.Queue) -> list[bytes]:
    return [k async for k in client.redis.scan_iter(match=q.keys.prefix.replace("{", "[{]") + "*")]


async def test_payload_over_the_cap_writes_nothing(rclient: vr.Client, queue_name: str) -> None:
    q = rclient.queue(queue_name)
    with pytest.raises(vr.PayloadTooLarge, match=r"over the cap of 1000"):
        await q.enqueue(Echo(text="x" * 2000))
    # One oversized task in a batch: the whole batch is refused before sending.
    with pytest.raises(vr.PayloadTooLarge):
        await q.enqueue_many([Echo(text="ok")] * 10 + [Echo(text="x" * 2000)])
    with pytest.raises(vr.PayloadTooLarge, match="carry"):
        await q.enqueue(Steps(), carry=Counter(seen=["y" * 2000]))
    with pytest.raises(vr.PayloadTooLarge, match="resume value"):
        await q.resume("01ARZ3NDEKTSV4RRFFQ69G5FAV", "z" * 2000)
    assert await _keys_of(rclient, q) == []
    figures("payload-cap", attempts=4, rejected=4, keys_written=0)


@pytest.mark.parametrize("name", [*HOSTILE, "", "-leading", "x" * 129])
def test_hostile_queue_names_are_rejected(name: str) -> None:
    client = vr.Client(None)
    with pytest.raises(vr.ConfigurationError, match="invalid queue name") as err:
        client.queue(name)
    assert "A-Z a-z 0-9" in str(err.value)  # the rule is in the message
    with pytest.raises(vr.ConfigurationError, match="namespace"):
        vr.Client(None, namespace=name)


async def test_hostile_dedup_keys_are_fields_in_one_slot(rclient: vr.Client, queue_name: str) -> None:
    q = rclient.queue(queue_name)
    accepted: dict[str, str] = {}
    rejected = []
    for key in HOSTILE:
        try:
            accepted[key] = await q.enqueue(Keyed(key=key))
        except (vr.ConfigurationError, vr.PayloadError) as exc:
            rejected.append((key[:10], str(exc)[:60]))
    # Not UTF-8 text (the payload holding it cannot be encoded either), or over
    # 1024 bytes: refused with the rule in the message, before anything is sent.
    assert [k for k in HOSTILE if k not in accepted] == ["\udcff", "k" * 10_000]
    # The same key again merges into the same job (the field is found again).
    for key, job in accepted.items():
        assert await q.enqueue(Keyed(key=key)) == job
    # A KIND whose name ends like a key prefix does not alias: ("hostile.keyed:x", "a")
    # and ("hostile.keyed", "x:a") are different fields.
    other = await q.enqueue(KeyedOther(key="b"))
    assert other not in accepted.values()
    fields = {f.decode() for f in await rclient.redis.hkeys(q.keys.dedup)}
    assert len(fields) == len(accepted) + 1
    # Every key the queue wrote is in the queue's slot: no key name contains a dedup key.
    slot = key_slot(q.keys.prefix.encode())
    keys = await _keys_of(rclient, q)
    assert {key_slot(k) for k in keys} == {slot}
    assert not any(b"hostile" in k for k in keys)
    figures("hostile-dedup-keys", tried=len(HOSTILE), stored=len(accepted), rejected=len(rejected))


async def test_hostile_kinds(rclient: vr.Client, queue_name: str) -> None:
    q = rclient.queue(queue_name)
    for kind in ["a\nb", "\udcff", "k" * 10_000, ""]:
        bad = type("Bad", (vr.Task,), {"KIND": kind, "__annotations__": {"KIND": ClassVar[str]}})
        with pytest.raises(vr.TaskDefinitionError, match="KIND"):
            await q.enqueue(bad())
    weird = "{x}:* ä"
    ok = type("Weird", (vr.Task,), {"KIND": weird, "__annotations__": {"KIND": ClassVar[str]}})
    job = await q.enqueue(ok())
    info = await q.get(job)
    assert info is not None
    assert info.kind == weird
    keys = await _keys_of(rclient, q)
    assert {key_slot(k) for k in keys} == {key_slot(q.keys.prefix.encode())}
    assert await q.enqueue_many([]) == []
    assert await _keys_of(rclient, q) == keys


class _Boom:
    """Unpickling this would create a file: proof that nothing is ever unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


async def test_garbage_and_pickles_in_a_job_hash_go_dead(
    rclient: vr.Client, queue_name: str, tmp_path: Path
) -> None:
    q = rclient.queue(queue_name)
    marker = tmp_path / "unpickled"
    r = rclient.redis
    jobs = {
        "garbage payload": (await q.enqueue(Echo(text="a")), "payload", b"\xc1\xff\x00garbage"),
        "pickle payload": (await q.enqueue(Echo(text="b")), "payload", pickle.dumps(_Boom(str(marker)))),
        "garbage carry": (await q.enqueue(Steps()), "carry", b"\xc1\xc1"),
        "pickle carry": (await q.enqueue(Steps()), "carry", pickle.dumps(_Boom(str(marker)))),
        "wrong shape": (await q.enqueue(Echo(text="c")), "payload", b"\x93\x01\x02\x03"),
    }
    for job, field, value in jobs.values():
        await r.hset(q.keys.job(job), field, value)
    # A KIND written by hand: looked up among registered handlers only, never imported.
    by_hand = await q.enqueue(Echo(text="d"))
    await r.hset(q.keys.job(by_hand), "kind", "os.system")
    worker = vr.Worker(q, concurrency=4, lease=5.0, handle_signals=False, poll_interval=0.1)
    worker.register(EchoJob, StepsJob)
    with anyio.fail_after(20):
        await worker.run(until_idle=True)
    for what, (job, _, _) in jobs.items():
        journal = await q.journal(job)
        assert journal[-1].event == "dead", what
        assert journal[-1].details["reason"] == "invalid_payload", what
        assert "does not decode" in (journal[-1].note or ""), what
    journal = await q.journal(by_hand)
    assert journal[-1].details["reason"] == "unknown_kind"
    assert "os.system" in (journal[-1].note or "")
    assert not marker.exists(), "something was unpickled"
    figures("bad-payloads", jobs=len(jobs) + 1, dead=len(jobs) + 1, unpickled=0)


async def test_unknown_kind_goes_dead_with_the_reason(rclient: vr.Client, queue_name: str) -> None:
    q = rclient.queue(queue_name)
    job = await q.enqueue(Steps())
    worker = vr.Worker(q, lease=5.0, handle_signals=False, poll_interval=0.1)
    worker.register(EchoJob)  # not Steps
    with anyio.fail_after(20):
        await worker.run(until_idle=True)
    info = await q.get(job)
    assert info is not None
    assert info.state == vr.JobState.DEAD
    assert (await q.journal(job))[-1].details["reason"] == "unknown_kind"


class Hold(vr.Task):
    KIND: ClassVar[str] = "hostile.hold"


_released = anyio.Event()


class HoldJob(Hold, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await _released.wait()
        return vr.Outcome.completed()


async def _fill(r: Any) -> int:
    """Write filler until Redis refuses with OOM, with ever smaller values so no
    room is left for even a small write; returns the number of keys written."""
    n = 0
    for size in (50_000, 1_000, 50):
        blob = b"f" * size
        while True:
            try:
                await r.set(f"filler:{n}", blob)
            except OutOfMemoryError:
                break
            n += 1
    return n


async def test_redis_at_maxmemory(queue_name: str) -> None:
    """With ``noeviction`` Redis refuses writes at maxmemory instead of silently
    evicting keys (which would lose jobs): enqueue fails with Redis' OOM error
    and nothing partial; a worker survives its failing lease renewals."""
    global _released
    _released = anyio.Event()
    with RedisServer("--maxmemory", "4mb", "--maxmemory-policy", "noeviction") as server:
        client = vr.Client.from_url(server.url)
        q = client.queue(queue_name)
        r = client.redis
        try:
            running = await q.enqueue(Hold())
            worker = vr.Worker(q, lease=3.0, handle_signals=False, poll_interval=0.2)
            worker.register(HoldJob)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                while (await q.counts())["running"] != 1:
                    await anyio.sleep(0.02)
                filler = await _fill(r)
                # Hold it firmly over the limit: idle clients' buffers being freed
                # would otherwise let a small write slip under it now and then.
                await r.config_set("maxmemory", "2mb")
                before = sorted(await _keys_of(client, q))
                with pytest.raises(OutOfMemoryError, match="maxmemory"):
                    await q.enqueue(Echo(text="too much"))
                with pytest.raises(OutOfMemoryError):
                    await q.enqueue_many([Echo(text=str(i)) for i in range(100)])
                with pytest.raises(OutOfMemoryError):
                    await q.enqueue(Keyed(key="k"))
                assert sorted(await _keys_of(client, q)) == before  # nothing partial
                assert await r.hlen(q.keys.dedup) == 0
                # Lease renewals fail with OOM meanwhile (every second); the worker lives on.
                await anyio.sleep(2.2)
                await r.delete(*[f"filler:{i}" for i in range(filler)])
                await r.config_set("maxmemory", "4mb")
                _released.set()
                while (await q.counts())["completed"] != 1:
                    await anyio.sleep(0.02)
                # Room again: enqueues land and run.
                after = await q.enqueue(Hold())
                while (await q.counts())["completed"] != 2:
                    await anyio.sleep(0.02)
                worker.shutdown()
            events = [e.event for e in await q.journal(running)]
            assert events == ["enqueued", "claimed", "completed"]
            assert (await q.get(after)) is not None
            figures("maxmemory", filler_keys=filler, enqueues_refused=3, partial=0, worker_crashed=0)
        finally:
            await client.aclose()
