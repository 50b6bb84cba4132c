"""Scenario 6: a poison pill, a job whose handler kills its worker process every time.

A supervisor (the driver, standing in for systemd or Kubernetes) restarts
each dead worker. Every kill leaves the job running with a lease nobody
renews; the reclaim counts it as a failed run; at ``max_failures`` the job
goes to dead instead of back to pending, with a journal that says why. The
other jobs of the queue complete meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

import venturi_redis as vr
from tests.chaos.chaos_tasks import Poison, Work
from tests.chaos.conftest import Fleet, figures
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

MAX_FAILURES = 3


async def test_poison_pill_ends_dead_after_the_backstop(
    redis_server: RedisServer, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    client = vr.Client.from_url(redis_server.url)
    q = client.queue(queue_name)
    try:
        # The backstop is the poison's own; the other jobs (which die with the
        # process when they share it with the poison) have none.
        poison = await q.enqueue(Poison(), max_failures=MAX_FAILURES)
        others = await q.enqueue_many([Work(ms=5) for _ in range(200)])
        fleet = fleet_factory(redis_server.url, queue_name, lease=0.5, reclaim_interval=0.1, max_failures=0)
        fleet.start()
        fleet.start()
        restarts = 0
        start = time.monotonic()
        while True:
            info = await q.get(poison)
            assert info is not None
            if info.state == vr.JobState.DEAD:
                break
            assert time.monotonic() - start < 30, f"poison still {info.state} after 30s"
            for name in list(fleet.procs):
                if name in fleet.alive():
                    continue
                fleet.procs[name].wait()
                assert fleet.procs[name].returncode == 17  # the handler's os._exit
                del fleet.procs[name]
                fleet.start()
                restarts += 1
            await anyio.sleep(0.05)
        took = time.monotonic() - start

        journal = await q.journal(poison)
        events = [e.event for e in journal]
        assert events == ["enqueued"] + ["claimed", "lease_expired"] * MAX_FAILURES + ["dead"]
        assert journal[-1].details["reason"] == "max_failures"
        assert f"max_failures={MAX_FAILURES}" in (journal[-1].note or "")
        assert [e.details["failures"] for e in journal if e.event == "lease_expired"] == ["1", "2", "3"]
        assert info.failures == MAX_FAILURES
        assert await client.redis.zscore(q.keys.dead, poison) is not None

        async def rest_done() -> bool:
            return (await q.counts())["completed"] == len(others)

        while not await rest_done():
            assert time.monotonic() - start < 30, await q.counts()
            await anyio.sleep(0.05)
        figures(
            "poison-pill",
            jobs=1 + len(others),
            faults=MAX_FAILURES,
            worker_restarts=restarts,
            poison_state=info.state.value,
            others_completed=len(others),
            lost=0,
            took_s=f"{took:.2f}",
        )
        assert restarts == MAX_FAILURES
    finally:
        await client.aclose()
