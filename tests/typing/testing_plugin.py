"""A user's tests with the pytest plugin, as docs/testing.md shows them (annotated, as strict wants)."""

from datetime import datetime, timedelta
from typing import ClassVar, assert_type

import venturi_redis as vr
from venturi_redis.testing import Clock, DrainLimitError, DrainReport, drain


class App:
    pass


class Charge(vr.Task):
    KIND: ClassVar[str] = "charge"
    order_id: int


class ChargeJob(Charge, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.failures < 3:
            raise vr.TaskError(f"provider timeout on order {self.order_id}")
        return vr.Outcome.completed_with(f"charged order {self.order_id}")


class AppJob(Charge, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], app: App) -> vr.Outcome:
        return vr.Outcome.completed()


@vr.offload(queue="reports")
async def build(tenant_id: int) -> int:
    return tenant_id


async def test_a_charge_retries_then_completes(venturi_queue: vr.Queue) -> None:
    job_id = await venturi_queue.enqueue(Charge(order_id=7))
    report = await drain(venturi_queue, ChargeJob)
    assert_type(report, DrainReport)
    assert_type(report.runs, int)
    assert_type(report.advanced_ms, int)
    assert_type(report.completed, list[vr.JobInfo])
    job = report.job(job_id)
    assert_type(job, vr.JobInfo)
    assert_type(report.notes(), dict[str, str | None])
    assert (job.state.value, job.note) == ("completed", "charged order 7")


async def test_state_and_options(venturi_client: vr.Client, venturi_queue: vr.Queue) -> None:
    await drain(venturi_queue, AppJob, state=App(), max_runs=10, concurrency=2, max_failures=1)
    await drain(
        venturi_queue, ChargeJob, build, limits=[vr.Limit("charge", rate=vr.Rate(1, timedelta(minutes=1)))]
    )
    clock = Clock()
    assert_type(clock(), int)
    clock.advance(timedelta(hours=1))
    async with vr.Client.from_url("memory://", clock=clock) as client:
        await drain(client.queue("q"), ChargeJob)


async def test_the_hourly_digest_fires(venturi_clock: Clock, venturi_queue: vr.Queue) -> None:
    hourly = vr.Schedule("digest", Charge(order_id=1), every=timedelta(hours=1))
    await drain(venturi_queue, ChargeJob, schedules=[hourly])
    venturi_clock.advance(timedelta(hours=1))
    assert_type(venturi_clock.now, datetime)


async def refused(venturi_client: vr.Client, venturi_queue: vr.Queue) -> None:
    # A client's clock is any callable (or None): the fixture venturi_clock is the typed Clock.
    venturi_client.clock.advance(60)  # type: ignore[union-attr]  # pyright: ignore[reportOptionalMemberAccess, reportFunctionMemberAccess]
    # The state drain gives the handlers must be the one they take.
    await drain(venturi_queue, AppJob, state=1)  # type: ignore[misc]  # pyright: ignore[reportArgumentType]
    await drain(venturi_queue, ChargeJob, state=App())  # type: ignore[misc]  # pyright: ignore[reportArgumentType]
    await drain(venturi_queue, Charge)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await drain(venturi_queue, ChargeJob, max_runs="10")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    assert issubclass(DrainLimitError, vr.VenturiError)
