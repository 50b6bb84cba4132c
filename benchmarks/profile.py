"""Profile venturi's producer and worker hot paths with pyinstrument.

Usage (from the repository root; pyinstrument is a tool here, not a dependency)::

    .venv/bin/pip install pyinstrument
    .venv/bin/python benchmarks/profile.py [--n 10000] [--concurrency 10]

Starts its own redis-server, then profiles (1) ``n`` sequential ``enqueue``
calls, (2) one ``enqueue_many`` of ``n`` tasks, (3) a worker draining ``n``
no-op jobs in this process. Writes text reports to
``benchmarks/results/profile-*.txt`` and prints the top of each.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import _common as c  # noqa: E402
import venturi_bench as VB  # noqa: E402
from pyinstrument import Profiler  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

OUT = HERE / "results"


SHOW_ALL = False


def save(p: Profiler, name: str, took: float, n: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    text = p.output_text(unicode=True, color=False, show_all=SHOW_ALL)
    path = OUT / f"profile-{name}.txt"
    path.write_text(f"{name}: {n:,} jobs in {took:.2f} s = {n / took:,.0f}/s\n\n{text}")
    print(f"== {name}: {n / took:,.0f}/s -> {path}")


async def main(a: argparse.Namespace) -> None:
    with RedisServer() as server:
        client = vr.Client.from_url(server.url)
        q = client.queue("bench")
        for i in range(200):  # warm-up: script load, connection pool
            await q.enqueue(VB.Noop(i=i))

        p = Profiler(interval=0.001, async_mode="enabled")
        t0 = time.perf_counter()
        with p:
            for i in range(a.n):
                await q.enqueue(VB.Noop(i=i))
        save(p, "enqueue-single", time.perf_counter() - t0, a.n)

        p = Profiler(interval=0.001, async_mode="enabled")
        tasks = [VB.Noop(i=i) for i in range(a.n)]
        t0 = time.perf_counter()
        with p:
            await q.enqueue_many(tasks)
        save(p, "enqueue-many", time.perf_counter() - t0, a.n)

        total = a.n * 2 + 200
        rec = c.AsyncRecorder(server.url, total)
        w = vr.Worker(q, state=rec, concurrency=a.concurrency, handle_signals=False)
        w.register(VB.NoopJob)
        p = Profiler(interval=0.001, async_mode="enabled")
        t0 = time.perf_counter()
        with p:
            await w.run(until_idle=True)
        save(p, f"worker-c{a.concurrency}", time.perf_counter() - t0, total)
        await rec.r.aclose()
        await client.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--all", action="store_true", help="show library frames (redis-py, asyncio) too")
    args = ap.parse_args()
    SHOW_ALL = args.all
    asyncio.run(main(args))
