"""arq adapter (own venv: arq)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker


async def noop(ctx: dict[str, Any], i: int, t: float = 0.0) -> None:
    await ctx["rec"].hit(t)


async def main(a: Any) -> None:
    settings = RedisSettings.from_dsn(a.url)
    if a.action == "worker":
        rec = c.AsyncRecorder(a.url, a.n)
        # Library defaults except concurrency (max_jobs); arq polls every poll_delay (0.5 s).
        w = Worker(functions=[noop], redis_settings=settings, max_jobs=a.concurrency, ctx={"rec": rec})
        await rec.mark_start(c.handler_connections(a))
        await w.main()
        return
    pool = await create_pool(settings)
    try:
        if a.action == "enqueue":

            async def single(i: int) -> None:
                await pool.enqueue_job("noop", i)

            await c.time_async(a.mode, a.n, single, None, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 100):
                await asyncio.gather(*(pool.enqueue_job("noop", i) for i in range(s, min(s + 100, a.n))))
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await pool.enqueue_job("noop", i, time.time())
    finally:
        await pool.aclose()


if __name__ == "__main__":
    asyncio.run(main(c.parse_args()))
