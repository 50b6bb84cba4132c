"""streaq adapter (own venv: streaq, plus redis-py for the shared counter)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from streaq import Worker

_a = c.parse_args()
worker = Worker(redis_url=_a.url, queue_name=_a.queue, concurrency=_a.concurrency)
REC: c.AsyncRecorder | None = None


@worker.task()
async def noop(i: int, t: float = 0.0) -> None:
    assert REC is not None
    await REC.hit(t)


async def main(a: Any) -> None:
    global REC
    if a.action == "worker":
        REC = c.AsyncRecorder(a.url, a.n)
        await REC.mark_start(c.handler_connections(a))
        await worker.run_async()
        return
    async with worker:
        if a.action == "enqueue":

            async def single(i: int) -> None:
                await noop.enqueue(i)

            async def bulk(r: range) -> None:
                await worker.enqueue_many([noop.enqueue(i) for i in r])

            await c.time_async(a.mode, a.n, single, bulk, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 1000):
                await worker.enqueue_many([noop.enqueue(i) for i in range(s, min(s + 1000, a.n))])
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await noop.enqueue(i, time.time())


if __name__ == "__main__":
    asyncio.run(main(_a))
