"""The bulk actions' batched writes (cancel_pending.lua, purge.lua given ids): what a job ends
as is what the one-job scripts leave, and a key of the wrong type stops a call before its first
write or refuses the one job it concerns."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000  # the tests' clock, in ms


class Keyed(vr.Task):
    KIND: ClassVar[str] = "keyed"
    key: str

    def dedup_key(self) -> str | None:
        return self.key


class Throttled(Keyed):
    KIND: ClassVar[str] = "throttled"

    @classmethod
    def dedup_window(cls) -> float | timedelta | None:
        return 60.0


class Limited(vr.Task):
    KIND: ClassVar[str] = "limited"

    def limit_key(self) -> str | None:
        return "a"  # parked at enqueue under a limit of its kind


@pytest.fixture
def q(client: vr.Client, queue_name: str) -> vr.Queue:
    """The queue, on a client with a fixed clock: two jobs treated alike are written alike."""
    return vr.Client(client.redis, clock=lambda: BASE, url=client.url).queue(queue_name)


def _text(x: Any) -> str:
    return x.decode("utf-8", "surrogateescape") if isinstance(x, bytes) else str(x)


async def _seen(q: vr.Queue, job_id: str, subs: dict[str, str]) -> dict[str, Any]:
    """What a job's cancel left: its hash, its journal's entries (the `enqueued` one's id), its
    events, its place in the sets and the dedup index; each text with ``subs`` replaced."""
    r = q.client.redis

    def own(x: Any) -> str:
        out = _text(x)
        for old, new in subs.items():
            out = out.replace(old, new)
        return out

    fields = {own(k): own(v) for k, v in (await r.hgetall(q.keys.job(job_id))).items()}
    entries = await r.xrange(q.keys.journal(job_id))
    journal = [({own(k): own(v) for k, v in e.items()}) for _, e in entries]
    first = _text(entries[0][0]) if entries and entries[0][1][b"event"] == b"enqueued" else None
    events = [
        (e.event, e.kind, e.run, e.note, e.details)
        for i, f in await r.xrange(q.keys.events)
        for e in vr.QueueEvent.all_from_stream(i, f)
        if e.job_id == job_id and e.event == "cancelled"
    ]
    sets = [k for k in (*q.keys.pending_high_first, q.keys.retrying) if await r.zscore(k, job_id) is not None]
    token = await r.hget(q.keys.job(job_id), "offload")
    snapshot = await r.hgetall(q.keys.offload(_text(token))) if token else {}
    return {
        "hash": fields,
        "journal": journal,
        "enqueued_id": first,
        "events": events,
        "sets": sets,
        "cancelled": await r.zscore(q.keys.cancelled, job_id),
        "dedup": sorted(_text(v) for v in (await r.hgetall(q.keys.dedup)).values()),
        "held": await r.zcard(q.keys.prefix + "dedup:held"),
        "snapshot": {own(k): own(v) for k, v in snapshot.items()},
        "parked": [own(m) for m in await r.zrange(q.keys.limits_parked, 0, -1)],
    }


async def _report(n: int) -> int:
    return n


@pytest.mark.parametrize("shape", ["fresh", "keyed", "throttled", "retried", "offload", "parked"])
async def test_a_bulk_cancel_leaves_a_pending_job_as_cancel_does(q: vr.Queue, shape: str) -> None:
    """Two jobs alike: one cancelled by cancel.lua (queue.cancel), the other by the batch
    (cancel_jobs: cancel_pending.lua). Hash, journal, event, sets and dedup index agree."""
    ids: list[str] = []
    if shape == "parked":
        await q.set_limit("limited", concurrency=1)
    for i in range(2):
        if shape == "offload":
            handle = await vr.offload(queue=q.name, kind="tests.report")(_report).offload(q.client, 1)
            ids.append(handle.job_id)
            continue
        task: vr.Task = {
            "fresh": Echo(text="a"),
            "keyed": Keyed(key=f"kk{i}"),
            "throttled": Throttled(key=f"kk{i}"),
            "parked": Limited(),
        }.get(shape, Doomed())
        ids += await q.enqueue_many([task])
    if shape == "retried":
        await drain(q, DoomedJob)
        assert sorted(await q.retry_dead()) == sorted(ids)  # pending again, with a journal and run_count
    one, many = ids
    if shape == "parked":  # both parked on the limit (none runs, so none holds its slot)
        assert await q.client.redis.zcard(q.keys.limits_parked) == 2
    assert await q.cancel(one) == "cancelled"
    got = await q.cancel_jobs(note="cancelled by an operator")
    assert got == [many]
    subs = {one: "<id>", many: "<id>", "kk0": "<key>", "kk1": "<key>"}
    for job_id in ids:  # an offload's token
        if token := await q.client.redis.hget(q.keys.job(job_id), "offload"):
            subs[_text(token)] = "<token>"
    a, b = await _seen(q, one, subs), await _seen(q, many, subs)
    if shape in ("keyed", "throttled"):
        # Each freed its own key; the index is empty either way.
        assert a["dedup"] == b["dedup"] == []
    if shape == "offload":
        assert b["snapshot"]["status"] == "failed"  # settled, its caller told
    if a["enqueued_id"] is not None:
        assert a["enqueued_id"] == b["enqueued_id"] == f"{a['hash']['created_at']}-0"
    assert a == b
    kind, run, note = b["hash"]["kind"], int(b["hash"]["run_count"]), b["hash"]["note"]
    assert b["events"] == [("cancelled", kind, run, note, {"from": "pending"})]
    assert await q.cancel_jobs() == []  # twice: nothing left


async def test_a_bulk_cancel_hands_cancel_lua_what_it_does_not_do_itself(q: vr.Queue) -> None:
    """A job in another state by now (suspended here) goes to cancel.lua, and the bulk action
    counts what it did; a finished or unknown one is skipped."""
    plain, suspended, done = await q.enqueue_many([Echo(text="a"), Echo(text="b"), Echo(text="c")])
    r = q.client.redis
    # Suspended (enough of it for cancel.lua) after the page read it from the pending set.
    await r.hset(q.keys.job(suspended), "state", "suspended")
    await r.zadd(q.keys.suspended, {suspended: BASE})
    await r.hset(q.keys.job(done), "state", "completed")
    got = await q.store.cancel_pending([plain, suspended, done, "01NOSUCHJOB"], "n")
    assert (got.cancelled, got.others, got.refused) == ([plain], [suspended], {})
    assert await r.hget(q.keys.job(suspended), "state") == b"suspended"
    assert await r.hget(q.keys.job(done), "state") == b"completed"
    reports: list[vr.BulkProgress] = []
    assert await q.cancel_jobs(on_progress=reports.append) == [suspended]
    assert reports[-1].done == 1 and reports[-1].skipped == 1  # `done`, still in the pending set
    assert await r.hget(q.keys.job(suspended), "state") == b"cancelled"
    assert await r.zscore(q.keys.suspended, suspended) is None
    assert [e.event for e in await q.journal(suspended)][-1] == "cancelled"


async def test_a_bulk_cancel_refuses_before_any_write(q: vr.Queue) -> None:
    """A pending, cancelled or retrying set of another type stops the call with nothing written;
    a dedup index of another type refuses the jobs with a key, a created_at no stream id takes
    refuses its job, and the others are cancelled."""
    r = q.client.redis
    ids = await q.enqueue_many([Echo(text="a"), Keyed(key="k")])
    for key in (q.keys.pending(vr.Priority.LOW), q.keys.cancelled, q.keys.retrying):
        await r.set(key, "x")
        with pytest.raises(vr.CorruptQueueError, match="is not a sorted set"):
            await q.store.cancel_pending(ids, "n")
        await r.delete(key)
        for job_id in ids:
            assert await r.hget(q.keys.job(job_id), "state") == b"pending"
            assert not await r.exists(q.keys.journal(job_id))
        assert await r.zcard(q.keys.pending(vr.Priority.NORMAL)) == 2
    dedup = await r.hgetall(q.keys.dedup)
    await r.delete(q.keys.dedup)
    await r.set(q.keys.dedup, "x")
    (bad_time,) = await q.enqueue_many([Echo(text="b")])
    await r.hset(q.keys.job(bad_time), "created_at", "9" * 30)
    got = await q.store.cancel_pending([*ids, bad_time], "n")
    assert got.cancelled == [ids[0]]
    assert sorted(got.refused) == sorted([ids[1], bad_time])
    assert f"job {ids[1]}: dedup index is not a hash; nothing was written" in got.refused[ids[1]]
    assert f"job {bad_time}: created_at field is not a time; nothing" in got.refused[bad_time]
    for job_id in (ids[1], bad_time):
        assert await r.hget(q.keys.job(job_id), "state") == b"pending"
        assert not await r.exists(q.keys.journal(job_id))
        assert await r.zscore(q.keys.pending(vr.Priority.NORMAL), job_id) is not None
    await r.delete(q.keys.dedup)
    await r.hset(q.keys.dedup, mapping=dedup)
    assert await q.cancel_jobs(kind="keyed") == [ids[1]]


async def test_a_bulk_cancel_starts_a_journal_past_what_the_scratch_holds(q: vr.Queue) -> None:
    """The queue's scratch stream, left holding a later entry (by hand), does not stop the batch."""
    r = q.client.redis
    (job_id,) = await q.enqueue_many([Echo(text="a")])
    await r.xadd(q.keys.journal_compact, {"x": "y"}, id="9999999999999-0")
    assert await q.cancel_jobs() == [job_id]
    assert [e.event for e in await q.journal(job_id)] == ["enqueued", "cancelled"]


async def test_purge_refuses_before_any_write_and_counts_an_id_once(q: vr.Queue) -> None:
    """A retrying index or (for a job whose key it frees) a dedup index of another type stops
    the purge with nothing written; an id given twice goes once."""
    r = q.client.redis
    ids = await q.enqueue_many([Keyed(key="k"), Echo(text="a")])
    assert await q.cancel_jobs() == ids
    field = await r.hget(q.keys.job(ids[0]), "dedup")
    await r.hset(q.keys.dedup, field, ids[0])  # as if it still held its key
    for key, what in ((q.keys.retrying, "sorted set"), (q.keys.dedup, "hash")):
        saved = await r.hgetall(key) if key == q.keys.dedup else None
        await r.delete(key)
        await r.set(key, "x")
        with pytest.raises(vr.CorruptQueueError, match=f"is not a {what}"):
            await q.store.purge_ids("cancelled", ids)
        with pytest.raises(vr.CorruptQueueError, match=f"is not a {what}"):
            await q.purge("cancelled")
        await r.delete(key)
        if saved:
            await r.hset(key, mapping=saved)
        assert await r.zcard(q.keys.cancelled) == 2
        for job_id in ids:
            assert await r.exists(q.keys.job(job_id), q.keys.journal(job_id)) == 2
    assert await q.store.purge_ids("cancelled", [ids[0], ids[0], ids[1]]) == 2
    assert await r.hgetall(q.keys.dedup) == {}
    assert await r.zcard(q.keys.cancelled) == 0
    assert await q.store.purge_ids("cancelled", ids) == 0  # twice: nothing left


async def test_a_bulk_cancel_refuses_a_parked_job_while_the_parked_set_is_damaged(q: vr.Queue) -> None:
    """limits:parked of another type: the parked job is refused with nothing written (the batch's
    ZREM from it comes after the jobs' writes); the others are cancelled."""
    r = q.client.redis
    await q.set_limit("limited", concurrency=1)
    parked, plain = await q.enqueue_many([Limited(), Echo(text="a")])
    members = await r.zrange(q.keys.limits_parked, 0, -1)
    assert len(members) == 1
    await r.delete(q.keys.limits_parked)
    await r.set(q.keys.limits_parked, "x")
    got = await q.store.cancel_pending([parked, plain], "n")
    assert got.cancelled == [plain]
    assert list(got.refused) == [parked]
    assert "limits:parked is not a sorted set; nothing was written" in got.refused[parked]
    assert await r.hget(q.keys.job(parked), "state") == b"pending"
    assert await r.hget(q.keys.job(parked), "parked") == members[0]
    assert not await r.exists(q.keys.journal(parked))
    await r.delete(q.keys.limits_parked)
    await r.zadd(q.keys.limits_parked, {members[0]: 0})
    assert await q.cancel_jobs() == [parked]
    assert await r.zcard(q.keys.limits_parked) == 0
