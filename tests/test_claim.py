"""claim.lua scans each priority level with one ZRANGE by rank: ordering and `next`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs
from tests.servers import RedisServer
from tests.tasks import Echo

pytestmark = pytest.mark.anyio

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    clock = Clock(T0)
    async with vr.Client.from_url(url, clock=clock) as c:
        yield c.queue(queue_name), clock


async def claim(queue: vr.Queue, count: int) -> tuple[int, list[str]]:
    """Run claim.lua; returns (next, claimed ids)."""
    reply = await claim_raw(queue, count)
    return int(reply[1]), [job_id for job_id, _ in claimed_jobs(reply)]


async def test_order_across_levels_and_next_from_the_scan(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    crit_later = await q.enqueue(Echo(text="c"), priority="critical", delay=0.5)
    n1 = await q.enqueue(Echo(text="n1"), priority="normal")
    clock.ms += 1
    n2 = await q.enqueue(Echo(text="n2"), priority="normal")
    h1 = await q.enqueue(Echo(text="h1"), priority="high")
    low_later = await q.enqueue(Echo(text="l"), priority="low", delay=0.2)
    clock.ms += 1
    # Fewer eligible than asked: all of them, highest level first, then by eligibility.
    nxt, got = await claim(q, 10)
    assert got == [h1, n1, n2]
    assert nxt == T0 + 1 + 200  # the LOW job, earlier than the CRITICAL one
    clock.ms = T0 + 1 + 200
    nxt, got = await claim(q, 10)
    assert (got, nxt) == ([low_later], T0 + 500)
    clock.ms = T0 + 500
    assert await claim(q, 10) == (0, [crit_later])
    assert await claim(q, 10) == (0, [])


async def test_a_full_claim_reports_no_next(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    ids = [await q.enqueue(Echo(text=str(i))) for i in range(3)]
    await q.enqueue(Echo(text="later"), delay=1)
    assert await claim(q, 2) == (0, ids[:2])
    assert await claim(q, 2) == (T0 + 1000, ids[2:])


async def test_an_id_that_cannot_be_claimed_takes_no_place(timed: tuple[vr.Queue, Clock]) -> None:
    """The first k of a level were all eligible but one was not claimable (its
    hash is gone, or its cancel finished at claim): the level is read again, so
    the claim is still full and the eligible jobs behind it are not left waiting."""
    q, clock = timed
    r, k = q.client.redis, q.keys
    await r.zadd(k.pending(vr.Priority.NORMAL), {"01GHOST0000000000000000000": T0 - 10})
    a = await q.enqueue(Echo(text="a"))
    clock.ms += 5
    b = await q.enqueue(Echo(text="b"))
    c = await q.enqueue(Echo(text="c"))
    await q.enqueue(Echo(text="low"), priority="low", delay=1)
    clock.ms += 5
    assert await claim(q, 2) == (0, [a, b])  # the ghost is dropped, b takes its place
    assert not await r.zscore(k.pending(vr.Priority.NORMAL), "01GHOST0000000000000000000")
    # Short: c, then the low job's time as `next`.
    assert await claim(q, 2) == (T0 + 5 + 1000, [c])


async def test_a_level_full_of_unclaimable_ids_is_read_to_its_end(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    r, k = q.client.redis, q.keys
    ghosts = {f"01GHOST{i:019d}": T0 - 100 + i for i in range(7)}
    await r.zadd(k.pending(vr.Priority.HIGH), ghosts)  # seven, read two at a time
    a = await q.enqueue(Echo(text="a"))
    b = await q.enqueue(Echo(text="b"))
    clock.ms += 1
    assert await claim(q, 2) == (0, [a, b])
    assert await r.zcard(k.pending(vr.Priority.HIGH)) == 0


async def test_a_paused_queue_claims_nothing(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.enqueue(Echo(text="x"))
    await q.pause()
    assert await claim(q, 5) == (-1, [])


async def test_a_level_not_due_is_one_zrange(redis_server: RedisServer, queue_name: str) -> None:
    """Counted by INFO commandstats, so on the one real redis-server (not per backend).

    Each level is read from its head (its first member and score): an empty
    level, or one whose head is eligible later (its score is the claim's
    `next`), costs one ZRANGE, and no level is read BYSCORE."""
    async with vr.Client.from_url(redis_server.url, clock=Clock(T0)) as c:
        q = c.queue(queue_name)
        await q.enqueue(Echo(text="later"), priority="high", delay=5)
        await c.redis.config_resetstat()
        assert await claim(q, 4) == (T0 + 5000, [])
        stats = await c.redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    assert calls.get("zrange") == 4
    assert "zrangebyscore" not in calls


async def test_a_claim_of_one_takes_the_head(redis_server: RedisServer, queue_name: str) -> None:
    """A claim of one job (an idle worker's, the usual claim of a lightly loaded
    pod) reads each level's head down to the first level with a job due, and
    takes that head: one ZRANGE per level read, none BYSCORE, nothing read
    after it."""
    async with vr.Client.from_url(redis_server.url, clock=Clock(T0)) as c:
        q = c.queue(queue_name)
        first = await q.enqueue(Echo(text="a"))
        await q.enqueue(Echo(text="b"))
        await q.enqueue(Echo(text="low"), priority="low")
        await c.redis.config_resetstat()
        assert await claim(q, 1) == (0, [first])
        stats = await c.redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    assert calls.get("zrange") == 3  # critical and high (empty), normal (its head)
    assert calls.get("zremrangebyrank") == 1


async def test_a_claim_on_an_empty_queue_reads_no_level(redis_server: RedisServer, queue_name: str) -> None:
    """An idle worker's periodic claim: one EXISTS over the four pending sets."""
    async with vr.Client.from_url(redis_server.url, clock=Clock(T0)) as c:
        q = c.queue(queue_name)
        job_id = await q.enqueue(Echo(text="x"))
        assert await claim(q, 4) == (0, [job_id])  # the queue's last job: the sets are gone
        await c.redis.config_resetstat()
        assert await claim(q, 4) == (0, [])
        stats = await c.redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    assert calls.get("exists") == 1
    assert "zrange" not in calls
