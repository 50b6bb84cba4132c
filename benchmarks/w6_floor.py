"""W6 taken apart: what the mandated shape costs per pending job before any field.

Usage (from the repository root)::

    .venv/bin/python benchmarks/w6_floor.py [--n 10000]

Against a redis-server of its own, ``INFO memory`` used_memory over ``n``
jobs (FLUSHALL between rows), for:

1. the pending-set entry alone: one sorted set, a ULID member per job, scored
   by a millisecond time (what the per-priority sets hold);
2. that, plus a hash per job under venturi's key (``venturi:{bench}:job:<ULID>``)
   holding a single one-byte field: the shape with no fields to speak of;
3. venturi's pending job as W6 fills it (``enqueue_many`` of the benchmark's
   no-op task, payload ``{"i": i, "t": 0.0}``).

Row 2 is the floor any job in this shape pays; W6 compares row 3 with
bullmq's figure for the same payload (``benchmarks/run.py --workloads W6``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import venturi_bench as VB  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis._model.ids import new_job_id  # noqa: E402
from venturi_redis._store.keys import QueueKeys  # noqa: E402


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def per_job(r: redis.Redis, n: int, fill: object) -> float:
    r.flushall()
    time.sleep(0.2)  # let the flush's lazy frees settle
    base = used(r)
    fill()  # type: ignore[operator]
    return (used(r) - base) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000)
    a = p.parse_args()
    n = a.n
    k = QueueKeys.for_queue("bench")
    pending = k.pending(vr.Priority.NORMAL)
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        ids = [new_job_id() for _ in range(n)]
        now = int(time.time() * 1000)

        def zset_only() -> None:
            pipe = r.pipeline(transaction=False)
            for i in ids:
                pipe.zadd(pending, {i: now})
            pipe.execute()

        def zset_and_hash() -> None:
            pipe = r.pipeline(transaction=False)
            for i in ids:
                pipe.zadd(pending, {i: now})
                pipe.hset(k.job(i), "s", "p")
            pipe.execute()

        def venturi_jobs() -> None:
            async def fill() -> None:
                async with vr.Client.from_url(server.url) as client:
                    q = client.queue("bench")
                    for s in range(0, n, 1000):
                        await q.enqueue_many([VB.Noop(i=i) for i in range(s, min(s + 1000, n))])

            asyncio.run(fill())

        rows = [
            ("pending-set entry (ULID member)", per_job(r, n, zset_only)),
            ("+ a hash per job, one 1-byte field, under venturi's key", per_job(r, n, zset_and_hash)),
            ("venturi's pending job (W6's fill)", per_job(r, n, venturi_jobs)),
        ]
        jid = r.zrange(pending, 0, 0)[0].decode()
        hash_b = r.memory_usage(k.job(jid), samples=0)
        r.close()
    print(f"{n:,} jobs, redis-server {server.url}; bytes per job (INFO memory used_memory delta):\n")
    print("| what | bytes per job |\n|---|---|")
    for what, b in rows:
        print(f"| {what} | {b:,.0f} |")
    print(f"\nMEMORY USAGE of one venturi job hash with its key: {hash_b} B")


if __name__ == "__main__":
    main()
