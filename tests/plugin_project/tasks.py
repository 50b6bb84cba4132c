"""A user's tasks, as docs/testing.md shows them: what tests/test_testing_plugin.py tests with the plugin."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

import venturi_redis as vr


class Charge(vr.Task):
    """Charge a card; the payment provider fails the first three calls."""

    KIND: ClassVar[str] = "charge"
    order_id: int


class ChargeJob(Charge, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if self.order_id < 0:
            raise vr.TaskError.permanent(f"order {self.order_id} does not exist")
        if ctx.failures < 3:  # the provider times out three times: a retryable failure
            raise vr.TaskError(f"provider timeout on order {self.order_id}")
        return vr.Outcome.completed_with(f"charged order {self.order_id}")


class Export(BaseModel):
    rows: int = 0


class Report(vr.Task[Export]):
    """A long export that checkpoints: an hour's pause between two batches."""

    KIND: ClassVar[str] = "report"
    rows: int


class ReportJob(Report, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[Export], state: None) -> vr.Outcome:
        ctx.carry.rows = min(self.rows, ctx.carry.rows + 100)
        if ctx.carry.rows < self.rows:
            return vr.Outcome.pause_in_with(3600, f"{ctx.carry.rows} rows, resuming in an hour")
        return vr.Outcome.completed(result=ctx.carry.rows)


class Refresh(vr.Task):
    """Refresh a feed; two refreshes of one feed while one waits are merged."""

    KIND: ClassVar[str] = "refresh"
    feed: str
    urls: list[str]

    def dedup_key(self) -> str | None:
        return self.feed

    def merge(self, existing: vr.Pending[Refresh, vr.NoCarry]) -> vr.Merge[Refresh, vr.NoCarry]:
        urls = sorted(set(existing.payload.urls) | set(self.urls))
        return vr.Merge.with_(Refresh(feed=self.feed, urls=urls), vr.NoCarry())


class RefreshJob(Refresh, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result=self.urls)


class Approve(vr.Task):
    """Wait for a person: the job suspends until queue.resume(job_id, value)."""

    KIND: ClassVar[str] = "approve"
    document: int

    RESUME: ClassVar[type[str]] = str  # the approver's name


class ApproveJob(Approve, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.resume_input is None:
            return vr.Outcome.suspend(note=f"document {self.document} waits for approval")
        return vr.Outcome.completed_with(f"approved by {ctx.resume_input}")
