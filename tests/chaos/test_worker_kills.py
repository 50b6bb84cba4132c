"""Scenario 1: worker processes SIGKILLed at random while they drain a queue.

At-least-once, shown: every job completes, none is lost, every duplicate run
is explained by a ``lease_expired`` entry in the job's journal, and nothing
is left running. CI: 3,000 jobs, a kill every 0.3-0.6 s. ``VENTURI_LONG=1``:
50,000 jobs, a kill every second.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Callable

import anyio
import pytest

import venturi_redis as vr
from tests.chaos.chaos_tasks import Work, started_key
from tests.chaos.conftest import LONG, Fleet, figures, journals, redis_now_ms
from tests.servers import RedisServer

JOBS = 50_000 if LONG else 3_000
KILL_EVERY = (0.8, 1.2) if LONG else (0.3, 0.6)
WORKERS = 3
LEASE = 1.0
# A bound that fails a lost job instead of hanging, not a timing: ~30 s alone, it
# took over 90 on this 2-core machine beside two other suites.
BUDGET = 1200.0 if LONG else 300.0
# The per-test timeout outlasts BUDGET and the checks after the drain (every
# job's state and journal read back), so a slow drain fails on the budget's
# assert, which prints the counts, never on the suite's 120 s timeout: that
# cut every long run short (50,000 jobs need minutes), and a slow short one.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(BUDGET + (300 if LONG else 60))]


async def test_random_sigkills_lose_nothing(
    redis_server: RedisServer, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    client = vr.Client.from_url(redis_server.url)
    q = client.queue(queue_name)
    r = client.redis
    rng = random.Random()
    try:
        ids = await q.enqueue_many([Work(ms=20) for _ in range(JOBS)])
        # Every job is read back afterwards (its state, its journal), and the
        # drain waits for the completed count: the default retention's 10,000
        # completed jobs would trim the long run's 50,000 away from both.
        fleet = fleet_factory(
            redis_server.url, queue_name, lease=LEASE, concurrency=8, reclaim_interval=0.25, retention="none"
        )
        for _ in range(WORKERS):
            fleet.start()
        started = time.monotonic()
        kills: list[tuple[str, int, list[str]]] = []
        while (await q.counts())["completed"] < JOBS:
            assert time.monotonic() - started < BUDGET, f"not drained in {BUDGET}s: {await q.counts()}"
            await anyio.sleep(rng.uniform(*KILL_EVERY))
            victim = rng.choice(fleet.alive())
            fleet.signal(victim, signal.SIGKILL)
            at = await redis_now_ms(r)
            running = [x.decode() for x in await r.zrange(q.keys.running, 0, -1)]
            owners = [await r.hget(q.keys.job(j), "lease_owner") for j in running]
            held = [j for j, o in zip(running, owners, strict=True) if o == victim.encode()]
            kills.append((victim, at, held))
            fleet.start()
        elapsed = time.monotonic() - started

        counts = await q.counts()
        states = Counter()
        for i in range(0, len(ids), 1000):
            pipe = r.pipeline(transaction=False)
            for job_id in ids[i : i + 1000]:
                pipe.hget(q.keys.job(job_id), "state")
            for state in await pipe.execute():
                states[(state or b"missing").decode()] += 1
        runs = Counter(x.decode() for x in await r.lrange(started_key(queue_name), 0, -1))
        journal = await journals(r, q.keys, ids)
        events = {j: [e for e, _ in entries] for j, entries in journal.items()}

        lost = JOBS - states["completed"]
        duplicates = sum(n - 1 for n in runs.values() if n > 1)
        unexplained = [j for j, n in runs.items() if n - 1 > events[j].count("lease_expired")]
        # Every claim but the first must follow a reclaim (no graceful release happened).
        bad_claims = [j for j, ev in events.items() if ev.count("claimed") != 1 + ev.count("lease_expired")]
        # Recovery: from the kill until each job the victim held is pending again
        # (its lease_expired entry). Reaching a worker after that is the backlog's
        # business: a reclaimed job queues behind older ones (FIFO by eligibility).
        recoveries = [
            min(t for e, t in journal[j] if e == "lease_expired" and t >= at) - at
            for _, at, held in kills
            for j in held
        ]
        worst = max(recoveries, default=0) / 1000
        figures(
            "worker-kills",
            jobs=JOBS,
            workers=WORKERS,
            lease_s=LEASE,
            faults=len(kills),
            interrupted=sum(len(h) for _, _, h in kills),
            lost=lost,
            duplicates=duplicates,
            unexplained=len(unexplained),
            worst_recovery_s=f"{worst:.2f}",
            elapsed_s=f"{elapsed:.1f}",
        )
        assert lost == 0, states
        assert (counts["running"], counts["pending"], counts["dead"]) == (0, 0, 0), counts
        assert not unexplained, unexplained[:5]
        assert not bad_claims, {j: events[j] for j in bad_claims[:5]}
        assert len(kills) >= 3
        # Every job a kill interrupted was taken back by a sweep (its lease_expired
        # entry). How soon is a figure, printed above, not asserted: tests never
        # assert timings. Under load a sweep waits for a surviving worker, and
        # with a kill every 0.3-0.6 s every worker may still be starting (seen:
        # 6.9 s on a machine busy with three pip installs).
        assert len(recoveries) == sum(len(h) for _, _, h in kills)
    finally:
        await client.aclose()
