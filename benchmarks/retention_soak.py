"""Retention under load: finished jobs held and Redis memory while a worker drains at full speed.

usage: .venv/bin/python benchmarks/retention_soak.py [--jobs 1000000] [--root PATH] [--retention 1]

A fresh redis-server of its own; a producer process enqueues ``jobs`` no-op
jobs of a 200-byte payload, 500 per call, keeping a backlog of about 50,000
ahead of the worker; one worker process (concurrency 100) drains them with
``vr.Retention(completed=R, dead=R, cancelled=R)`` (R seconds, default 1).
Both run ``--root``'s venturi (default: this checkout; another made with
``git worktree add``, with its own ``.venv``, for a before/after). Every 5
seconds a line: jobs completed so far, completions per second, finished jobs
held (the completed set's size), Redis ``used_memory``, and Redis's own CPU
per completion in that interval (``INFO cpu``, user + sys, over the
completions: enqueue, claim, complete and trimming together). The last lines
say whether held jobs and memory stayed flat after the warm-up (the first
quarter of the run).

What "kept up" means (issue 47): held stays near rate x (retention + the time
a completing call takes to see the job past its period), whatever the rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.servers import RedisServer  # noqa: E402

QUEUE = "soak"
COMMON = """
import os, sys
from typing import Any, ClassVar
sys.path.insert(0, os.environ["SOAK_ROOT"])
import venturi_redis as vr


class Blob(vr.Task):
    KIND: ClassVar[str] = "soak.blob"
    blob: str


class BlobJob(Blob, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await state.incr("soak:done")  # the count the sampler reads (one INCR a job, as in W2)
        return vr.Outcome.completed()
"""

PRODUCER = (
    COMMON
    + """
import anyio

async def main() -> None:
    total, ahead = int(os.environ["SOAK_JOBS"]), 50_000
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as c:
        q = c.queue("soak")
        sent = 0
        while sent < total:
            counts = await q.counts()
            if counts["pending"] > ahead:
                await anyio.sleep(0.05)
                continue
            n = min(500, total - sent)
            await q.enqueue_many([Blob(blob="x" * 200) for _ in range(n)])
            sent += n

anyio.run(main)
"""
)

WORKER = (
    COMMON
    + """
import anyio

import redis.asyncio

async def main() -> None:
    r = float(os.environ["SOAK_RETENTION"])
    counter = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"], max_connections=100)
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as c:
        retention = vr.Retention(completed=r, dead=r, cancelled=r)
        w = vr.Worker(c.queue("soak"), concurrency=100, retention=retention, state=counter)
        w.register(BlobJob)
        await w.run()

anyio.run(main)
"""
)


def cpu_seconds(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def waiting(r: redis.Redis) -> int:
    keys = [f"venturi:{{{QUEUE}}}:pending:{p}" for p in ("critical", "high", "normal", "low")]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.zcard(k)
    pipe.zcard(f"venturi:{{{QUEUE}}}:running")
    return sum(pipe.execute())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--root", type=Path, default=HERE.parent)
    ap.add_argument("--retention", type=float, default=1.0)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    a = ap.parse_args()
    root = a.root.resolve()
    python = root / ".venv" / "bin" / "python"
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        env = {
            **os.environ,
            "REDIS_URL": server.url,
            "SOAK_ROOT": str(root),
            "SOAK_JOBS": str(a.jobs),
            "SOAK_RETENTION": str(a.retention),
        }
        producer = subprocess.Popen([python, "-c", PRODUCER], env=env)
        worker = subprocess.Popen([python, "-c", WORKER], env=env, stderr=subprocess.DEVNULL)
        print(f"{root}: {a.jobs:,} jobs, retention {a.retention:g} s")
        heads = (
            ("t (s)", 6),
            ("completed", 10),
            ("jobs/s", 8),
            ("held", 9),
            ("used_memory", 12),
            ("Redis µs/job", 13),
        )
        print(" ".join(f"{name:>{width}}" for name, width in heads))
        samples: list[tuple[float, int, int, int, float]] = []
        start = last_t = time.monotonic()
        last_done, last_cpu = 0, cpu_seconds(r)
        try:
            while True:
                time.sleep(a.every)
                now = time.monotonic()
                pipe = r.pipeline(transaction=False)
                pipe.zcard(f"venturi:{{{QUEUE}}}:completed")
                pipe.info("memory")
                pipe.get("soak:done")
                held, memory, done_raw = pipe.execute()
                done = int(done_raw or 0)
                cpu = cpu_seconds(r)
                rate = (done - last_done) / (now - last_t)
                per_job = (cpu - last_cpu) / (done - last_done) * 1e6 if done > last_done else float("nan")
                samples.append((now - start, done, int(held), int(memory["used_memory"]), per_job))
                print(
                    f"{now - start:6.0f} {done:10,} {rate:8,.0f} {int(held):9,} "
                    f"{int(memory['used_memory']) / 1e6:10.1f}MB {per_job:13.1f}"
                )
                last_t, last_done, last_cpu = now, done, cpu
                if done >= a.jobs:
                    break
        finally:
            worker.terminate()
            producer.terminate()
            worker.wait(30)
            producer.wait(30)
    steady = samples[len(samples) // 4 :]
    if len(steady) >= 2:
        held = [s[2] for s in steady]
        mem = [s[3] for s in steady]
        cost = [s[4] for s in steady if s[4] == s[4]]
        print(
            f"after warm-up: held {min(held):,}..{max(held):,} (median {statistics.median(held):,.0f}); "
            f"used_memory {min(mem) / 1e6:.1f}..{max(mem) / 1e6:.1f} MB; "
            f"Redis CPU per job median {statistics.median(cost):.1f} µs"
        )


if __name__ == "__main__":
    main()
