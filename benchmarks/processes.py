"""W2-style drain with ``venturi worker --processes N``: one worker process against several.

usage: .venv/bin/python benchmarks/processes.py [--jobs 100000] [--processes 1 2] [--runs 3]

Each run: a fresh redis-server of its own, ``jobs`` no-op jobs enqueued first
(untimed), then ``venturi worker benchmarks.processes:make_worker --processes
N`` (concurrency 100 per process) started as a user starts it. The clock runs
from the first completed job to the last (Redis counts them; this script
polls every 5 ms), so process start-up is not counted, and a second process
that starts late is. jobs/s = jobs completed in that window / its length.
The default is 100,000 jobs (it was 20,000): the second process starts
~0.1 s after the first (its imports), which was a fifth of a 20,000-job
window at ~40,000 jobs/s (20,000 jobs read 1.31x, 100,000 read 1.63-1.72x in
the same hour, session 23, benchmarks/README.md) and is a twentieth of this one.
The settings interleave run by run (the machine's speed drifts); median of
runs.

Over the same window it reads the CPU time spent: Redis's own (``INFO
cpu``, user + sys) and the worker processes' (the supervisor and its
children, ``/proc/PID/stat`` utime + stime, in clock ticks), each per job
and as cores busy. Their sum per job bounds what any number of processes
can do on this machine: ``cores / (Redis µs + worker µs per job)`` jobs/s,
printed as the ceiling.
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


TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of ``pid`` and its children, as /proc has them now."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # The process itself, or a child (ppid: the 4th field, the 2nd after the name).
            if int(entry) == pid or int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return total


def _script_calls(r: object) -> int:
    """Script calls Redis has run (``INFO commandstats``: EVALSHA and EVAL)."""
    stats = r.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def one_run(jobs: int, processes: int) -> tuple[float, float, float, float]:
    """jobs/s, Redis's and the workers' CPU µs per job, and jobs per script call, over the timed window."""
    from redis_cpu import cpu as redis_cpu  # the server's INFO cpu, user + sys (benchmarks/ is sys.path[0])

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
            redis0, workers0 = redis_cpu(r), _tree_cpu(proc.pid)
            calls0 = _script_calls(r)
            first = r.zcard(key)
            while (done := r.zcard(key)) < jobs:
                time.sleep(0.005)
            t1 = time.perf_counter()
            redis1, workers1 = redis_cpu(r), _tree_cpu(proc.pid)
            calls = _script_calls(r) - calls0
            assert done == jobs
            n = jobs - first
            return n / (t1 - t0), (redis1 - redis0) / n * 1e6, (workers1 - workers0) / n * 1e6, n / calls
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"| {a.jobs:,} no-op jobs, concurrency 100 per process | jobs/s (median) | runs |\n|---|---|---|")
    # Interleaved (1, 2, 1, 2, ...): the machine's speed drifts, and each
    # setting sees the same drift.
    runs: dict[int, list[tuple[float, float, float, float]]] = {n: [] for n in a.processes}
    for _ in range(a.runs):
        for n in a.processes:
            runs[n].append(one_run(a.jobs, n))
    cpu_rows = []
    cores = os.cpu_count() or 1
    for n, got in runs.items():
        rates = [g[0] for g in got]
        shown = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| `--processes {n}` | {statistics.median(rates):,.0f} | {shown} |", flush=True)
        rate = statistics.median(rates)
        redis_us = statistics.median(g[1] for g in got)
        workers_us = statistics.median(g[2] for g in got)
        busy = rate * (redis_us + workers_us) / 1e6
        ceiling = cores / (redis_us + workers_us) * 1e6
        per_call = statistics.median(g[3] for g in got)
        cpu_rows.append(
            f"| `--processes {n}` | {redis_us:.1f} | {workers_us:.1f} | {rate * redis_us / 1e6:.2f} + "
            f"{rate * workers_us / 1e6:.2f} = {busy:.2f} of {cores} | {ceiling:,.0f} | {per_call:.1f} |"
        )
    print(
        "\n| CPU over the window (medians) | Redis µs/job | workers µs/job | cores busy (Redis + workers) "
        f"| ceiling on {cores} cores, jobs/s | jobs per script call |\n|---|---|---|---|---|---|"
    )
    print("\n".join(cpu_rows), flush=True)


if __name__ == "__main__":
    main()
