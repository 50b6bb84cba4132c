"""Scenario 5: connection faults under running workers.

* ``CLIENT KILL`` of every worker connection (commands and pub/sub alike);
* a connection that goes silent without closing (a half-open TCP connection:
  a firewall or NAT dropped it, or the server stopped answering), through a
  proxy the test controls; and the whole path pausing then coming back;
* ``SCRIPT FLUSH`` while jobs run.

The workers run with ``poll_interval=30``: a worker whose blocked wake-up
connection silently died and was not replaced would only notice new work
after 30 s, so every recovery below (a fresh job completed) must come well
before that.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
import redis.asyncio as aioredis

import venturi_redis as vr
from tests.chaos.chaos_tasks import Work
from tests.chaos.conftest import LONG, Fleet, figures, reconnecting
from tests.chaos.proxy import Proxy
from tests.servers import RedisServer
from venturi_redis._store import calls
from venturi_redis._store.sender import Sender

pytestmark = pytest.mark.anyio

POLL = 30.0
BOUND = 10.0  # recovery must beat the poll fallback by a wide margin


async def _completed_within(q: vr.Queue, job_id: str, limit: float) -> float:
    start = time.monotonic()
    while True:
        info = await reconnecting(lambda: q.get(job_id))
        if info is not None and info.state == vr.JobState.COMPLETED:
            return time.monotonic() - start
        assert time.monotonic() - start < limit, f"job {job_id} still {info and info.state} after {limit}s"
        await anyio.sleep(0.02)


async def _idle(r: aioredis.Redis, n: int) -> None:
    """Wait until ``n`` workers are idle: blocked on the wake list, their claim behind."""
    start = time.monotonic()
    while (await r.info("clients"))["blocked_clients"] < n:
        assert time.monotonic() - start < 15, f"{n} worker(s) never went idle on the wake list"
        await anyio.sleep(0.02)


@pytest.fixture
async def qclient(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    client = vr.Client.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_client_kill_of_every_worker_connection(
    redis_server: RedisServer, qclient: vr.Client, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    q = qclient.queue(queue_name)
    fleet = fleet_factory(redis_server.url, queue_name, lease=1.0, poll_interval=POLL)
    fleet.start()
    fleet.start()
    rounds = 6 if LONG else 3
    recoveries: list[float] = []
    background = await q.enqueue_many([Work(ms=50) for _ in range(40)])
    killer = aioredis.Redis.from_url(redis_server.url)
    try:
        for _ in range(rounds):
            await _idle(qclient.redis, 1)
            # Everyone but this connection: the workers, their pub/sub, and our own
            # pool (which must reconnect too).
            await killer.client_kill_filter(_type="normal", skipme=True)
            await killer.client_kill_filter(_type="pubsub", skipme=True)
            job = await reconnecting(lambda: q.enqueue(Work(ms=1)))
            recoveries.append(await _completed_within(q, job, BOUND))
        for job in background:
            await _completed_within(q, job, BOUND)
    finally:
        await killer.aclose()
    figures(
        "client-kill",
        jobs=len(background) + rounds,
        faults=rounds,
        lost=0,
        worst_recovery_s=f"{max(recoveries):.2f}",
        workers_alive=len(fleet.alive()),
    )
    assert len(fleet.alive()) == 2


async def test_silent_connection_and_paused_path(
    redis_server: RedisServer, qclient: vr.Client, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    q = qclient.queue(queue_name)
    proxy = await Proxy(redis_server.port).start()
    try:
        # The handlers' evidence goes straight to Redis: only the worker's own
        # connections go through the proxy.
        fleet = fleet_factory(
            proxy.url, queue_name, lease=1.0, poll_interval=POLL, evidence_url=redis_server.url
        )
        fleet.start()
        await _idle(qclient.redis, 1)
        baseline = await _completed_within(q, await q.enqueue(Work(ms=1)), BOUND)

        # 1. Every connection the worker holds goes silent (its idle BLPOP included).
        proxy.blackhole()
        silent = await _completed_within(q, await q.enqueue(Work(ms=1)), BOUND)

        # 2. The whole path hangs for 3 s (new connections too), then comes back.
        await _idle(qclient.redis, 1)
        proxy.pause()
        job = await q.enqueue(Work(ms=1))
        await anyio.sleep(3.0)
        proxy.resume()
        paused = await _completed_within(q, job, BOUND)
        figures(
            "silent-connection",
            jobs=3,
            faults=2,
            lost=0,
            baseline_s=f"{baseline:.2f}",
            blackhole_recovery_s=f"{silent:.2f}",
            pause_recovery_s=f"{paused:.2f}",
        )
        assert fleet.alive()
    finally:
        await proxy.aclose()


async def test_script_flush_mid_run(
    redis_server: RedisServer, qclient: vr.Client, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    q = qclient.queue(queue_name)
    fleet = fleet_factory(redis_server.url, queue_name, lease=1.0, poll_interval=POLL)
    fleet.start()
    fleet.start()
    ids = await q.enqueue_many([Work(ms=10) for _ in range(1000)])
    flushes = 0
    start = time.monotonic()
    while not await q.is_drained():
        await qclient.redis.script_flush()
        flushes += 1
        assert time.monotonic() - start < 60, await q.counts()
        await anyio.sleep(0.1)
    # More jobs after the last flush: the producer's own EVALSHA reloads too.
    await qclient.redis.script_flush()
    flushes += 1
    last = await q.enqueue(Work(ms=1))
    await _completed_within(q, last, BOUND)
    counts = await q.counts()
    figures("script-flush", jobs=len(ids) + 1, faults=flushes, lost=len(ids) + 1 - counts["completed"])
    assert counts["completed"] == len(ids) + 1
    assert len(fleet.alive()) == 2


class _FlushBeforeEvalsha:
    """A Redis client whose script cache is flushed right before every EVALSHA:
    the worst timing for a NOSCRIPT recovery (a flush between load and call)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    def __getattr__(self, name: str) -> object:
        return getattr(self._redis, name)

    async def evalsha(self, *args: object) -> object:
        await self._redis.script_flush()
        return await self._redis.evalsha(*args)


async def test_noscript_recovery_survives_a_flush_at_the_worst_moment(
    qclient: vr.Client, queue_name: str
) -> None:
    q = qclient.queue(queue_name)
    flaky = _FlushBeforeEvalsha(qclient.redis)
    # Fails with a second NOSCRIPT if the recovery is SCRIPT LOAD then EVALSHA.
    assert calls.extended(await Sender(flaky).call(calls.extend(q.keys, "", []))) == ([], [])
