"""Scenario 3: a completion racing the lease expiry at the same instant.

The clock is the test's (``vr.Client(clock=...)``), so "the same instant" is
exact: the completion and the reclaim both run with ``now`` equal to the
lease's expiry. Redis runs scripts one at a time, so one of them sees the
other's result: exactly one transition wins, the loser changes nothing but
its journal line, and the job sits in exactly one index.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aioredis

import venturi_redis as vr
from tests.chaos.conftest import figures
from tests.chaos.driver import Clock, Driver
from tests.servers import RedisServer
from tests.tasks import Echo

pytestmark = pytest.mark.anyio

LEASE_MS = 1000


@pytest.fixture
async def raced(redis_server: RedisServer, queue_name: str) -> AsyncIterator[tuple[Clock, Driver, Driver]]:
    """Two drivers on two connections (two "processes") sharing one clock."""
    clock = Clock()
    a = vr.Client(aioredis.Redis.from_url(redis_server.url), clock=clock)
    b = vr.Client(aioredis.Redis.from_url(redis_server.url), clock=clock)
    try:
        yield clock, Driver(a.queue(queue_name)), Driver(b.queue(queue_name))
    finally:
        await a.aclose()
        await b.aclose()


async def _claimed(clock: Clock, d: Driver, n: int) -> list[tuple[str, str]]:
    await d.q.enqueue_many([Echo(text=str(i)) for i in range(n)])
    jobs = await d.claim(n, "worker-a", "tok", LEASE_MS)
    assert len(jobs) == n
    clock.advance(LEASE_MS)  # exactly the lease expiry: both sides are entitled to act
    return jobs


async def test_complete_first_wins(raced: tuple[Clock, Driver, Driver]) -> None:
    clock, worker, sweeper = raced
    [(job, token)] = await _claimed(clock, worker, 1)
    assert await worker.complete(job, token) == [1]
    assert await sweeper.reclaim() == (0, 0, [])
    assert await worker.where(job) == ["completed"]
    assert [e["event"] for e in await worker.events(job)] == ["enqueued", "claimed", "completed"]


async def test_reclaim_first_wins(raced: tuple[Clock, Driver, Driver]) -> None:
    clock, worker, sweeper = raced
    [(job, token)] = await _claimed(clock, worker, 1)
    assert await sweeper.reclaim() == (1, 0, [job])
    refused = await worker.complete(job, token)
    assert refused[0] == 0
    assert await worker.where(job) == ["pending:normal"]
    events = await worker.events(job)
    assert [e["event"] for e in events] == ["enqueued", "claimed", "lease_expired", "refused"]
    assert events[-1]["attempted"] == "complete"
    # The late extension is refused too: the lease is gone, nothing is renewed.
    assert (await worker.extend([(job, token)], LEASE_MS)).lost == [job]
    assert await worker.where(job) == ["pending:normal"]


async def test_concurrent_race_has_one_winner_per_job(raced: tuple[Clock, Driver, Driver]) -> None:
    """Both sides fire at once on separate connections, for many jobs."""
    clock, worker, sweeper = raced
    jobs = await _claimed(clock, worker, 200)
    outcomes: dict[str, int] = {}

    async def complete_all() -> None:
        for job, token in jobs:
            outcomes[job] = int((await worker.complete(job, token))[0])

    async def reclaim_all() -> None:
        # One job per sweep, so the two sides interleave job by job.
        while (await sweeper.reclaim(batch=1))[2]:
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(complete_all)
        tg.start_soon(reclaim_all)
    won_by_worker = won_by_sweeper = 0
    for job, _ in jobs:
        events = [e["event"] for e in await worker.events(job)]
        where = await worker.where(job)
        assert len(where) == 1, (job, where)
        if outcomes[job] == 1:
            won_by_worker += 1
            assert where == ["completed"]
            assert events == ["enqueued", "claimed", "completed"]
        else:
            won_by_sweeper += 1
            assert where == ["pending:normal"]
            assert events == ["enqueued", "claimed", "lease_expired", "refused"]
    figures("race", jobs=len(jobs), completed_first=won_by_worker, reclaimed_first=won_by_sweeper)
    assert won_by_worker + won_by_sweeper == len(jobs)


async def test_late_completion_before_any_sweep_is_accepted(raced: tuple[Clock, Driver, Driver]) -> None:
    """The lease is enforced by the reclaim, not by a deadline check in complete:
    an outcome that arrives after the expiry but before any sweep still wins,
    since no other worker can have started the job in between."""
    clock, worker, sweeper = raced
    [(job, token)] = await _claimed(clock, worker, 1)
    clock.advance(5_000)
    assert await worker.complete(job, token) == [1]
    assert await sweeper.reclaim() == (0, 0, [])
    assert await worker.where(job) == ["completed"]
