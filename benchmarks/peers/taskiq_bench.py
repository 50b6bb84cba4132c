"""taskiq adapter (own venv: taskiq + taskiq-redis), RedisStreamBroker (acknowledged delivery)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from taskiq.receiver import Receiver
from taskiq_redis import RedisStreamBroker

_a = c.parse_args()
broker = RedisStreamBroker(_a.url, queue_name=_a.queue)
REC: c.AsyncRecorder | None = None


@broker.task(task_name="noop")
async def noop(i: int, t: float = 0.0) -> None:
    assert REC is not None
    await REC.hit(t)


async def main(a: Any) -> None:
    global REC
    if a.action == "worker":
        REC = c.AsyncRecorder(a.url, a.n)
        broker.is_worker_process = True
        await broker.startup()
        receiver = Receiver(broker, max_async_tasks=a.concurrency, run_startup=False)
        await REC.mark_start(c.handler_connections(a))
        await receiver.listen(asyncio.Event())
        return
    await broker.startup()
    try:
        if a.action == "enqueue":

            async def single(i: int) -> None:
                await noop.kiq(i)

            await c.time_async(a.mode, a.n, single, None, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 100):
                await asyncio.gather(*(noop.kiq(i) for i in range(s, min(s + 100, a.n))))
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await noop.kiq(i, time.time())
    finally:
        await broker.shutdown()


if __name__ == "__main__":
    asyncio.run(main(_a))
