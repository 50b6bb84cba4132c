"""Scenario 9: a handler that blocks the event loop.

A worker renews its leases every ``lease / 3`` from the same event loop its
handlers run on. A handler that blocks the loop (``time.sleep``, CPU-bound
code, a blocking client) stops the renewals while it blocks:

* blocked for longer than a renewal interval but well inside the lease: the
  lease survives (the renewal is merely late) and the job completes once;
* blocked for longer than the lease: any other worker's reclaim sweep takes
  the job back (``lease_expired``) and runs it again; the blocked run's
  outcome is refused when it finally returns. At-least-once still holds, but
  the work is done twice;
* the remedy, the same block run in a thread (``anyio.to_thread.run_sync``):
  the loop stays free, renewals continue, the job completes once.

A sweeper here reclaims every 20 ms (on Redis time), standing in for a fleet
of other workers, so a lease is taken back the moment it expires.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

import venturi_redis as vr
from tests.chaos.chaos_tasks import Blocker
from tests.chaos.conftest import Fleet, figures
from tests.chaos.driver import Driver
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

LEASE = 1.5  # renewals every 0.5 s


async def test_blocking_the_event_loop(
    redis_server: RedisServer, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    client = vr.Client.from_url(redis_server.url)
    q = client.queue(queue_name)
    sweeper = Driver(q, max_failures="none")
    try:
        within = await q.enqueue(Blocker(seconds=0.8))  # > LEASE / 3, < LEASE
        beyond = await q.enqueue(Blocker(seconds=2.5))  # > LEASE
        threaded = await q.enqueue(Blocker(seconds=2.5, in_thread=True))  # > LEASE, off the loop
        fleet = fleet_factory(redis_server.url, queue_name, lease=LEASE, concurrency=1, reclaim_interval=30)
        fleet.start()
        start = time.monotonic()
        reclaimed: list[str] = []
        while (await q.counts())["completed"] < 3:
            assert time.monotonic() - start < 30, await q.counts()
            reclaimed += (await sweeper.reclaim())[2]
            await anyio.sleep(0.02)
        events = {job: [e.event for e in await q.journal(job)] for job in (within, beyond, threaded)}
        figures(
            "blocking-handler",
            lease_s=LEASE,
            blocked_within_lease=f"{events[within].count('lease_expired')} expiries",
            blocked_beyond_lease=f"{events[beyond].count('lease_expired')} expiries, "
            f"{events[beyond].count('claimed')} runs",
            in_thread=f"{events[threaded].count('lease_expired')} expiries",
        )
        assert events[within] == ["enqueued", "claimed", "completed"]
        assert events[threaded] == ["enqueued", "claimed", "completed"]
        assert reclaimed == [beyond]
        assert events[beyond].count("lease_expired") == 1
        assert events[beyond].count("claimed") == 2
        assert "refused" in events[beyond]  # the blocked run's late outcome
        assert events[beyond][-1] in ("completed", "refused")
        info = await q.get(beyond)
        assert info is not None
        assert info.state == vr.JobState.COMPLETED
    finally:
        await client.aclose()
