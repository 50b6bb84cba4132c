"""In-process drain, for A/B runs: jobs/s and worker CPU per job, asyncio or uvloop.

Usage (from the repository root, against a Redis of your own; it is flushed)::

    .venv/bin/python benchmarks/drain_loop.py redis://127.0.0.1:7101/0 20000 incr asyncio
    .venv/bin/python benchmarks/drain_loop.py redis://127.0.0.1:7101/0 20000 empty uvloop

Alternate the variants in pairs (the machine's speed drifts within minutes).
With ``PYTHONPATH=<another checkout>`` the same file measures that checkout.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any, ClassVar

import redis.asyncio as aioredis

import venturi_redis as vr


class Noop(vr.Task):
    KIND: ClassVar[str] = "noop"
    i: int


class NoopJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], rec: Any) -> vr.Outcome:
        if rec is not None:
            await rec.incr("bench:count")  # the benchmark's handler (W2)
        return vr.Outcome.completed()


async def main(url: str, n: int, incr: bool) -> dict[str, float]:
    r = aioredis.Redis.from_url(url)
    await r.flushall()
    q = vr.Client.from_url(url).queue("ab")
    await q.enqueue_many([Noop(i=i) for i in range(n)])
    rec = aioredis.Redis.from_url(url) if incr else None
    w = vr.Worker(q, state=rec, concurrency=100)
    w.register(NoopJob)
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await w.run(until_idle=True)
    t, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    return {"jobs_s": round(n / t, 1), "cpu_us_per_job": round(cpu / n * 1e6, 1)}


if __name__ == "__main__":
    url, n, handler, loop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    coro = main(url, n, handler == "incr")
    if loop == "uvloop":
        import uvloop

        res = uvloop.run(coro)
    else:
        res = asyncio.run(coro)
    print(handler, loop, json.dumps(res))
