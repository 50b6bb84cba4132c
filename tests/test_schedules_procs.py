"""Several worker processes on one interval schedule, one of them SIGKILLed (issue 27).

Three processes declare and fire the same schedule (every 0.4 s) for a few
seconds; one is killed mid-way. Every fire time from the first to the last
must be covered by exactly one job: no duplicate, no gap (a worker late by
more than an interval makes one job standing for the fire times it covers,
its ``fires``; counted here as "missed"). The figures are printed (-s).
Longer or tighter runs: ``VENTURI_SCHEDULE_SECONDS`` (default 4.5),
``VENTURI_SCHEDULE_EVERY_MS`` (default 400).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest

import venturi_redis as vr
from tests.servers import RedisServer

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
EVERY_MS = int(os.environ.get("VENTURI_SCHEDULE_EVERY_MS", "400"))
RUN_SECONDS = float(os.environ.get("VENTURI_SCHEDULE_SECONDS", "4.5"))


def start(url: str, queue: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs.sched_worker", url, queue, str(EVERY_MS / 1000)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_three_workers_one_killed_one_job_per_fire_time(redis_server: RedisServer) -> None:
    queue_name = f"sched-procs-{uuid.uuid4().hex[:8]}"
    procs = [start(redis_server.url, queue_name) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "READY", line
        time.sleep(RUN_SECONDS / 2)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        killed_at_ms = int(time.time() * 1000)
        time.sleep(RUN_SECONDS / 2)
    finally:
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.communicate(timeout=30)
    assert all(p.returncode == 0 for p in procs[1:]), [p.returncode for p in procs]

    async def read() -> tuple[list[vr.JobInfo], dict[str, int]]:
        async with vr.Client.from_url(redis_server.url) as c:
            q = c.queue(queue_name)
            jobs = [j for j in await q.list_jobs(limit=10_000) if j.schedule_id == "tick"]
            # How many fire times each job stands for, from its journal's `enqueued` entry.
            fires = {j.id: int((await q.journal(j.id))[0].details["fires"]) for j in jobs}
            return jobs, fires

    jobs, fires = anyio.run(read)
    at = sorted(int(j.fire_at.timestamp() * 1000) for j in jobs if j.fire_at is not None)
    assert len(at) == len(jobs)
    duplicates = len(at) - len(set(at))
    # Each job covers its fire time and, after a late fire, the ones after it (its `fires`).
    covered: list[int] = []
    for j in jobs:
        assert j.fire_at is not None
        first = int(j.fire_at.timestamp() * 1000)
        covered += [first + k * EVERY_MS for k in range(fires[j.id])]
    expected = list(range(at[0], max(covered) + 1, EVERY_MS))
    gaps = sorted(set(expected) - set(covered))
    overlaps = len(covered) - len(set(covered))
    missed = sum(n - 1 for n in fires.values())
    print(
        f"\nschedule figures: workers=3 (one SIGKILLed), every={EVERY_MS} ms, fire times={len(expected)}, "
        f"jobs={len(jobs)}, duplicates={duplicates}, gaps={len(gaps)}, overlaps={overlaps}, "
        f"missed (fire times caught up by a later job)={missed}"
    )
    assert duplicates == 0 and overlaps == 0 and gaps == [], (duplicates, overlaps, gaps)
    assert len(expected) >= int(RUN_SECONDS * 1000 / EVERY_MS) - 3
    assert max(at) > killed_at_ms  # the survivors went on firing after the kill
    assert all(j.state in (vr.JobState.COMPLETED, vr.JobState.PENDING, vr.JobState.RUNNING) for j in jobs)
