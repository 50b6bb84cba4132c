"""A worker draining no-op jobs until idle: the process ``worker_cost.py`` runs under callgrind.

Usage: python _cg_worker.py ROOT REDIS_URL CONCURRENCY [incr] [logging|logruns] (ROOT: the checkout
whose venturi_redis runs; ``incr``: the handler sends one ``INCR``, as W2's does, instead of nothing;
``logging``: logging set up as ``venturi worker`` sets it up, at INFO, to /dev/null; ``logruns``:
that and ``Worker(log_runs=True)``, one line per run).
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


def log_as_venturi_worker() -> None:
    """The root logger as ``venturi worker`` sets it up (its text lines, JobLogFilter), to /dev/null."""
    import logging
    import os

    from venturi_redis.cli.worker import _TextLogFormatter

    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
    handler.setFormatter(_TextLogFormatter())
    handler.addFilter(vr.JobLogFilter())
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)


async def drain(url: str, concurrency: int, incr: bool = False, log_runs: bool = False) -> None:
    client = vr.Client.from_url(url)
    state = redis.asyncio.Redis.from_url(url) if incr else None
    options = {"log_runs": True} if log_runs else {}  # a ROOT older than log_runs is run without
    worker = vr.Worker(
        client.queue("bench"), state=state, concurrency=concurrency, handle_signals=False, **options
    )
    worker.register(IncrJob if incr else NoopJob)
    await worker.run(until_idle=True)
    await client.aclose()
    if state is not None:
        await state.aclose()


if __name__ == "__main__":
    flags = sys.argv[4:]
    if "logging" in flags or "logruns" in flags:
        log_as_venturi_worker()
    asyncio.run(drain(sys.argv[2], int(sys.argv[3]), "incr" in flags, "logruns" in flags))
