"""W2-style drain with ``venturi worker --processes N``: one worker process against several.

usage: .venv/bin/python benchmarks/processes.py [--jobs 20000] [--processes 1 2] [--runs 3]

Each run: a fresh redis-server of its own, ``jobs`` no-op jobs enqueued first
(untimed), then ``venturi worker benchmarks.processes:make_worker --processes
N`` (concurrency 100 per process) started as a user starts it. The clock runs
from the first completed job to the last (Redis counts them; this script
polls every 5 ms), so process start-up is not counted, and a second process
that starts late is. jobs/s = jobs completed in that window / its length.
The settings interleave run by run (the machine's speed drifts); median of
runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import venturi_redis as vr  # noqa: E402

QUEUE = "bench-procs"


class Nop(vr.Task):
    KIND: ClassVar[str] = "bench.nop"
    i: int


class NopJob(Nop, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


def make_worker() -> vr.Worker:
    client = vr.Client.from_url(os.environ["REDIS_URL"])
    return vr.Worker(client.queue(QUEUE), concurrency=100, retention=None).register(NopJob)


def one_run(jobs: int, processes: int) -> float:
    from tests.servers import RedisServer

    with RedisServer() as server, vr.SyncClient(server.url) as client:
        q = client.queue(QUEUE)
        for s in range(0, jobs, 1000):
            q.enqueue_many([Nop(i=i) for i in range(s, min(jobs, s + 1000))])
        env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "benchmarks.processes:make_worker"]
        cmd += ["--processes", str(processes), "--log-level", "warning"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        try:
            import redis

            r = redis.Redis(port=server.port)
            key = f"venturi:{{{QUEUE}}}:completed"
            while (first := r.zcard(key)) == 0:
                time.sleep(0.005)
            t0 = time.perf_counter()
            while (done := r.zcard(key)) < jobs:
                time.sleep(0.005)
            t1 = time.perf_counter()
            assert done == jobs
            return (jobs - first) / (t1 - t0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"| {a.jobs:,} no-op jobs, concurrency 100 per process | jobs/s (median) | runs |\n|---|---|---|")
    # Interleaved (1, 2, 1, 2, ...): the machine's speed drifts, and each
    # setting sees the same drift.
    runs: dict[int, list[float]] = {n: [] for n in a.processes}
    for _ in range(a.runs):
        for n in a.processes:
            runs[n].append(one_run(a.jobs, n))
    for n, rates in runs.items():
        shown = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| `--processes {n}` | {statistics.median(rates):,.0f} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
