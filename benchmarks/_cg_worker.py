"""A worker draining no-op jobs until idle: the process ``worker_cost.py`` runs under callgrind.

Usage: python _cg_worker.py ROOT REDIS_URL CONCURRENCY (ROOT: the checkout whose venturi_redis runs).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])

import venturi_redis as vr


class Noop(vr.Task):
    KIND: ClassVar[str] = "noop"
    i: int = 0


class NoopJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def drain(url: str, concurrency: int) -> None:
    client = vr.Client.from_url(url)
    worker = vr.Worker(client.queue("bench"), concurrency=concurrency, handle_signals=False)
    worker.register(NoopJob)
    await worker.run(until_idle=True)
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(drain(sys.argv[2], int(sys.argv[3])))
