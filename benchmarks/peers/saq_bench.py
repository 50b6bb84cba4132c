"""SAQ adapter (own venv: saq[hiredis])."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from saq import Queue, Worker

REC: c.AsyncRecorder | None = None


async def noop(ctx: dict[str, Any], *, i: int, t: float = 0.0) -> None:
    assert REC is not None
    await REC.hit(t)


async def main(a: Any) -> None:
    global REC
    q = Queue.from_url(a.url, name=a.queue)
    await q.connect()
    try:
        if a.action == "worker":
            REC = c.AsyncRecorder(a.url, a.n)
            w = Worker(q, functions=[noop], concurrency=a.concurrency)
            await REC.mark_start(c.handler_connections(a))
            await w.start()
        elif a.action == "enqueue":

            async def single(i: int) -> None:
                await q.enqueue("noop", i=i)

            # saq's Queue.map/batch enqueue and then wait for the results: not a bulk enqueue.
            await c.time_async(a.mode, a.n, single, None, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 100):
                await asyncio.gather(*(q.enqueue("noop", i=i) for i in range(s, min(s + 100, a.n))))
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await q.enqueue("noop", i=i, t=time.time())
    finally:
        await q.disconnect()


if __name__ == "__main__":
    asyncio.run(main(c.parse_args()))
