"""venturi_redis adapter (runs in the project's own .venv)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, ClassVar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from pydantic import BaseModel

import venturi_redis as vr


class Noop(vr.Task):
    KIND: ClassVar[str] = "noop"
    i: int = 0
    t: float = 0.0


class NoopJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], rec: Any) -> vr.Outcome:
        await rec.hit(self.t)
        return vr.Outcome.completed()


class Tries(BaseModel):
    n: int = 0


class Mixed(vr.Task[Tries]):
    """W4: ``mode`` 'ok' completes, 'retry' fails its first run, 'pause' pauses once."""

    KIND: ClassVar[str] = "mixed"
    i: int = 0
    mode: str = "ok"
    key: str = ""

    def dedup_key(self) -> str | None:
        return self.key or None

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.001, cap=0.005)


class MixedJob(Mixed, vr.Handler[c.AsyncRecorder]):
    async def handle(self, ctx: vr.Context[Tries], rec: c.AsyncRecorder) -> vr.Outcome:
        ctx.carry.n += 1
        if ctx.carry.n == 1 and self.mode == "retry":
            raise RuntimeError("first run fails")
        if ctx.carry.n == 1 and self.mode == "pause":
            return vr.Outcome.pause_in(0)
        await rec.hit()
        return vr.Outcome.completed()


async def main(a: Any) -> None:
    client = vr.Client.from_url(a.url)
    q = client.queue(a.queue)
    try:
        if a.action == "enqueue":

            async def single(i: int) -> None:
                await q.enqueue(Noop(i=i))

            async def bulk(r: range) -> None:
                await q.enqueue_many([Noop(i=i) for i in r])

            if a.mode == "single" and a.bare_evalsha != "off":
                await c.time_single_paired(a.url, a.n, single, a.bare_evalsha)
            else:
                await c.time_async(a.mode, a.n, single, bulk, a.chunk, a.bulk_size)
        elif a.action == "fill":
            for s in range(0, a.n, 1000):
                await q.enqueue_many([Noop(i=i) for i in range(s, min(s + 1000, a.n))])
        elif a.action == "latency":
            async for i in c.apaced(a.n, a.rate):
                await q.enqueue(Noop(i=i, t=time.time()))
        else:
            rec = (c.EmptyRecorder if a.handler == "empty" else c.AsyncRecorder)(a.url, a.n)
            w = vr.Worker(q, state=rec, concurrency=a.concurrency, handle_signals=True)
            w.register(NoopJob, MixedJob)
            await rec.mark_start(c.handler_connections(a))
            await w.run()
    finally:
        await client.aclose()


def blocking_enqueues(a: Any) -> None:
    """W1 through ``vr.SyncClient``: what a Django or Flask view pays per ``enqueue``."""
    with vr.SyncClient(a.url) as sc:
        q = sc.queue(a.queue)
        c.time_sync("single", a.n, lambda i: q.enqueue(Noop(i=i)), None, a.bulk_size)


if __name__ == "__main__":
    args = c.parse_args()
    if args.action == "enqueue" and args.mode == "blocking":
        blocking_enqueues(args)
    elif args.action == "worker" and args.loop == "uvloop":
        import uvloop  # the project's `uvloop` extra (installed with `dev`)

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
