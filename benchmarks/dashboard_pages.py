"""Page timings of the web dashboard over a queue of 1,000,000 pending jobs (not run in CI).

    .venv/bin/python benchmarks/dashboard_pages.py [--jobs 1000000] [--runs 20]

Starts a throwaway redis-server, enqueues ``--jobs`` pending jobs on queue
``big`` (``enqueue_many`` in batches of 1,000), then serves the dashboard with
``venturi dashboard`` (uvicorn) and times, over real HTTP on loopback, each
page ``--runs`` times after a first request (shown apart: the very first
request of all reads the registry of queues, which the app then keeps 30 s): the overview
(``GET /``), the first page of pending jobs (HTML and JSON), a page
half-way through (its cursor taken from the middle of the index), and a job's
page. Prints the median and the slowest run of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

import venturi_redis as vr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from dashboard_screenshots import dashboard, redis_server


class Item(vr.Task):
    KIND: ClassVar[str] = "item"
    n: int


async def fill(url: str, jobs: int) -> tuple[str, str]:
    """Enqueue ``jobs`` pending jobs; returns (a cursor half-way, one job id)."""
    client = vr.Client.from_url(url)
    try:
        q = client.queue("big")
        started = time.perf_counter()
        for start in range(0, jobs, 1000):
            await q.enqueue_many([Item(n=i) for i in range(start, min(jobs, start + 1000))])
        took = time.perf_counter() - started
        print(f"enqueued {jobs:,} jobs in {took:.1f} s", file=sys.stderr)
        key = q.keys.pending(vr.Priority.NORMAL)
        ((mid, score),) = await client.redis.zrange(key, jobs // 2, jobs // 2, withscores=True)
        mid_id = mid.decode()
        # index 2 of the pending sources (critical, high, normal, low): see dashboard/_listing.py
        return f"2~{int(score)}~{mid_id}", mid_id
    finally:
        await client.aclose()


def timed(url: str, runs: int) -> tuple[float, float, float, int]:
    def once() -> tuple[float, int]:
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            body = r.read()
        return (time.perf_counter() - t) * 1000, len(body)

    first, _ = once()
    samples = [once() for _ in range(runs)]
    ms = [s for s, _ in samples]
    return first, statistics.median(ms), max(ms), samples[-1][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with redis_server() as url:
        cursor, job_id = asyncio.run(fill(url, args.jobs))
        with dashboard(url) as base:
            pages = [
                ("overview  GET /", "/"),
                ("overview  GET /api/queues", "/api/queues"),
                ("jobs p.1  GET /queues/big?state=pending", "/queues/big?state=pending"),
                ("jobs p.1  GET /api/queues/big/jobs?state=pending", "/api/queues/big/jobs?state=pending"),
                (
                    "jobs mid  GET /queues/big?state=pending&cursor=...",
                    "/queues/big?state=pending&cursor=" + cursor,
                ),
                ("job       GET /queues/big/jobs/{id}", f"/queues/big/jobs/{job_id}"),
            ]
            # The first request of all reads the registry of queues (kept 30 s after).
            print(f"{'page':55} {'first ms':>9} {'median ms':>10} {'max ms':>9} {'bytes':>8}")
            for name, path in pages:
                first, median, worst, size = timed(base + path, args.runs)
                print(f"{name:55} {first:9.1f} {median:10.1f} {worst:9.1f} {size:8,}")


if __name__ == "__main__":
    main()
