"""Handlers that let a BaseException escape, and a worker for ``venturi worker`` to run them.

``python -m venturi_redis.cli worker tests.procs.escapes:make`` consumes the
queue named by ``ESCAPES_QUEUE`` on ``REDIS_URL`` (set by ``--redis``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel

import venturi_redis as vr
from tests.tasks import EchoJob


class Runs(BaseModel):
    n: int = 0


class SelfCancel(vr.Task):
    """Awaits a task it cancelled itself: CancelledError that no one asked of the worker."""

    KIND: ClassVar[str] = "self-cancel"


class SelfCancelJob(SelfCancel, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        t = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        t.cancel()
        await t
        return vr.Outcome.completed()


class Sleeper(vr.Task[Runs]):
    """Counts its runs in the carry and in ``state["sleeping"]``, then sleeps an hour (a bystander)."""

    KIND: ClassVar[str] = "sleeper"


class SleeperJob(Sleeper, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Runs], state: Any) -> vr.Outcome:
        ctx.carry.n += 1
        state.setdefault("sleeping", []).append(ctx.job_id)
        if "started" in state:
            state["started"].set()
        await anyio.sleep(3600)
        return vr.Outcome.completed()


class Bail(vr.Task):
    """Raises KeyboardInterrupt or SystemExit once ``sleepers`` Sleeper handlers run in this process."""

    KIND: ClassVar[str] = "bail"
    how: str = "exit"
    code: int | None = 0
    sleepers: int = 0


class BailJob(Bail, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        while len(state.setdefault("sleeping", [])) < self.sleepers:
            await anyio.sleep(0.01)
        if self.how == "interrupt":
            raise KeyboardInterrupt
        sys.exit(self.code)


HANDLERS = (SelfCancelJob, SleeperJob, BailJob)


def make() -> vr.Worker[Any]:
    client = vr.Client.from_url()
    queue = client.queue(os.environ["ESCAPES_QUEUE"])
    return vr.Worker(queue, state={}, poll_interval=0.2, shutdown_grace=30).register(*HANDLERS, EchoJob)
