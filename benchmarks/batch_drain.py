"""Batch handlers against single jobs: one drain beside the other, same machine, same run.

Usage (from the repository root; starts its own redis-server)::

    .venv/bin/python benchmarks/batch_drain.py                 # 20,000 jobs, 3 rounds (~40 s)
    .venv/bin/python benchmarks/batch_drain.py --n 10000 --rounds 1

Each drain is one worker process at concurrency 100 over ``n`` jobs
enqueued first (untimed), from an empty database; jobs/s is ``n`` over the
time from ``worker.run`` to its return (``until_idle``), and Redis's CPU
per job is the server's ``INFO cpu`` (user + sys) across the drain over
``n``: everything Redis did for the drain, the handlers' own commands
included. The variants, in rounds (every variant's run 1, then run 2...,
the median shown), since the machine's speed drifts within minutes:

- ``single W2``: the benchmark's W2 handler (benchmarks/README.md), one
  ``INCR`` per job on a client of its own;
- ``single no-op``: the same worker with a handler that does nothing;
- ``batch no-op``: a ``vr.BatchHandler`` at ``BATCH_SIZE`` 100 that does
  nothing (returns None: every job completed);
- ``batch INCRBY``: the same, with W2's count made once per batch
  (``INCRBY`` of the batch's size): W2's handler, batched.

Target (issue 40): ``batch no-op`` drains at least 3x ``single W2``, at
no more Redis CPU per job.

``Redis busy`` is Redis's CPU over the drain's wall time, ``worker busy``
the worker process's: on a quiet machine, how much of the drain each side
worked (a drain in which Redis and the worker take turns shows both well
under 100 %; the batch drain overlaps them, so Redis, the side with more
work per job, stays near 100 %). On a loaded machine both also wait for a
CPU, and the figures are lower for that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

import venturi_redis as vr  # noqa: E402

VARIANTS = ["single W2", "single no-op", "batch no-op", "batch INCRBY"]


class Noop(vr.Task):
    KIND: ClassVar[str] = "noop"
    i: int


class SingleJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], rec: Any) -> vr.Outcome:
        if rec is not None:
            await rec.incr("bench:count")
        return vr.Outcome.completed()


class BatchJob(Noop, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 100

    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Noop]], rec: Any
    ) -> Sequence[vr.Outcome | BaseException] | None:
        if rec is not None:
            await rec.incrby("bench:count", len(items))
        return None


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def fill(url: str, n: int) -> tuple[redis.Redis, vr.Client, vr.Queue]:
    """A flushed server with ``n`` no-op jobs queued on ``bench`` (batch_trace.py's too)."""
    sync = redis.Redis.from_url(url)
    sync.flushall()
    client = vr.Client.from_url(url)
    q = client.queue("bench")
    for start in range(0, n, 1000):
        await q.enqueue_many([Noop(i=i) for i in range(start, min(n, start + 1000))])
    return sync, client, q


async def child(url: str, n: int, variant: str) -> dict[str, float]:
    """One drain, in a process of its own: jobs/s and Redis's CPU µs per job."""
    sync, client, q = await fill(url, n)
    rec = aioredis.Redis.from_url(url) if variant in ("single W2", "batch INCRBY") else None
    worker = vr.Worker(q, state=rec, concurrency=100, handle_signals=False)
    worker.register(BatchJob if variant.startswith("batch") else SingleJob)
    if rec is not None:
        await rec.ping()  # its connection open before the clock starts
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = _cpu(sync), time.perf_counter()
    await worker.run(until_idle=True)
    t, cpu1 = time.perf_counter() - t0, _cpu(sync)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    own = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    counts = await q.counts()  # completed jobs past the default retention's cap are trimmed
    left = {k: v for k, v in counts.items() if k not in ("completed", "limited") and v}
    assert not left, f"{variant}: not every job completed: {left}"
    if rec is not None:
        assert int(sync.get("bench:count") or 0) == n
        await rec.aclose()
    await client.aclose()
    return {
        "jobs_s": n / t,
        "redis_us_per_job": (cpu1 - cpu0) / n * 1e6,
        "worker_us_per_job": own / n * 1e6,
        "redis_busy": (cpu1 - cpu0) / t,
        "worker_busy": own / t,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=3, metavar=("URL", "N", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        url, n, variant = a.child
        print(json.dumps(asyncio.run(child(url, int(n), variant))))
        return
    from tests.servers import RedisServer

    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with RedisServer() as server:
        for r in range(a.rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", server.url, str(a.n), variant],
                    check=True,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    w2 = statistics.median(x["jobs_s"] for x in runs["single W2"])
    w2_cpu = statistics.median(x["redis_us_per_job"] for x in runs["single W2"])
    print(f"{a.n:,} jobs per drain, concurrency 100, median of {a.rounds} round(s)")
    print(
        "| variant | jobs/s | Redis CPU µs/job | worker CPU µs/job | Redis busy | worker busy "
        "| jobs/s vs single W2 | runs (jobs/s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        rate = statistics.median(x["jobs_s"] for x in runs[variant])
        cpu = statistics.median(x["redis_us_per_job"] for x in runs[variant])
        own = statistics.median(x["worker_us_per_job"] for x in runs[variant])
        rbusy = statistics.median(x["redis_busy"] for x in runs[variant])
        wbusy = statistics.median(x["worker_busy"] for x in runs[variant])
        each = ", ".join(f"{x['jobs_s']:,.0f}" for x in runs[variant])
        print(
            f"| {variant} | {rate:,.0f} | {cpu:.1f} | {own:.1f} | {rbusy:.0%} | {wbusy:.0%} "
            f"| {rate / w2:.2f}x | {each} |"
        )
    batch = statistics.median(x["jobs_s"] for x in runs["batch no-op"])
    batch_cpu = statistics.median(x["redis_us_per_job"] for x in runs["batch no-op"])
    met = batch >= 3 * w2 and batch_cpu <= w2_cpu
    print(
        f"target (batch no-op >= 3x single W2, Redis CPU/job no more): {batch / w2:.2f}x, "
        f"{batch_cpu:.1f} vs {w2_cpu:.1f} µs/job: {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
