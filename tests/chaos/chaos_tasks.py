"""Task types of the chaos runs, shared by the driver (pytest) and the worker processes.

Every handler records evidence in plain Redis keys outside the queue's
namespace (``chaos:<queue>:...``), so the driver can count what actually ran,
independently of the queue's own bookkeeping.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel

import venturi_redis as vr


@dataclass
class ChaosState:
    """What every chaos handler receives: a Redis client, the worker's name, the queue."""

    redis: Any
    name: str
    queue: str

    def started_key(self) -> str:
        return started_key(self.queue)


def started_key(queue: str) -> str:
    """A list of job ids, one RPUSH per handler start: counts real runs, duplicates included."""
    return f"chaos:{queue}:started"


class Work(vr.Task):
    """A job that takes ``ms`` milliseconds and completes."""

    KIND: ClassVar[str] = "chaos.work"
    ms: int = 20


class WorkJob(Work, vr.Handler[ChaosState]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: ChaosState) -> vr.Outcome:
        await state.redis.rpush(state.started_key(), ctx.job_id)
        await anyio.sleep(self.ms / 1000)
        return vr.Outcome.completed()


class Owner(BaseModel):
    owner: str = ""
    runs: list[str] = []


class Stale(vr.Task[Owner]):
    """Its first run holds the job until the driver sets :func:`gate_key`; later runs finish at once."""

    KIND: ClassVar[str] = "chaos.stale"


def gate_key(queue: str) -> str:
    return f"chaos:{queue}:gate"


class StaleJob(Stale, vr.Handler[ChaosState]):
    async def handle(self, ctx: vr.Context[Owner], state: ChaosState) -> vr.Outcome:
        await state.redis.rpush(state.started_key(), f"{ctx.job_id} {state.name}")
        ctx.carry.owner = state.name
        ctx.carry.runs.append(state.name)
        if ctx.run_count == 1:
            # Deliberately deaf to ctx.cancelled(): the point is a worker that
            # comes back from the dead and still tries to report its outcome.
            while not await state.redis.exists(gate_key(state.queue)):
                await anyio.sleep(0.02)
        return vr.Outcome.completed_with(f"finished by {state.name}", result=state.name)


class Poison(vr.Task):
    """Kills the worker process that runs it, every time."""

    KIND: ClassVar[str] = "chaos.poison"


class PoisonJob(Poison, vr.Handler[ChaosState]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: ChaosState) -> vr.Outcome:
        await state.redis.rpush(state.started_key(), ctx.job_id)
        os._exit(17)


class Blocker(vr.Task):
    """Its first run blocks for ``seconds``: the event loop itself (``time.sleep``),
    or a worker thread (``anyio.to_thread.run_sync``, the remedy)."""

    KIND: ClassVar[str] = "chaos.blocker"
    seconds: float
    in_thread: bool = False


class BlockerJob(Blocker, vr.Handler[ChaosState]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: ChaosState) -> vr.Outcome:
        await state.redis.rpush(state.started_key(), ctx.job_id)
        if ctx.run_count == 1:
            if self.in_thread:
                await anyio.to_thread.run_sync(time.sleep, self.seconds)
            else:
                time.sleep(self.seconds)  # blocking the loop is the point
        return vr.Outcome.completed()


class Ordered(vr.Task):
    """The ``seq``-th job enqueued under order key ``key`` (tests/chaos/test_ordering_kills.py)."""

    KIND: ClassVar[str] = "chaos.ordered"
    key: str
    seq: int
    ms: int = 2

    def order_key(self) -> str | None:
        return self.key


def inflight_key(queue: str) -> str:
    """A hash, order key -> the job id whose handler is running it now."""
    return f"chaos:{queue}:inflight"


def overlaps_key(queue: str) -> str:
    """A list: one entry per handler start that found another job of its key running."""
    return f"chaos:{queue}:overlaps"


class OrderedJob(Ordered, vr.Handler[ChaosState]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: ChaosState) -> vr.Outcome:
        r, q = state.redis, state.queue
        # Its own id left there is a run of this job killed mid-way: not an overlap.
        if not await r.hsetnx(inflight_key(q), self.key, ctx.job_id):
            other = await r.hget(inflight_key(q), self.key)
            if other is not None and other.decode() != ctx.job_id:
                await r.rpush(overlaps_key(q), f"{self.key} {self.seq} {ctx.job_id} {other.decode()}")
            await r.hset(inflight_key(q), self.key, ctx.job_id)
        await r.rpush(state.started_key(), f"{self.key} {self.seq} {ctx.job_id}")
        await anyio.sleep(self.ms / 1000)
        await r.hdel(inflight_key(q), self.key)
        return vr.Outcome.completed()


HANDLERS: tuple[type[Any], ...] = (WorkJob, StaleJob, PoisonJob, BlockerJob, OrderedJob)
