"""An approval flow with suspend and resume: a document waits for a person's decision.

Run it with ``python examples/approval.py``. It uses ``REDIS_URL`` when set,
else the embedded ``memory://`` server.

1. A producer submits two documents for approval.
2. A worker runs each job once: it records what is waiting and suspends. A
   suspended job holds no worker slot and sits in no pending set; it survives
   any number of worker restarts (here the worker simply stops between steps).
3. Later, "the approvers" (a web handler in a real app) resume each job with a
   ``Decision``. ``queue.resume`` returns 1, or 0 if the job is not waiting
   (a second click, a stale page).
4. The worker runs each job again; this time ``ctx.resume_input`` is a
   ``Decision`` (declared by ``RESUME``), and the job completes with a result.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel

import venturi_redis as vr

# ---- The task and what it waits for (producer side) ----


class Decision(BaseModel):
    approver: str
    approved: bool
    reason: str = ""


class PendingApproval(BaseModel):
    """What a suspended job shows to the outside world (``queue.get(id).output``)."""

    document_id: int
    title: str
    waiting_for: str = "a decision"


class ApproveDocument(vr.Task):
    KIND: ClassVar[str] = "approve_document"
    # The type queue.resume() values are validated into before the next run.
    RESUME: ClassVar[type[Decision]] = Decision
    document_id: int
    title: str


# ---- The execution side (worker) ----


@dataclass
class App:
    published: list[int] = field(default_factory=list)


class ApproveDocumentJob(ApproveDocument, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], app: App) -> vr.Outcome:
        decision: Decision | None = ctx.resume_input
        if decision is None:  # first run: nothing decided yet, so wait
            return vr.Outcome.suspend(
                output=PendingApproval(document_id=self.document_id, title=self.title),
                note="awaiting approval",
            )
        if decision.approved:
            app.published.append(self.document_id)
            return vr.Outcome.completed_with(f"approved by {decision.approver}", result=decision)
        return vr.Outcome.completed_with(
            f"rejected by {decision.approver}: {decision.reason}", result=decision
        )


# ---- Wiring it together ----


async def main() -> dict[str, vr.JobInfo]:
    client = vr.Client.from_url(os.environ.get("REDIS_URL") or "memory://")
    queue = client.queue(f"approvals-{uuid.uuid4().hex[:8]}")
    app = App()
    worker = vr.Worker(queue, state=app, lease=10.0, handle_signals=False)
    worker.register(ApproveDocumentJob)

    budget = await queue.enqueue(ApproveDocument(document_id=101, title="Budget 2027"))
    memo = await queue.enqueue(ApproveDocument(document_id=102, title="Offsite memo"))

    # The worker runs both; each suspends. until_idle returns: suspended jobs
    # are not work to do.
    await worker.run(until_idle=True)
    for job_id in (budget, memo):
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.SUSPENDED
        print(f"{job_id} {info.state.value:<10} output={info.output}")

    # The approvers decide (a web handler would do this on a button press).
    assert await queue.resume(budget, Decision(approver="carol", approved=True)) == 1
    assert await queue.resume(memo, Decision(approver="dan", approved=False, reason="too long")) == 1
    # A second click finds the job no longer waiting: nothing happens.
    assert await queue.resume(budget, Decision(approver="eve", approved=False)) == 0

    await worker.run(until_idle=True)  # a "restarted" worker picks the jobs up again
    results: dict[str, vr.JobInfo] = {}
    for job_id in (budget, memo):
        info = await queue.get(job_id)
        assert info is not None
        results[job_id] = info
        journal = await queue.journal(job_id)
        print(f"{job_id} {info.state.value:<10} note={info.note!r} result={info.result}")
        print("    journal: " + " -> ".join(e.event for e in journal))
    print(f"published documents: {app.published}")
    await client.aclose()
    return results


if __name__ == "__main__":
    asyncio.run(main())
