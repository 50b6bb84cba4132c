"""Bulk actions by filter (issue 41): retry_dead, cancel_jobs and purge by kind, error type,
time, note and limit; in batches, safe to run twice, reporting their progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo
from venturi_redis._producer import bulk

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000  # the tests' clock, in ms


class Picky(vr.Task):
    """Fails with the exception its ``error`` names: permanently, or until the backstop."""

    KIND: ClassVar[str] = "picky"
    error: str = "value"
    permanent: bool = False


class PickyJob(Picky, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        exc: Exception = ValueError("bad value") if self.error == "value" else KeyError("missing key")
        if self.permanent:
            raise vr.TaskError.permanent(f"gave up: {exc}") from exc
        raise exc


@pytest.fixture
def clock() -> list[int]:
    return [BASE]


@pytest.fixture
def q(client: vr.Client, queue_name: str, clock: list[int]) -> vr.Queue:
    """The queue, on a client whose clock the test sets (the time jobs die at)."""
    return vr.Client(client.redis, clock=lambda: clock[0], url=client.url).queue(queue_name)


async def kill(q: vr.Queue, tasks: list[Any], *, at: int, clock: list[int]) -> list[str]:
    """Enqueue ``tasks`` and run them to their death at ``at`` (ms)."""
    clock[0] = at
    ids = await q.enqueue_many(tasks, max_failures=1)
    await drain(q, PickyJob, DoomedJob)
    return ids


async def dead_ids(q: vr.Queue) -> set[str]:
    return {j.id for j in await q.list_jobs(state="dead", limit=1000)}


async def test_retry_dead_by_kind_error_type_note_and_time(q: vr.Queue, clock: list[int]) -> None:
    # The backstop (max_failures=1) kills these: the error type is on its `failed` entry.
    old_value = await kill(q, [Picky(error="value")], at=BASE, clock=clock)
    old_key = await kill(q, [Picky(error="key")], at=BASE + 1000, clock=clock)
    # A permanent error kills these: the type is on the `dead` entry (vr.TaskError's public name).
    doomed = await kill(q, [Doomed()], at=BASE + 2000, clock=clock)
    new_value = await kill(q, [Picky(error="value")], at=BASE + 3000, clock=clock)
    assert len(await dead_ids(q)) == 4

    assert await q.retry_dead(error_type="KeyError", limit=0) == []
    at = datetime.fromtimestamp((BASE + 500) / 1000, UTC)
    assert await q.retry_dead(error_type="ValueError", until=at) == old_value
    assert await q.retry_dead(note_contains="missing key") == old_key
    assert await q.retry_dead(error_type="venturi_redis.TaskError", kind="picky") == []
    # `since`, a timedelta back from now (3.5 s after BASE): the jobs dead for at most 1 s.
    clock[0] = BASE + 3500
    assert await q.retry_dead(since=timedelta(seconds=1)) == new_value
    assert await dead_ids(q) == set(doomed)
    since = datetime.fromtimestamp(BASE / 1000, UTC)
    assert await q.retry_dead(kind="doomed", error_type="venturi_redis.TaskError", since=since) == doomed
    assert await dead_ids(q) == set()
    info = await q.get(doomed[0])
    assert info is not None and info.state == vr.JobState.PENDING and info.failures == 0


async def test_unknown_filter_is_a_type_error(q: vr.Queue) -> None:
    with pytest.raises(TypeError):
        await q.retry_dead(colour="red")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": 3},
        {"kind": ""},
        {"error_type": b"ValueError"},
        {"note_contains": ["x"]},
        {"since": datetime(2030, 1, 1)},  # naive
        {"until": 5.0},
        {"since": timedelta(seconds=-1)},
        {"since": timedelta(seconds=1), "until": timedelta(seconds=2)},  # since after until
        {"limit": -1},
        {"limit": True},
        {"limit": 2.5},
    ],
)
async def test_bad_filters_are_refused_with_nothing_written(
    q: vr.Queue, clock: list[int], bad: dict[str, Any]
) -> None:
    ids = await kill(q, [Doomed()], at=BASE, clock=clock)
    for call in (q.retry_dead, q.cancel_jobs, lambda **kw: q.purge("dead", **kw)):
        with pytest.raises(vr.ConfigurationError):
            await call(**bad)
    assert await dead_ids(q) == set(ids)


async def test_cancel_jobs_and_purge_refuse_a_state_they_cannot_act_on(q: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="cancel_jobs takes state"):
        await q.cancel_jobs("dead")
    with pytest.raises(vr.ConfigurationError, match="can only purge finished jobs"):
        await q.purge("pending", kind="echo")


@pytest.mark.parametrize("tail", [2, 50])
async def test_pages_and_batches_many_deaths_in_one_millisecond_safe_to_run_twice(
    q: vr.Queue, clock: list[int], monkeypatch: pytest.MonkeyPatch, tail: int
) -> None:
    """Small pages and batches: every job of a page of one score is read, none twice, and a
    run cut short by its limit is finished by running it again. ``tail``: a page's members
    read with their scores (bulk._page), fewer than a page's or all of them."""
    monkeypatch.setattr(bulk, "PAGE", 3)
    monkeypatch.setattr(bulk, "TAIL", tail)
    monkeypatch.setattr(bulk, "BATCH", 2)
    same = await kill(q, [Doomed() for _ in range(7)], at=BASE, clock=clock)
    later = await kill(q, [Picky(permanent=True) for _ in range(4)], at=BASE + 10, clock=clock)
    reports: list[vr.BulkProgress] = []
    first = await q.retry_dead(kind="doomed", limit=4, on_progress=reports.append)
    assert len(first) == 4 and set(first) < set(same)
    assert reports[-1].finished and reports[-1].done == 4 and reports[-1].total == 11
    assert all(not r.finished for r in reports[:-1])
    # "Interrupted" after 4: the same call again does the rest, and a third does nothing.
    rest = await q.retry_dead(kind="doomed")
    assert set(first) | set(rest) == set(same) and not set(first) & set(rest)
    assert await q.retry_dead(kind="doomed") == []
    assert await dead_ids(q) == set(later)
    reports.clear()
    assert sorted(await q.retry_dead(on_progress=reports.append)) == sorted(later)
    last = reports[-1]
    assert (last.queue, last.action, last.state, last.finished) == (q.name, "retry", "dead", True)
    assert (last.scanned, last.matched, last.done, last.skipped) == (4, 4, 4, 0)


@pytest.mark.parametrize("tail", [1, 2, 3, 50])
@pytest.mark.parametrize("remove", [False, True])
async def test_score_pages_read_each_member_once_in_order(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch, tail: int, remove: bool
) -> None:
    """bulk._score_pages, pages of 3 over runs of one score longer and shorter than a page and
    its tail: every member once, by score, whether the reader removes what it read or not."""
    monkeypatch.setattr(bulk, "PAGE", 3)
    monkeypatch.setattr(bulk, "TAIL", tail)
    scores = [1, 2, 2, 3, 3, 3, 3, 4, 5, 5, 6, 7, 7, 7, 8]
    key = q.keys.dead  # any sorted set of the queue's slot
    r = q.client.redis
    await r.zadd(key, {f"m{i:02}": score for i, score in enumerate(scores)})
    seen: list[str] = []
    async for page in bulk._score_pages(r, key, "-inf", "+inf"):
        assert page
        seen += page
        if remove:
            await r.zrem(key, *page)
    assert seen == [f"m{i:02}" for i in range(len(scores))]


async def test_a_job_retried_meanwhile_is_skipped(
    q: vr.Queue, clock: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await kill(q, [Doomed() for _ in range(3)], at=BASE, clock=clock)
    real = bulk._matching

    async def racing(*args: Any) -> list[str]:
        found = await real(*args)
        await q.retry(found[0])  # another operator, between our read and our batch
        return found

    monkeypatch.setattr(bulk, "_matching", racing)
    reports: list[vr.BulkProgress] = []
    assert await q.retry_dead(on_progress=reports.append) == ids[1:]
    assert (reports[-1].matched, reports[-1].done, reports[-1].skipped) == (3, 2, 1)


async def test_a_batch_moves_each_job_once_and_one_without_a_journal_gets_its_enqueued_entry(
    q: vr.Queue, clock: list[int]
) -> None:
    """retry_dead.lua writes a batch's set moves once for all its jobs (an id given twice is
    moved once), and a dead job whose journal is gone gets its `enqueued` entry first."""
    ids = await kill(q, [Doomed() for _ in range(3)], at=BASE, clock=clock)
    r = q.client.redis
    await r.delete(q.keys.journal(ids[0]))
    got = await q.store.retry_dead([ids[0], ids[1], ids[0], ids[2]], "n")
    assert got.moved == ids
    assert got.refused == {}
    assert await dead_ids(q) == set()
    assert (await q.counts())["pending"] == 3
    raw = await r.xrange(q.keys.journal(ids[0]))
    assert [f[b"event"] for _, f in raw] == [b"enqueued", b"retried"]
    assert [f[b"event"] for _, f in await r.xrange(q.keys.journal(ids[1]))][-1] == b"retried"


async def test_a_job_that_would_fail_the_call_half_way_is_refused_with_nothing_written(
    q: vr.Queue, clock: list[int]
) -> None:
    """retry_dead.lua writes a batch's set moves after its loop: a job whose write could raise
    (a dedup index of another type, a created_at no stream id takes) is refused before its
    first write, and the batch's other jobs move whole, none left half way."""
    ids = await kill(q, [Doomed() for _ in range(4)], at=BASE, clock=clock)
    r = q.client.redis
    await r.hset(q.keys.job(ids[1]), "dedup", "k1")
    await r.set(q.keys.dedup, "not a hash")
    await r.delete(q.keys.journal(ids[2]))
    await r.hset(q.keys.job(ids[2]), "created_at", "9" * 30)
    got = await q.store.retry_dead(ids, "n")
    assert got.moved == [ids[0], ids[3]]
    assert got.refused == {ids[1]: "dedup index is not a hash", ids[2]: "created_at field is not a time"}
    assert await dead_ids(q) == {ids[1], ids[2]}
    for jid in ids[1:3]:
        assert await r.hget(q.keys.job(jid), "state") == b"dead"
    assert not await r.exists(q.keys.journal(ids[2]))
    assert (await q.counts())["pending"] == 2


async def test_a_set_the_batch_moves_to_of_another_type_stops_or_refuses_before_any_write(
    q: vr.Queue, clock: list[int]
) -> None:
    """The batch's set moves come after its jobs' own writes, so their types are read first:
    a `retrying` index of another type stops the call with nothing written; a pending set of
    another type refuses the jobs it would take, and the others move."""
    ids = await kill(q, [Doomed() for _ in range(2)], at=BASE, clock=clock)
    r = q.client.redis
    retrying = q.keys.retrying
    await r.set(retrying, "x")
    with pytest.raises(vr.CorruptQueueError, match="retrying is not a sorted set"):
        await q.store.retry_dead(ids, "n")
    assert await dead_ids(q) == set(ids)
    for jid in ids:
        assert await r.hget(q.keys.job(jid), "state") == b"dead"
        assert [f[b"event"] for _, f in await r.xrange(q.keys.journal(jid))][-1] != b"retried"
    await r.delete(retrying)
    await r.hset(q.keys.job(ids[1]), "priority", "high")
    await r.set(q.keys.pending(vr.Priority.HIGH), "x")
    got = await q.store.retry_dead(ids, "n")
    assert got.moved == [ids[0]]
    assert got.refused == {ids[1]: q.keys.pending(vr.Priority.HIGH) + " is not a sorted set"}
    assert await dead_ids(q) == {ids[1]}
    assert await r.hget(q.keys.job(ids[1]), "state") == b"dead"


async def test_cancel_jobs_by_kind_and_enqueue_time(q: vr.Queue, clock: list[int]) -> None:
    clock[0] = BASE
    early = await q.enqueue_many([Echo(text="a"), Echo(text="b")])
    clock[0] = BASE + 5000
    late = await q.enqueue(Echo(text="c"), delay=60)  # delayed: pending too
    other = await q.enqueue(Doomed())
    clock[0] = BASE + 6000
    reports: list[vr.BulkProgress] = []
    got = await q.cancel_jobs(kind="echo", since=timedelta(seconds=2), on_progress=reports.append)
    assert got == [late]
    assert reports[-1].action == "cancel" and reports[-1].state == "pending" and reports[-1].total == 4
    assert sorted(await q.cancel_jobs(kind="echo")) == sorted(early)
    for job_id in [*early, late]:
        assert (await q.get(job_id)).state == vr.JobState.CANCELLED  # type: ignore[union-attr]
    assert (await q.get(other)).state == vr.JobState.PENDING  # type: ignore[union-attr]
    assert await q.cancel_jobs(kind="echo") == []
    assert await q.cancel_jobs(until=datetime.fromtimestamp(BASE / 1000, UTC)) == []  # `other` is later
    assert await q.cancel_jobs() == [other]


async def test_cancel_jobs_parked_on_a_limit(q: vr.Queue) -> None:
    await q.set_limit("echo", concurrency=1)
    ids = await q.enqueue_many([Echo(text=str(i)) for i in range(3)])
    assert sorted(await q.cancel_jobs(kind="echo")) == sorted(ids)
    assert (await q.stats()).limited == 0 and (await q.stats()).eligible == 0


async def test_purge_by_filter(q: vr.Queue, clock: list[int]) -> None:
    doomed = await kill(q, [Doomed() for _ in range(3)], at=BASE, clock=clock)
    picky = await kill(q, [Picky(error="key")], at=BASE + 10_000, clock=clock)
    clock[0] = BASE + 20_000
    assert await q.purge("dead", kind="picky", older_than=15) == 0  # died 10 s ago
    assert await q.purge("dead", error_type="KeyError") == 1
    assert await q.get(picky[0]) is None
    assert await q.client.redis.exists(q.keys.journal(picky[0])) == 0
    reports: list[vr.BulkProgress] = []
    assert await q.purge("dead", note_contains="resource gone", limit=1, on_progress=reports.append) == 1
    assert reports[-1].action == "purge" and reports[-1].done == 1 and reports[-1].finished
    assert await q.get(doomed[0]) is None  # the oldest first
    assert await q.purge("dead", kind="echo") == 0
    assert await q.purge("dead", until=timedelta(seconds=5)) == 2
    assert await dead_ids(q) == set()
    assert await q.purge("dead", kind="doomed") == 0  # twice: nothing left


async def test_sharded_and_blocking_faces(client: vr.Client, queue_name: str, url: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=2)
    ids = await sharded.enqueue_many([Doomed() for _ in range(4)])
    for p in sharded.partitions:
        await drain(p, DoomedJob)
    moved = await sharded.retry_dead(kind="doomed", limit=3)
    assert len(moved) == 3
    assert sorted(await sharded.cancel_jobs(kind="doomed")) == sorted(moved)
    assert await sharded.purge("cancelled", kind="doomed") == 3
    assert await sharded.purge("dead", error_type="venturi_redis.TaskError") == 1
    assert all([await sharded.get(i) is None for i in ids])


async def test_cancel_jobs_leaves_a_corrupt_job_and_cancels_the_others(q: vr.Queue) -> None:
    ids = await q.enqueue_many([Echo(text=str(i)) for i in range(3)])
    await q.client.redis.set(q.keys.journal(ids[1]), "not a stream")
    reports: list[vr.BulkProgress] = []
    got = await q.cancel_jobs(kind="echo", on_progress=reports.append)
    assert got == [ids[0], ids[2]]
    assert reports[-1].skipped == 1
    assert (await q.client.redis.hget(q.keys.job(ids[1]), "state")) == b"pending"
