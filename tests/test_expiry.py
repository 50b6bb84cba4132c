"""Job expiry (issue 37 item 6): ``enqueue(..., expires=)`` and ``Task.expires()``.

A job not *started* before its deadline never runs (its first run or a
retry): it goes dead, ``vr.DeadReason.EXPIRED``, with a ``dead`` journal
entry saying so, when a claim reaches it or at the reclaim's next sweep,
whichever comes first. Celery's ``expires`` and Sidekiq Pro's expiring jobs
are the anchors. The scripts' clock is a ``testing.Clock`` here, so no test
sleeps past a deadline.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain, make_worker
from tests.tasks import Echo, EchoJob
from venturi_redis.testing import Clock

pytestmark = pytest.mark.anyio


class Report(vr.Task):
    KIND: ClassVar[str] = "expiry.report"
    n: int = 0

    def expires(self) -> float | timedelta | None:
        return timedelta(minutes=5)


class ReportJob(Report, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state.setdefault("ran", []).append(self.n)
        return vr.Outcome.completed()


class Failing(vr.Task):
    KIND: ClassVar[str] = "expiry.failing"

    def backoff(self) -> vr.Backoff | None:
        # Retries 1 and 2 at once, then one 10 minutes later (Fibonacci: 0, 0, base...).
        return vr.Backoff.fibonacci(base=600, cap=600)


class FailingJob(Failing, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise RuntimeError("try again")


class Keyed(vr.Task):
    KIND: ClassVar[str] = "expiry.keyed"
    key: str

    def dedup_key(self) -> str | None:
        return self.key


@pytest.fixture
async def clocked(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url, clock=Clock())
    try:
        yield c
    finally:
        await c.aclose()


def _clock(client: vr.Client) -> Clock:
    assert isinstance(client.clock, Clock)
    return client.clock


async def _sweep(queue: vr.Queue) -> None:
    await queue.store.reclaim(batch=100, max_failures="25")


async def _expired(queue: vr.Queue, job_id: str) -> vr.JobInfo:
    info = await queue.get(job_id)
    assert info is not None
    assert info.state is vr.JobState.DEAD, info
    assert info.dead_reason is vr.DeadReason.EXPIRED
    assert info.note == "expired: not started before its deadline"
    dead = [e for e in await queue.journal(job_id) if e.event == "dead"]
    assert len(dead) == 1 and dead[0].details.get("reason") == "expired", dead
    return info


async def test_the_deadline_is_stored_on_the_scripts_clock(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    plain = await queue.enqueue(Echo(text="no deadline"))
    given = await queue.enqueue(Echo(text="x"), expires=30)
    declared = await queue.enqueue(Report())
    overridden = await queue.enqueue(Report(), expires=timedelta(seconds=2))
    many = await queue.enqueue_many([Report(n=1), Echo(text="y")], expires=7.5)
    now = _clock(clocked)()

    def deadline(info: vr.JobInfo | None) -> int | None:
        assert info is not None
        return None if info.expires_at is None else round(info.expires_at.timestamp() * 1000)

    assert deadline(await queue.get(plain)) is None
    assert deadline(await queue.get(given)) == now + 30_000
    assert deadline(await queue.get(declared)) == now + 300_000
    assert deadline(await queue.get(overridden)) == now + 2_000
    assert [deadline(await queue.get(j)) for j in many] == [now + 7_500] * 2
    # A batch without the option: each task's own.
    mixed = await queue.enqueue_many([Report(), Echo(text="z")])
    assert [deadline(await queue.get(j)) for j in mixed] == [now + 300_000, None]


async def test_a_job_started_before_its_deadline_runs(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    job = await queue.enqueue(Report(n=1), expires=10)
    _clock(clocked).advance(9.999)
    state: dict[str, Any] = {}
    await drain(queue, ReportJob, state=state)
    assert state["ran"] == [1]
    info = await queue.get(job)
    assert info is not None and info.state is vr.JobState.COMPLETED


async def test_a_claim_that_reaches_an_expired_job_ends_it_and_runs_the_rest(
    clocked: vr.Client, queue_name: str
) -> None:
    queue = clocked.queue(queue_name)
    late = [await queue.enqueue(Report(n=i), expires=1) for i in range(3)]
    on_time = await queue.enqueue(Report(n=9), expires=60)
    _clock(clocked).advance(1)  # the deadline itself: not started before it
    state: dict[str, Any] = {}
    await drain(queue, ReportJob, state=state)
    assert state["ran"] == [9]
    for job in late:
        info = await _expired(queue, job)
        assert info.run_count == 0
    counts = await queue.counts()
    assert (counts["dead"], counts["completed"], counts["pending"]) == (3, 1, 0)
    assert (await queue.get(on_time)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_the_reclaim_sweep_ends_an_expired_job_no_claim_reaches(
    clocked: vr.Client, queue_name: str
) -> None:
    """A paused queue claims nothing: the sweep alone sees to its deadlines."""
    queue = clocked.queue(queue_name)
    await queue.pause()
    job = await queue.enqueue(Report(), expires=5)
    delayed = await queue.enqueue(Report(), delay=3, expires=5)
    later = await queue.enqueue(Report(), expires=50)
    _clock(clocked).advance(4)
    await _sweep(queue)
    assert {(await queue.get(j)).state for j in (job, delayed, later)} == {vr.JobState.PENDING}  # type: ignore[union-attr]
    _clock(clocked).advance(1)
    await _sweep(queue)
    await _expired(queue, job)
    await _expired(queue, delayed)
    assert (await queue.get(later)).state is vr.JobState.PENDING  # type: ignore[union-attr]
    counts = await queue.counts()
    assert (counts["pending"], counts["dead"]) == (1, 2)
    # Out of the pending sets and of the index; nothing is left to claim.
    r = clocked.redis
    assert [await r.zscore(k, job) for k in queue.keys.pending_high_first] == [None] * 4
    assert await r.zrange(queue.keys.expiring, 0, -1) == [later.encode()]


async def test_one_reclaim_tick_takes_every_deadline_past_not_a_batch(
    clocked: vr.Client, queue_name: str
) -> None:
    """The sweep's part for deadlines stops at 1,000 a call: a worker's tick calls
    again until it is through, so an index fed faster than 1,000 a tick (a finished
    job leaves it only when its deadline passes) does not grow for good."""
    queue = clocked.queue(queue_name)
    await queue.pause()
    await queue.enqueue_many([Report(n=i) for i in range(1_250)], expires=5)
    _clock(clocked).advance(5)
    await make_worker(queue, ReportJob)._runners[0].reclaim_once()
    counts = await queue.counts()
    assert (counts["pending"], counts["dead"]) == (0, 1_250)
    assert await clocked.redis.zcard(queue.keys.expiring) == 0


async def test_a_retry_due_after_the_deadline_never_runs(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    job = await queue.enqueue(Failing(), expires=30)
    # Three runs before the deadline (the clock stands still); the next retry
    # is due minutes later, past it.
    worker = make_worker(queue, FailingJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while (info := await queue.get(job)) is None or info.failures < 3:
                await anyio.sleep(0.02)
        worker.shutdown()
    info = await queue.get(job)
    assert info is not None and info.state is vr.JobState.PENDING and info.failures == 3
    assert (await queue.counts())["retrying"] == 1
    _clock(clocked).advance(30)
    await _sweep(queue)
    info = await _expired(queue, job)
    assert info.failures == 3 and info.run_count == 3
    counts = await queue.counts()
    assert (counts["retrying"], counts["pending"], counts["dead"]) == (0, 0, 1)
    _clock(clocked).advance(600)
    await drain(queue, FailingJob)  # nothing left to run
    assert [e.event for e in await queue.journal(job)].count("failed") == 3


async def test_a_running_job_is_looked_at_again_after_its_run(clocked: vr.Client, queue_name: str) -> None:
    """Started in time, it runs on past the deadline; a failed run then leaves it to the sweep."""
    queue = clocked.queue(queue_name)
    job = await queue.enqueue(Report(), expires=5)
    assert [j for j, _ in claimed_jobs(await claim_raw(queue, 1, lease_ms=60_000))] == [job]
    _clock(clocked).advance(10)
    await _sweep(queue)
    assert (await queue.get(job)).state is vr.JobState.RUNNING  # type: ignore[union-attr]
    assert await clocked.redis.zscore(queue.keys.expiring, job) is not None  # kept, for after the run
    _clock(clocked).advance(60)  # its lease ends: reclaimed (a failed run), then past its deadline
    await _sweep(queue)
    await _sweep(queue)
    info = await _expired(queue, job)
    assert info.failures == 1
    assert await clocked.redis.zcard(queue.keys.expiring) == 0


async def test_an_expired_job_gives_up_its_dedup_key(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    first = await queue.enqueue(Keyed(key="k"), expires=1)
    assert await queue.enqueue(Keyed(key="k"), expires=1) == first  # merged into the pending one
    _clock(clocked).advance(2)
    await _sweep(queue)
    await _expired(queue, first)
    second = await queue.enqueue(Keyed(key="k"))
    assert second != first


async def test_a_parked_job_expires_and_leaves_its_limit(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.set_limit("expiry.report", concurrency=1)
    running = await queue.enqueue(Report(n=1))
    parked = await queue.enqueue(Report(n=2), expires=5)
    assert [j for j, _ in claimed_jobs(await claim_raw(queue, 2))] == [running]
    assert await clocked.redis.zcard(queue.keys.limits_parked) == 1
    _clock(clocked).advance(5)
    await _sweep(queue)
    await _expired(queue, parked)
    assert await clocked.redis.zcard(queue.keys.limits_parked) == 0
    assert await clocked.redis.hget(queue.keys.job(parked), "parked") is None


async def test_a_waiting_job_expires_and_its_dependents_are_told(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.pause()
    gate = await queue.enqueue(Echo(text="gate"))
    middle = await queue.enqueue(Report(), after=[gate], expires=5)
    last = await queue.enqueue(Echo(text="last"), after=[middle])
    _clock(clocked).advance(5)
    await _sweep(queue)
    await _expired(queue, middle)
    info = await queue.get(last)
    assert info is not None and info.state is vr.JobState.DEAD
    assert info.dead_reason is vr.DeadReason.DEPENDENCY_FAILED
    assert await clocked.redis.zscore(queue.keys.waiting, middle) is None
    await queue.resume_queue()
    await drain(queue, EchoJob)
    assert (await queue.get(gate)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad",
    [0, -1, 0.0001, math.nan, math.inf, True, "60", timedelta(0), timedelta(seconds=-5)],
    ids=repr,
)
async def test_a_bad_deadline_is_refused_with_nothing_written(
    clocked: vr.Client, queue_name: str, bad: object
) -> None:
    queue = clocked.queue(queue_name)
    with pytest.raises(vr.ConfigurationError, match="expires"):
        await queue.enqueue(Echo(text="x"), expires=bad)  # type: ignore[arg-type]
    with pytest.raises(vr.ConfigurationError, match="expires"):
        await queue.enqueue_many([Echo(text="x")], expires=bad)  # type: ignore[arg-type]
    assert not any((await queue.counts()).values())


async def test_a_job_that_could_never_start_in_time_is_refused(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    clock = _clock(clocked)
    with pytest.raises(vr.ConfigurationError, match="deadline"):
        await queue.enqueue(Echo(text="x"), delay=10, expires=10)
    with pytest.raises(vr.ConfigurationError, match="deadline"):
        await queue.enqueue(Echo(text="x"), at=clock.now + timedelta(minutes=10), expires=60)
    with pytest.raises(vr.ConfigurationError, match="deadline"):
        await queue.enqueue_many([Report()], delay=timedelta(hours=1))
    assert not any((await queue.counts()).values())


def test_a_task_whose_deadline_is_bad_is_refused_at_enqueue() -> None:
    class Bad(vr.Task):
        KIND: ClassVar[str] = "expiry.bad"

        def expires(self) -> float | timedelta | None:
            return -3

    from venturi_redis._store.prepare import prepare

    with pytest.raises(vr.ConfigurationError, match=r"expiry\.bad expires"):
        prepare(Bad(), 1 << 20, None)


async def test_an_operators_retry_of_an_expired_job_runs_it(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    job = await queue.enqueue(Report(n=7), expires=1)
    _clock(clocked).advance(2)
    await _sweep(queue)
    await _expired(queue, job)
    assert await queue.retry_dead(kind="expiry.report") == [job]
    info = await queue.get(job)
    assert info is not None and info.state is vr.JobState.PENDING and info.expires_at is None
    state: dict[str, Any] = {}
    await drain(queue, ReportJob, state=state)
    assert state["ran"] == [7]
