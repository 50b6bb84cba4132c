"""The autoscaling route's latency over a queue of 1,000,000 pending jobs (issue 41; not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale_route.py [--jobs 1000000] [--runs 200]

Starts a throwaway redis-server and enqueues ``--jobs`` jobs on queue ``big``
with the batch API (``enqueue_many``, 1,000 per call, a tenth of them delayed
by 30 s so ``due_soon`` counts something), then serves the dashboard as a
user would (``venturi dashboard --read-only``, uvicorn) and times
``GET /api/queues/big/scale`` over real HTTP on loopback ``--runs`` times,
after one untimed request. Prints the median, p99 and slowest request in
milliseconds, the answer, and the same read in-process (the producer's
``scale_signal``, no HTTP) for comparison. The target: within 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

import venturi_redis as vr
from venturi_redis._producer.scale import scale_signal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from dashboard_screenshots import dashboard, redis_server


class Item(vr.Task):
    KIND: ClassVar[str] = "item"
    n: int


async def fill(url: str, jobs: int) -> None:
    client = vr.Client.from_url(url)
    try:
        q = client.queue("big")
        started = time.perf_counter()
        for start in range(0, jobs, 1000):
            batch = [Item(n=i) for i in range(start, min(jobs, start + 1000))]
            await q.enqueue_many(batch, delay=30 if start % 10_000 == 0 else 0)
        took = time.perf_counter() - started
        print(f"enqueued {jobs:,} jobs in {took:.1f} s ({jobs / took:,.0f}/s)", file=sys.stderr)
    finally:
        await client.aclose()


async def in_process(url: str, runs: int) -> list[float]:
    client = vr.Client.from_url(url)
    try:
        q = client.queue("big")
        await scale_signal(q)
        out = []
        for _ in range(runs):
            t = time.perf_counter()
            await scale_signal(q)
            out.append((time.perf_counter() - t) * 1000)
        return out
    finally:
        await client.aclose()


def over_http(url: str, runs: int) -> tuple[list[float], bytes]:
    def once() -> tuple[float, bytes]:
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read()
        return (time.perf_counter() - t) * 1000, body

    _, body = once()
    samples = [once() for _ in range(runs)]
    return [ms for ms, _ in samples], body


def line(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{name:34} median {statistics.median(ms):6.2f} ms   p99 {p99:6.2f} ms   max {ms[-1]:6.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    with redis_server() as url:
        asyncio.run(fill(url, args.jobs))
        with dashboard(url, "--read-only") as base:
            http_ms, body = over_http(base + "/api/queues/big/scale", args.runs)
        local_ms = asyncio.run(in_process(url, args.runs))
    print(f"{args.jobs:,} jobs pending, {args.runs} requests each")
    print(line("GET /api/queues/big/scale (HTTP)", http_ms))
    print(line("scale_signal (in-process)", local_ms))
    print("answer:", json.dumps(json.loads(body)))


if __name__ == "__main__":
    main()
