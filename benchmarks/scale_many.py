"""The aggregate autoscaling route over many queues, ``GET /api/scale`` (not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale_many.py [--queues 1000] [--workers 20] [--runs 50]

Starts a throwaway redis-server, makes ``--queues`` queues ``tenant-00000``...
with a few jobs each (one to five eligible, one delayed within the minute on
every tenth queue) and registers ``--workers`` workers on all of them (their
records and registry entries written as a worker writes them), then serves
the dashboard as a user would (``venturi dashboard --read-only``, uvicorn)
and times ``GET /api/scale?prefix=tenant-`` over real HTTP on loopback
``--runs`` times, after one untimed request. Prints the median, p99 and
slowest request in milliseconds, the Redis commands and round trips of one
call (``INFO commandstats``; MULTI counts the pipelines of counts, EXISTS the
workers' records), the answer, and the same read in-process
(``Client.scale_total``, no HTTP). The target: well under a second at 1,000.
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

import redis

import venturi_redis as vr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from dashboard_screenshots import dashboard, redis_server


class Item(vr.Task):
    KIND: ClassVar[str] = "item"
    n: int


def names(n: int) -> list[str]:
    return [f"tenant-{i:05}" for i in range(n)]


async def fill(url: str, queues: int, workers: int) -> None:
    client = vr.Client.from_url(url)
    try:
        for i, name in enumerate(names(queues)):
            q = client.queue(name)
            await q.enqueue_many([Item(n=j) for j in range(1 + i % 5)])
            if i % 10 == 0:
                await q.enqueue(Item(n=-1), delay=30)
        # Workers registered on every queue, as _worker/registry.py writes them.
        expires = int(time.time() * 1000) + 3_600_000
        for chunk in range(0, queues, 200):
            pipe = client.redis.pipeline(transaction=False)
            for name in names(queues)[chunk : chunk + 200]:
                k = client.queue(name).keys
                for w in range(workers):
                    pipe.set(k.worker(f"pod-{w}"), json.dumps({"name": f"pod-{w}"}), px=3_600_000)
                    pipe.zadd(k.workers, {f"pod-{w}": expires})
            await pipe.execute()
    finally:
        await client.aclose()


async def in_process(url: str, runs: int) -> list[float]:
    client = vr.Client.from_url(url)
    try:
        await client.scale_total(prefix="tenant-")
        out = []
        for _ in range(runs):
            t = time.perf_counter()
            await client.scale_total(prefix="tenant-")
            out.append((time.perf_counter() - t) * 1000)
        return out
    finally:
        await client.aclose()


def get(url: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return (time.perf_counter() - t) * 1000, body


def commands_of_one(redis_url: str, url: str) -> dict[str, int]:
    r = redis.Redis.from_url(redis_url)
    r.config_resetstat()
    get(url)
    stats = r.info("commandstats")
    r.close()
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "resetstat" not in k}


def line(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{name:40} median {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms   max {ms[-1]:7.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1_000)
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    with redis_server() as url:
        asyncio.run(fill(url, args.queues, args.workers))
        with dashboard(url, "--read-only") as base:
            route = base + "/api/scale?prefix=tenant-"
            _, body = get(route)
            http_ms = [get(route)[0] for _ in range(args.runs)]
            calls = commands_of_one(url, route)
        local_ms = asyncio.run(in_process(url, args.runs))
    print(f"{args.queues:,} queues, {args.workers} workers on each, {args.runs} requests each")
    print(line("GET /api/scale?prefix=tenant- (HTTP)", http_ms))
    print(line("Client.scale_total (in-process)", local_ms))
    total = sum(n for k, n in calls.items() if k not in ("info",))
    multi, exists = calls.get("multi", 0), -(-calls.get("exists", 0) // 1000)
    trips = multi + calls.get("time", 0) + calls.get("zrange", 0) + exists
    print(f"one call: {total:,} Redis commands; {calls}")
    print(f"round trips: {trips} (clock, registry, {multi} MULTI, at least {exists} EXISTS pipeline(s))")
    print("answer:", json.dumps(json.loads(body)))


if __name__ == "__main__":
    main()
