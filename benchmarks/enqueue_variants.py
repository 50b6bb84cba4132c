"""Where a single enqueue's time goes: venturi as shipped vs. two variants.

Usage: ``.venv/bin/python benchmarks/enqueue_variants.py [--n 10000] [--runs 3]``

Each row is ``n`` sequential single enqueues in this process against the
script's own redis-server (median of ``runs``):

- venturi as shipped (``Client.from_url``: the enqueue lane, a connection the
  client keeps aside for the enqueue script, ``venturi_redis/_lane.py``);
- the same client with the lane switched off: redis-py's per-command path
  (pool hand-off, retry wrapper, reply callbacks), as before session 4;
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
        no_lane = vr.Client.from_url(url)
        no_lane._lane = None  # the pool path
        raw = VO.Raw(url)
        await raw.load()
        sha1 = await raw.r.script_load("return 1")
        rows = {
            "venturi Queue.enqueue, as shipped (the enqueue lane)": lambda i: shipped.queue("b").enqueue(
                VB.Noop(i=i)
            ),
            "venturi Queue.enqueue, lane off (redis-py's pool path)": lambda i: no_lane.queue("b").enqueue(
                VB.Noop(i=i)
            ),
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
        await no_lane.aclose()
        await raw.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
