"""Where a single enqueue's time goes: venturi as shipped vs. two variants.

Usage: ``.venv/bin/python benchmarks/enqueue_variants.py [--n 10000] [--runs 3]``

Each row is ``n`` sequential single enqueues in this process against the
script's own redis-server (median of ``runs``):

- venturi as shipped (``Client.from_url``: socket_timeout 5 s, the hiredis packer);
- venturi on a redis-py client without socket_timeout (redis-py then writes
  without ``asyncio.wait_for``, which creates a Task per command);
- enqueue.lua by bare EVALSHA (W8's figure), and ``EVALSHA "return 1"``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import redis.asyncio as aioredis  # noqa: E402
import venturi_bench as VB  # noqa: E402
import venturi_only as VO  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis._ids import new_job_id  # noqa: E402


async def rate(n: int, one: object) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        await one(i)  # type: ignore[operator]
    return n / (time.perf_counter() - t0)


async def main(a: argparse.Namespace) -> None:
    with RedisServer() as server:
        url = server.url
        shipped = vr.Client.from_url(url)
        bare = vr.Client(aioredis.Redis.from_url(url, decode_responses=False), url=url)
        raw = VO.Raw(url)
        await raw.load()
        sha1 = await raw.r.script_load("return 1")
        rows = {
            "venturi Queue.enqueue, as shipped (socket_timeout=5)": lambda i: shipped.queue("b").enqueue(
                VB.Noop(i=i)
            ),
            "venturi Queue.enqueue, redis-py client without socket_timeout": lambda i: bare.queue(
                "b"
            ).enqueue(VB.Noop(i=i)),
            "enqueue.lua by bare EVALSHA (ids made beforehand)": None,
            'bare EVALSHA "return 1"': lambda i: raw.r.evalsha(sha1, 0),
        }
        print(f"| {a.n:,} sequential single enqueues, median of {a.runs} | jobs/s |\n|---|---|")
        for label, fn in rows.items():
            runs = []
            for _ in range(a.runs):
                await raw.r.flushall()
                await raw.load()
                if fn is None:
                    ids = [new_job_id() for _ in range(a.n)]
                    runs.append(await rate(a.n, lambda i, ids=ids: raw.enqueue([ids[i]])))
                else:
                    runs.append(await rate(a.n, fn))
            print(f"| {label} | {statistics.median(runs):,.0f} |", flush=True)
        await shipped.aclose()
        await bare.aclose()
        await raw.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
