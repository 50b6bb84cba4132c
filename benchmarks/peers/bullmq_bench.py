"""bullmq adapter (own venv: bullmq, the Python port). Library defaults except concurrency."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from bullmq import Queue, Worker


async def main(a: Any) -> None:
    if a.action == "worker":
        rec = c.AsyncRecorder(a.url, a.n)

        async def process(job: Any, token: str) -> None:
            await rec.hit(job.data.get("t", 0.0))

        await rec.mark_start(c.handler_connections(a))
        w = Worker(a.queue, process, {"connection": a.url, "concurrency": a.concurrency})
        try:
            await asyncio.Event().wait()
        finally:
            await w.close()
        return
    q = Queue(a.queue, {"connection": a.url})
    try:
        if a.action == "enqueue":

            async def single(i: int) -> None:
                await q.add("noop", {"i": i})

            async def bulk(r: range) -> None:
                await q.addBulk([{"name": "noop", "data": {"i": i}} for i in r])

            await c.time_async(a.mode, a.n, single, bulk, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 1000):
                await q.addBulk([{"name": "noop", "data": {"i": i}} for i in range(s, min(s + 1000, a.n))])
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await q.add("noop", {"i": i, "t": time.time()})
    finally:
        await q.close()


if __name__ == "__main__":
    asyncio.run(main(_a := c.parse_args()))
