"""Throttle (``Task.dedup_window``) and debounce (``Task.debounce``) of a dedup key.

The scripts' clock is the client's here (``vr.Client(clock=...)``), so a
window's end is reached by moving it, never by sleeping.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain
from venturi_redis._model.endings import Cancelled, Dead, Ending, Failed, Paused, Released, Suspended
from venturi_redis._model.enums import DeadReason
from venturi_redis._store.keys import dedup_field
from venturi_redis._store.store import NO_STATE, EndingArgs, Lease

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000  # ms
WINDOW_S = 60


class Sync(vr.Task):
    KIND: ClassVar[str] = "sync"
    account: str
    fail: bool = False

    def dedup_key(self) -> str | None:
        return self.account

    @classmethod
    def dedup_window(cls) -> float | timedelta | None:
        return WINDOW_S


class SyncJob(Sync, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[Any], state: None) -> vr.Outcome:
        if self.fail:
            raise vr.TaskError.permanent("account gone")
        return vr.Outcome.completed()


class Reindex(vr.Task):
    KIND: ClassVar[str] = "reindex"
    doc: str
    keep: bool = False

    def dedup_key(self) -> str | None:
        return self.doc

    @classmethod
    def debounce(cls) -> float | timedelta | None:
        return timedelta(seconds=10)

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.keep() if self.keep else vr.Merge.replace()


class ReindexJob(Reindex, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[Any], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


def clocked(client: vr.Client, queue_name: str) -> tuple[list[int], vr.Queue]:
    t = [BASE]
    c = vr.Client(client.redis, clock=lambda: t[0], url=client.url)
    return t, c.queue(queue_name)


async def index_of(queue: vr.Queue, kind: str, key: str) -> str | None:
    raw = await queue.client.redis.hget(queue.keys.dedup, dedup_field(kind, key))
    return raw.decode() if raw else None


LEASE_MS = 30_000


async def claim_one(queue: vr.Queue) -> str:
    """Claim the one due job (lease LEASE_MS); its lease token."""
    jobs = claimed_jobs(await claim_raw(queue, 1, lease_ms=LEASE_MS))
    assert len(jobs) == 1
    return jobs[0][1]


async def end(queue: vr.Queue, job_id: str, token: str, ending: Ending, *, max_failures: str = "none") -> Any:
    """End the run holding ``token`` as a worker would (a first Failed run is due again at once)."""
    args = EndingArgs(base_ms=1_000, cap_ms=1_000, jitter=0.0, max_failures=max_failures)
    op = queue.store.end_run(Lease(job_id, token, vr.Priority.NORMAL), ending, NO_STATE, args)
    return op.parse(await queue.client.sender.call(op.call))


async def held_score(queue: vr.Queue, key: str = "a") -> float | None:
    score: float | None = await queue.client.redis.zscore(queue.keys.dedup_held, dedup_field("sync", key))
    return score


async def assert_freed(t: list[int], queue: vr.Queue, job: str) -> None:
    """The key `a` is free at once, and the sweep never gives it back to ``job``."""
    assert await index_of(queue, "sync", "a") is None
    assert await held_score(queue) is None
    second = await queue.enqueue(Sync(account="a"))  # created at once: no check round trip
    assert second != job and await index_of(queue, "sync", "a") == second
    t[0] += 10 * LEASE_MS + 120_000  # past any lease or window the old run could have set
    await queue.store.reclaim(batch=10, max_failures="none")
    assert await index_of(queue, "sync", "a") == second
    assert await queue.enqueue(Sync(account="a")) == second  # merged into the pending holder


# -- throttle ---------------------------------------------------------------------


async def test_an_enqueue_inside_the_window_returns_the_finished_job(
    client: vr.Client, queue_name: str
) -> None:
    t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)
    info = await queue.get(first)
    assert info is not None and info.state is vr.JobState.COMPLETED
    assert info.dedup_until is not None
    assert round(info.dedup_until.timestamp() * 1000) - round(info.finished_at.timestamp() * 1000) == 60_000  # type: ignore[union-attr]
    t[0] += 59_000  # inside the window: nothing is created, nothing runs
    assert await queue.enqueue(Sync(account="a")) == first
    assert await queue.enqueue(Sync(account="a")) == first
    assert (await queue.counts())["pending"] == 0
    other = await queue.enqueue(Sync(account="b"))  # another key is not held
    assert other != first
    t[0] += 2_000  # past the window: the key is free again
    second = await queue.enqueue(Sync(account="a"))
    assert second not in (first, other)
    assert await index_of(queue, "sync", "a") == second
    await drain(queue, SyncJob)
    assert (await queue.counts())["completed"] == 4 - 1  # first, other, second


async def test_the_key_is_held_while_the_job_runs(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await claim_raw(queue, 1)
    assert (await queue.get(first)).state is vr.JobState.RUNNING  # type: ignore[union-attr]
    assert await index_of(queue, "sync", "a") == first
    assert await queue.enqueue(Sync(account="a")) == first
    assert (await queue.counts())["pending"] == 0


async def test_a_dead_job_releases_the_key(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a", fail=True))
    await drain(queue, SyncJob)
    assert (await queue.get(first)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    second = await queue.enqueue(Sync(account="a"))
    assert second != first
    assert await index_of(queue, "sync", "a") == second


async def test_a_cancelled_job_releases_the_key(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    assert await queue.cancel(first)
    second = await queue.enqueue(Sync(account="a"))
    assert second != first


async def _run(t: list[int], queue: vr.Queue, job: str, runs: int) -> str:
    """Claim ``job`` for its ``runs``-th run (the ones before fail and retry); its token."""
    for _ in range(runs - 1):
        await end(queue, job, await claim_one(queue), Failed(note="boom"))
        assert await index_of(queue, "sync", "a") == job  # waiting for its retry: still the holder
        t[0] += 2_000
    return await claim_one(queue)


ENDINGS = {
    "cancelled": Cancelled(note="stopped"),
    "dead": Dead(reason=DeadReason.PERMANENT, note="account gone"),
    "backstop": Failed(note="boom"),  # the retry's backstop: dead
    "suspended": Suspended(note="waiting for input"),
}


@pytest.mark.parametrize("runs", [1, 2])
@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_run_that_ends_other_than_completed_frees_the_key_at_once(
    client: vr.Client, queue_name: str, ending: str, runs: int
) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    token = await _run(t, queue, job, runs)
    assert await held_score(queue) == t[0] + LEASE_MS
    if ending == "cancelled":
        assert (await queue.store.cancel(job, "by an operator")).detail == "requested"
    backstop = str(runs) if ending == "backstop" else "none"
    reply = await end(queue, job, token, ENDINGS[ending], max_failures=backstop)
    assert reply.applied, reply
    info = await queue.get(job)
    want = {"backstop": "dead"}.get(ending, ending)
    assert info is not None and info.state.value == want and info.dedup_until is None
    await assert_freed(t, queue, job)


async def test_a_resumed_job_takes_its_key_back_when_free(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    await end(queue, job, await claim_one(queue), Suspended(note="waiting"))
    assert await index_of(queue, "sync", "a") is None
    assert await queue.resume(job, None)
    assert await index_of(queue, "sync", "a") == job
    assert await queue.enqueue(Sync(account="a")) == job


@pytest.mark.parametrize("ending", [Released(note="shutdown"), Paused(delay_ms=0, note="later")])
async def test_a_run_back_to_pending_keeps_the_key(
    client: vr.Client, queue_name: str, ending: Ending
) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    assert (await end(queue, job, await claim_one(queue), ending)).applied
    assert await index_of(queue, "sync", "a") == job
    t[0] += 2 * LEASE_MS
    await queue.store.reclaim(batch=10, max_failures="none")  # the held look finds it pending
    assert await index_of(queue, "sync", "a") == job
    assert await held_score(queue) is None  # its next claim adds it back
    assert await queue.enqueue(Sync(account="a")) == job


async def test_a_claim_of_a_job_that_does_not_hold_the_key_leaves_the_holders_window(
    client: vr.Client, queue_name: str
) -> None:
    t, queue = clocked(client, queue_name)
    suspended = await queue.enqueue(Sync(account="a"))
    await end(queue, suspended, await claim_one(queue), Suspended(note="waiting"))  # frees the key
    holder = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)  # completes at BASE: held until BASE + 60 s
    assert await held_score(queue) == BASE + 60_000
    assert await queue.resume(suspended, None)  # the key is held: it runs as its own row
    assert await index_of(queue, "sync", "a") == holder
    t[0] += 1_000
    await claim_one(queue)  # not the holder: the holder's window stays as it was
    assert await held_score(queue) == BASE + 60_000
    assert await queue.purge("completed") == 1  # the window outlives the holder
    t[0] += LEASE_MS + 1_000  # past the claim's lease, inside the window
    await queue.store.reclaim(batch=10, max_failures="none")
    assert await index_of(queue, "sync", "a") == holder
    assert await queue.enqueue(Sync(account="a")) == holder


async def test_the_reclaims_backstop_frees_the_key(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    await claim_one(queue)
    t[0] += LEASE_MS + 1  # the worker died
    reclaimed = await queue.store.reclaim(batch=10, max_failures="1")
    assert reclaimed.dead == 1
    assert (await queue.get(job)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    await assert_freed(t, queue, job)


async def test_a_cancel_the_claim_finishes_frees_the_key(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    token = await claim_one(queue)
    assert (await queue.store.cancel(job, "by an operator")).detail == "requested"
    await end(queue, job, token, Failed(note="boom"))  # the run ended before its worker saw the cancel
    t[0] += 2_000
    assert claimed_jobs(await claim_raw(queue, 1)) == []  # the claim cancels it instead
    assert (await queue.get(job)).state is vr.JobState.CANCELLED  # type: ignore[union-attr]
    await assert_freed(t, queue, job)


@pytest.mark.parametrize("by", ["claim", "reclaim"])
async def test_a_job_that_expires_waiting_for_its_retry_frees_the_key(
    client: vr.Client, queue_name: str, by: str
) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"), expires=5)
    await end(queue, job, await claim_one(queue), Failed(note="boom"))  # its run left a look in dedup:held
    t[0] += 6_000  # past its deadline, not started again
    if by == "claim":
        assert claimed_jobs(await claim_raw(queue, 1)) == []
    else:
        await queue.store.reclaim(batch=10, max_failures="none")
    info = await queue.get(job)
    assert info is not None and info.dead_reason is vr.DeadReason.EXPIRED
    await assert_freed(t, queue, job)


async def test_a_quarantine_by_the_claim_frees_the_key(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Sync(account="a"))
    await queue.client.redis.hset(queue.keys.job(job), "created_at", "not a time")
    assert claimed_jobs(await claim_raw(queue, 1)) == []
    assert (await queue.get(job)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    await assert_freed(t, queue, job)


async def test_the_reclaim_sweep_frees_a_window_that_ended(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)
    redis = queue.client.redis
    assert await redis.zscore(queue.keys.dedup_held, dedup_field("sync", "a")) == BASE + 60_000
    await queue.store.reclaim(batch=10, max_failures="none")  # inside: kept
    assert await index_of(queue, "sync", "a") == first
    t[0] += 61_000
    await queue.store.reclaim(batch=10, max_failures="none")
    assert await index_of(queue, "sync", "a") is None
    assert await redis.zcard(queue.keys.dedup_held) == 0


async def test_one_reclaim_tick_frees_every_window_that_ended(client: vr.Client, queue_name: str) -> None:
    """The held keys' part of the sweep looks at 100 a call; a worker's tick calls
    again until it is through. At one call a tick (15 s by default) a worker freed
    at most ~7 keys a second, and a queue that throttled more new keys than that
    kept every one in its dedup index and held set for good (benchmarks/memory_soak.py)."""
    t, queue = clocked(client, queue_name)
    await queue.enqueue_many([Sync(account=f"a{i}") for i in range(250)])
    worker = await drain(queue, SyncJob)
    redis = queue.client.redis
    assert (await redis.hlen(queue.keys.dedup), await redis.zcard(queue.keys.dedup_held)) == (250, 250)
    t[0] += 61_000
    await worker._runners[0].reclaim_once()
    assert (await redis.hlen(queue.keys.dedup), await redis.zcard(queue.keys.dedup_held)) == (0, 0)


async def test_the_sweep_empties_the_held_set_without_an_index(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)
    await queue.client.redis.delete(queue.keys.dedup)  # its last field freed: no index key left
    t[0] += 61_000
    await queue.store.reclaim(batch=10, max_failures="none")
    assert await queue.client.redis.zcard(queue.keys.dedup_held) == 0


async def test_the_window_outlives_the_trimmed_job(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob, retention=vr.Retention(max_completed=0))
    await queue.enqueue(Sync(account="z"))  # another run's completion trims the first
    await drain(queue, SyncJob, retention=vr.Retention(max_completed=0))
    assert await queue.get(first) is None
    assert await queue.enqueue(Sync(account="a")) == first  # the held set still says so
    t[0] += 61_000
    assert await queue.enqueue(Sync(account="a")) != first


async def test_the_window_outlives_a_purge(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)
    assert await queue.purge("completed") == 1
    assert await queue.get(first) is None
    assert await queue.enqueue(Sync(account="a")) == first
    t[0] += 61_000
    await queue.store.reclaim(batch=10, max_failures="none")
    assert await index_of(queue, "sync", "a") is None
    assert await queue.enqueue(Sync(account="a")) != first


async def test_a_schedule_fire_into_a_held_key_creates_nothing(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Sync(account="a"))
    await drain(queue, SyncJob)
    await queue.schedule("hourly", Sync(account="a"), every=3600)
    assert await queue.trigger_schedule("hourly") == first
    assert (await queue.counts())["pending"] == 0


# -- debounce ---------------------------------------------------------------------


@pytest.mark.parametrize("keep", [False, True])
async def test_each_merge_moves_the_start_to_now_plus_the_debounce(
    client: vr.Client, queue_name: str, keep: bool
) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Reindex(doc="d"))
    info = await queue.get(job)
    assert info is not None and round(info.eligible_at.timestamp() * 1000) == BASE + 10_000  # type: ignore[union-attr]
    t[0] += 8_000
    assert await queue.enqueue(Reindex(doc="d", keep=keep)) == job
    info = await queue.get(job)
    assert info is not None and round(info.eligible_at.timestamp() * 1000) == BASE + 18_000  # type: ignore[union-attr]
    score = await queue.client.redis.zscore(queue.keys.pending(vr.Priority.NORMAL), job)
    assert score == BASE + 18_000
    merged = (await queue.journal(job))[-1]
    assert merged.event == "merged" and merged.details["eligible_at"] == str(BASE + 18_000)
    t[0] += 9_000  # still inside the quiet time: nothing to claim
    assert claimed_jobs(await claim_raw(queue, 1)) == []
    t[0] += 1_000
    await drain(queue, ReindexJob)
    assert (await queue.counts())["completed"] == 1


async def test_a_burst_runs_once(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    ids = set()
    for _ in range(20):
        ids.add(await queue.enqueue(Reindex(doc="d")))
        t[0] += 1_000
    assert len(ids) == 1
    t[0] += 10_000
    await drain(queue, ReindexJob)
    assert (await queue.counts())["completed"] == 1


async def test_a_merge_moves_a_retrying_jobs_due_time_with_its_debounce(
    client: vr.Client, queue_name: str
) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Reindex(doc="d"))
    t[0] += 10_000
    jobs = claimed_jobs(await claim_raw(queue, 1))
    assert [j for j, _ in jobs] == [job]
    await end(queue, job, jobs[0][1], Failed(note="boom"))
    retrying = queue.keys.retrying
    assert await queue.client.redis.zscore(retrying, job) == t[0]  # the first retry is due at once
    t[0] += 500
    assert await queue.enqueue(Reindex(doc="d")) == job  # merged: due after the debounce now
    assert await queue.client.redis.zscore(queue.keys.pending(vr.Priority.NORMAL), job) == t[0] + 10_000
    assert await queue.client.redis.zscore(retrying, job) == t[0] + 10_000
    assert [i.id for i in await queue.list_jobs(state="retrying")] == [job]


async def test_a_debounced_merge_adds_no_job_to_the_retrying_index(
    client: vr.Client, queue_name: str
) -> None:
    _t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Reindex(doc="d"))
    assert await queue.enqueue(Reindex(doc="d")) == job
    assert await queue.client.redis.zcard(queue.keys.retrying) == 0


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "5", timedelta(seconds=-1)])
@pytest.mark.parametrize("name", ["dedup_window", "debounce"])
def test_a_bad_window_or_debounce_is_refused_at_class_definition(name: str, value: object) -> None:
    with pytest.raises(vr.ConfigurationError):
        type(
            "Bad",
            (vr.Task,),
            {
                "__annotations__": {"KIND": ClassVar[str]},
                "KIND": "bad",
                name: classmethod(lambda cls: value),
            },
        )


def test_no_window_and_no_debounce_cost_one_attribute() -> None:
    class Plain(vr.Task):
        KIND: ClassVar[str] = "plain"

    assert Plain._vr_dedup_timing is None
    assert Sync._vr_dedup_timing == (60_000, 0)
    assert Reindex._vr_dedup_timing == (0, 10_000)
