"""Task types shared by the tests."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
from pydantic import BaseModel

import venturi_redis as vr


class Counter(BaseModel):
    n: int = 0
    seen: list[str] = []


class Echo(vr.Task):
    KIND: ClassVar[str] = "echo"
    text: str


class EchoJob(Echo, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if isinstance(state, dict):
            state.setdefault("ran", []).append(self.text)
        return vr.Outcome.completed_with(self.text)


class Steps(vr.Task[Counter]):
    """Pauses until its carry reaches `steps`, then completes."""

    KIND: ClassVar[str] = "steps"
    steps: int = 3


class StepsJob(Steps, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Counter], state: Any) -> vr.Outcome:
        ctx.carry.n += 1
        ctx.set_attachment({"n": ctx.carry.n})
        if ctx.carry.n < self.steps:
            return vr.Outcome.pause_in_with(0, f"step {ctx.carry.n}")
        return vr.Outcome.completed_with("done", result={"n": ctx.carry.n})


class Flaky(vr.Task[Counter]):
    """Fails `fail_times` times (a retryable error), then completes."""

    KIND: ClassVar[str] = "flaky"
    fail_times: int = 2

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.01, cap=0.05)


class FlakyJob(Flaky, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Counter], state: Any) -> vr.Outcome:
        ctx.carry.n += 1
        if ctx.carry.n <= self.fail_times:
            ctx.set_attachment({"attempt": ctx.carry.n})
            raise RuntimeError(f"boom {ctx.carry.n}")
        return vr.Outcome.completed()


class Doomed(vr.Task):
    KIND: ClassVar[str] = "doomed"


class DoomedJob(Doomed, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        ctx.set_attachment({"status": 410})
        raise vr.TaskError.permanent("resource gone")


class Tick(vr.Task):
    """A job that takes 2 ms, for runs that keep a worker busy under load."""

    KIND: ClassVar[str] = "tick"
    n: int


class TickJob(Tick, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(0.002)
        return vr.Outcome.completed()
