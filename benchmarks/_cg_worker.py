"""A worker draining no-op jobs until idle: the process ``worker_cost.py`` runs under callgrind.

Usage: python _cg_worker.py ROOT REDIS_URL CONCURRENCY [incr] (ROOT: the checkout whose venturi_redis
runs; ``incr``: the handler sends one ``INCR``, as W2's does, instead of nothing).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])

import redis.asyncio

import venturi_redis as vr


class Noop(vr.Task):
    KIND: ClassVar[str] = "noop"
    i: int = 0


class NoopJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class IncrJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await state.incr("bench:count")  # W2's handler: one redis-py command
        return vr.Outcome.completed()


async def drain(url: str, concurrency: int, incr: bool = False) -> None:
    client = vr.Client.from_url(url)
    state = redis.asyncio.Redis.from_url(url) if incr else None
    worker = vr.Worker(client.queue("bench"), state=state, concurrency=concurrency, handle_signals=False)
    worker.register(IncrJob if incr else NoopJob)
    await worker.run(until_idle=True)
    await client.aclose()
    if state is not None:
        await state.aclose()


if __name__ == "__main__":
    asyncio.run(drain(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["incr"]))
