"""The worker side as README.md, docs/design.md and docs/semantics.md show it.

A handler is a task class mixed with ``vr.Handler[State]``: ``self`` is the
task, ``ctx.carry`` the carry model declared on ``vr.Context[...]``, the
second parameter the worker's state.
"""

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, assert_type

from pydantic import BaseModel

import venturi_redis as vr


@dataclass
class App:
    sent: list[str] = field(default_factory=list)


class Export(BaseModel):
    rows: int = 0


class Report(vr.Task[Export]):
    KIND: ClassVar[str] = "report"
    rows: int


class ReportJob(Report, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[Export], app: App) -> vr.Outcome:
        assert_type(self.rows, int)
        assert_type(ctx.carry, Export)
        assert_type(ctx.carry.rows, int)
        assert_type(ctx.job_id, str)
        assert_type(ctx.run_count, int)
        assert_type(ctx.failures, int)
        assert_type(ctx.history, Sequence[vr.JournalEntry])
        assert_type(ctx.is_cancelled(), bool)
        assert_type(ctx.cancel_reason, str | None)
        assert_type(await ctx.dependency_results(), dict[str, Any])
        await ctx.report_progress({"rows": ctx.carry.rows})
        ctx.carry.rows = min(self.rows, ctx.carry.rows + 100)
        if ctx.carry.rows < self.rows:
            return vr.Outcome.pause_in_with(3600, f"{ctx.carry.rows} rows")
        return vr.Outcome.completed(result=ctx.carry.rows)


class Ping(vr.Task):
    KIND: ClassVar[str] = "ping"


class PingJob(Ping, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        assert_type(ctx.carry, vr.NoCarry)
        return vr.Outcome.suspend(output={"waiting_for": "approval"}, note="awaiting approval")


class Resize(vr.Task):
    KIND: ClassVar[str] = "resize"
    path: str


class ResizeJob(Resize, vr.Handler[App]):
    """A plain ``def handle``: it runs in a worker thread (docs/design.md)."""

    def handle(self, ctx: vr.Context[vr.NoCarry], app: App) -> vr.Outcome:
        if ctx.is_cancelled():
            return vr.Outcome.pause_in(0)
        ctx.from_thread(ctx.report_progress, {"done": 1})
        assert_type(ctx.from_thread(ctx.dependency_results), dict[str, Any])
        app.sent.append(self.path)
        return vr.Outcome.completed()


class Mail(vr.Task):
    KIND: ClassVar[str] = "mail"
    to: str


class SendMails(Mail, vr.BatchHandler[App]):
    BATCH_SIZE: ClassVar[int] = 100
    BATCH_WAIT: ClassVar[float] = 0.5

    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Mail]], app: App
    ) -> Sequence[vr.Outcome | BaseException] | None:
        for item in items:
            assert_type(item.task, Mail)
            assert_type(item.ctx, vr.Context[Any])
            app.sent.append(item.task.to)
        return [
            vr.TaskError.permanent("no such mailbox") if i.task.to.endswith("@x") else vr.Outcome.completed()
            for i in items
        ]


@contextlib.asynccontextmanager
async def app_state() -> AsyncGenerator[App]:
    yield App()


async def workers(client: vr.Client) -> None:
    queue = client.queue("reports")
    worker = vr.Worker(queue, state=App())
    assert_type(worker, vr.Worker[App])
    worker.register(ReportJob, ResizeJob, SendMails)
    assert_type(worker.state, App)

    from_lifespan = vr.Worker(queue, lifespan=app_state)
    assert_type(from_lifespan, vr.Worker[App])
    from_lifespan.register(ReportJob)

    stateless = vr.Worker([queue, client.queue("default")], concurrency=8, handle_signals=False)
    assert_type(stateless, vr.Worker[None])
    assert_type(stateless.register(PingJob), vr.Worker[None])
    by_name = vr.Worker(["reports", "default"], client=client)
    assert_type(by_name, vr.Worker[None])
    vr.Worker(
        queue,
        max_failures=3,
        backoff=vr.Backoff.fibonacci(base=5, cap=60),
        retention=vr.Retention(completed=3600, dead=None, max_dead=None),
        limits=[vr.Limit("mail", concurrency=20, rate=vr.Rate(100, 1))],
        schedules=[vr.Schedule("pulse", Ping(), every=60)],
        observer=vr.PrometheusMetrics(),
    )
    worker.shutdown()
    await worker.run(until_idle=True)


def make_worker() -> vr.Worker:
    """``venturi worker myapp:make_worker``: a bare ``vr.Worker`` is one without state."""
    client = vr.Client.from_url()
    return vr.Worker(client.queue("billing")).register(PingJob)


def make_app_worker() -> vr.Worker[App]:
    return vr.Worker(vr.Client.from_url().queue("billing"), state=App()).register(ReportJob)


# -- what a checker must refuse ------------------------------------------------


class WrongReturn(Ping, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> str:  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        return "done"


class WrongState(Ping, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], app: int) -> vr.Outcome:  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        return vr.Outcome.completed()


def wrong_outcomes(ctx: vr.Context[Export]) -> None:
    vr.Outcome.pause_in("soon")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    vr.Outcome.completed("done")  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    ctx.carry.pages = 3  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
    ctx.carry = vr.NoCarry()  # type: ignore[assignment]  # pyright: ignore[reportAttributeAccessIssue]


class SubApp(App):
    pass


def registering(client: vr.Client) -> None:
    queue = client.queue("reports")
    # A handler of App runs on a worker whose state is a subclass of App.
    vr.Worker(queue, state=SubApp()).register(ReportJob, SendMails)
    # A handler of another state, or a task that is no handler, is refused.
    vr.Worker(queue).register(ReportJob)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    vr.Worker(queue, state=App()).register(PingJob)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    vr.Worker(queue).register(Ping)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


class WrongBatchState(Mail, vr.BatchHandler[App]):
    @classmethod
    async def handle_batch(  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        cls, items: Sequence[vr.BatchItem[Mail]], app: int
    ) -> Sequence[vr.Outcome | BaseException] | None:
        return None


class WrongBatchReturn(Mail, vr.BatchHandler[App]):
    @classmethod
    async def handle_batch(  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        cls, items: Sequence[vr.BatchItem[Mail]], app: App
    ) -> list[str]:
        return []
