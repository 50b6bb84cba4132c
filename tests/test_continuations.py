"""Suspend, resume and results, on real Redis and on fakeredis."""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio


class Decision(BaseModel):
    approver: str
    verdict: Literal["approve", "reject"]


class Approval(vr.Task):
    """Suspends until a Decision arrives; completes with it."""

    KIND: ClassVar[str] = "test.approval"
    RESUME: ClassVar[type[Decision]] = Decision
    doc: str


class ApprovalJob(Approval, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if isinstance(state, dict):
            state.setdefault("inputs", []).append(ctx.resume_input)
        if ctx.resume_input is None:
            return vr.Outcome.suspend(output={"waiting_for": self.doc}, note="awaiting approval")
        decision: Decision = ctx.resume_input
        return vr.Outcome.completed_with(f"{decision.verdict} by {decision.approver}", result=decision)


class Untyped(vr.Task):
    """No RESUME: the run sees the decoded msgpack. Suspends until told 'done'."""

    KIND: ClassVar[str] = "test.untyped_resume"


class UntypedJob(Untyped, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state.setdefault("inputs", []).append(ctx.resume_input)
        if ctx.resume_input == "done":
            return vr.Outcome.completed(result={"runs": ctx.run_count})
        return vr.Outcome.suspend(output={"run": ctx.run_count})


class Gate(vr.Task):
    """Runs until the test opens the gate (state["gate"])."""

    KIND: ClassVar[str] = "test.gate"


class GateJob(Gate, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["entered"].set()
        await state["gate"].wait()
        return vr.Outcome.completed()


def worker(queue: vr.Queue, *handlers: type[Any], **options: Any) -> vr.Worker[Any]:
    options.setdefault("handle_signals", False)
    options.setdefault("poll_interval", 0.2)
    w: vr.Worker[Any] = vr.Worker(queue, **options)
    return w.register(*handlers)


async def run_until_idle(queue: vr.Queue, *handlers: type[Any], **options: Any) -> None:
    with anyio.fail_after(30):
        await worker(queue, *handlers, **options).run(until_idle=True)


async def test_suspend_frees_the_job_and_shows_its_output(client: vr.Client, queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Approval(doc="budget"))
    await run_until_idle(queue, ApprovalJob)
    info = await queue.get(job_id)
    assert info is not None
    assert info.state == vr.JobState.SUSPENDED
    assert info.output == {"waiting_for": "budget"}
    assert info.note == "awaiting approval"
    assert info.lease_owner is not None and info.lease_expires_at is None
    # in no eligibility set, holding no lease
    r = client.redis
    assert await r.zscore(queue.keys.suspended, job_id) is not None
    assert await r.zscore(queue.keys.running, job_id) is None
    for level in queue.keys.pending_high_first:
        assert await r.zscore(level, job_id) is None
    counts = await queue.counts()
    assert (counts["suspended"], counts["pending"], counts["running"]) == (1, 0, 0)
    assert await queue.is_drained()  # suspended jobs do not count
    assert [e.event for e in await queue.journal(job_id)] == ["enqueued", "claimed", "suspended"]


async def test_resume_runs_the_job_again_with_a_typed_input(queue: vr.Queue) -> None:
    state: dict[str, Any] = {}
    job_id = await queue.enqueue(Approval(doc="budget"))
    await run_until_idle(queue, ApprovalJob, state=state)
    assert await queue.resume(job_id, {"approver": "carol", "verdict": "approve"}) == 1
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.PENDING
    await run_until_idle(queue, ApprovalJob, state=state)
    # first run saw None; the resumed run saw a Decision, not a dict
    assert state["inputs"] == [None, Decision(approver="carol", verdict="approve")]
    info = await queue.get(job_id)
    assert info is not None
    assert info.state == vr.JobState.COMPLETED
    assert info.result == {"approver": "carol", "verdict": "approve"}
    assert info.note == "approve by carol"
    assert info.run_count == 2
    journal = await queue.journal(job_id)
    assert [e.event for e in journal] == [
        "enqueued",
        "claimed",
        "suspended",
        "resumed",
        "claimed",
        "completed",
    ]
    assert journal[3].attachment == {"approver": "carol", "verdict": "approve"}


async def test_resume_returns_zero_unless_the_job_is_suspended(queue: vr.Queue) -> None:
    assert await queue.resume("01J00000000000000000000000", "x") == 0  # unknown
    pending = await queue.enqueue(Echo(text="p"))
    assert await queue.resume(pending, "x") == 0  # pending
    # A run in progress: hold it open with the gate while we try to resume it.
    state: dict[str, Any] = {"entered": anyio.Event(), "gate": anyio.Event()}
    running = await queue.enqueue(Gate())
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(run_until_idle, queue, GateJob, EchoJob, state=state))
        with anyio.fail_after(10):
            await state["entered"].wait()
        assert await queue.resume(running, "x") == 0  # running
        state["gate"].set()
    for job_id in (running, pending):
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
        assert await queue.resume(job_id, "x") == 0  # completed
        # none of those refused resumes stored an input or touched the journal
        assert "resumed" not in [e.event for e in await queue.journal(job_id)]
    # A suspended job resumes once: the second call finds it pending.
    sus = await queue.enqueue(Approval(doc="x"))
    await run_until_idle(queue, ApprovalJob)
    assert await queue.resume(sus, {"approver": "a", "verdict": "reject"}) == 1
    assert await queue.resume(sus, {"approver": "b", "verdict": "approve"}) == 0
    await run_until_idle(queue, ApprovalJob)
    info = await queue.get(sus)
    assert info is not None and info.result == {"approver": "a", "verdict": "reject"}


async def test_suspend_worker_restart_resume_complete(url: str, queue_name: str) -> None:
    """Suspended jobs are durable: every worker (and client) goes away, nothing changes."""
    async with vr.Client.from_url(url) as first:
        q1 = first.queue(queue_name)
        job_id = await q1.enqueue(Approval(doc="contract"))
        await run_until_idle(q1, ApprovalJob)
    # A new process's view: a fresh client and a fresh worker.
    async with vr.Client.from_url(url) as second:
        q2 = second.queue(queue_name)
        info = await q2.get(job_id)
        assert info is not None and info.state == vr.JobState.SUSPENDED
        assert info.output == {"waiting_for": "contract"}
        # a restarted worker leaves the suspended job alone
        await run_until_idle(q2, ApprovalJob)
        info = await q2.get(job_id)
        assert info is not None and info.state == vr.JobState.SUSPENDED and info.run_count == 1
        assert await q2.resume(job_id, Decision(approver="dan", verdict="approve")) == 1
        await run_until_idle(q2, ApprovalJob)
        info = await q2.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
        assert info.result == {"approver": "dan", "verdict": "approve"}
        assert info.run_count == 2


async def test_a_suspended_job_holds_no_worker_slot(queue: vr.Queue) -> None:
    ids = [await queue.enqueue(Approval(doc=str(i))) for i in range(3)]
    echo = await queue.enqueue(Echo(text="after"))
    # one slot: three suspensions in a row, then the echo still runs
    await run_until_idle(queue, ApprovalJob, EchoJob, concurrency=1)
    states = [(await queue.get(i)) for i in [*ids, echo]]
    assert [s.state if s else None for s in states] == [vr.JobState.SUSPENDED] * 3 + [vr.JobState.COMPLETED]


async def test_untyped_resume_input_and_repeated_suspension(queue: vr.Queue) -> None:
    state: dict[str, Any] = {}
    job_id = await queue.enqueue(Untyped())
    await run_until_idle(queue, UntypedJob, state=state)
    assert await queue.resume(job_id, {"step": 1}) == 1
    await run_until_idle(queue, UntypedJob, state=state)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.SUSPENDED and info.output == {"run": 2}
    # the resume input is consumed: a second suspension waits for a new one
    await run_until_idle(queue, UntypedJob, state=state)
    assert await queue.resume(job_id, "done") == 1
    await run_until_idle(queue, UntypedJob, state=state)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED and info.result == {"runs": 3}
    assert state["inputs"] == [None, {"step": 1}, "done"]


async def test_a_resume_value_that_does_not_validate_kills_the_job(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Approval(doc="x"))
    await run_until_idle(queue, ApprovalJob)
    assert await queue.resume(job_id, {"approver": "eve", "verdict": "maybe"}) == 1
    await run_until_idle(queue, ApprovalJob)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD
    assert info.note is not None and "resume input does not validate" in info.note
    dead = (await queue.journal(job_id))[-1]
    assert (dead.event, dead.details["reason"]) == ("dead", "invalid_payload")


def test_a_resume_type_pydantic_cannot_validate_is_refused_at_register() -> None:
    class Opaque:
        pass

    class Odd(vr.Task):
        KIND: ClassVar[str] = "test.odd_resume"
        RESUME: ClassVar[type[Opaque]] = Opaque

    class OddJob(Odd, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            return vr.Outcome.completed()

    w: vr.Worker[Any] = vr.Worker(vr.Client(object()).queue("q"), handle_signals=False)
    with pytest.raises(vr.TaskDefinitionError, match=r"RESUME .*Opaque"):
        w.register(OddJob)
    assert Approval.resume_adapter() is not None and Untyped.resume_adapter() is None


class Results(vr.Task):
    KIND: ClassVar[str] = "test.results"
    how: Literal["plain", "with_note", "none"]


class ResultsJob(Results, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.how == "plain":
            return vr.Outcome.completed(result=Decision(approver="x", verdict="approve"))
        if self.how == "with_note":
            return vr.Outcome.completed_with("noted", result=[1, 2, {"k": "v"}])
        return vr.Outcome.completed()


async def test_completed_results_read_back(client: vr.Client, queue: vr.Queue) -> None:
    ids = [await queue.enqueue(Results(how=how)) for how in ("plain", "with_note", "none")]
    await run_until_idle(queue, ResultsJob)
    infos = [await queue.get(i) for i in ids]
    assert [i.result if i else "?" for i in infos] == [
        {"approver": "x", "verdict": "approve"},
        [1, 2, {"k": "v"}],
        None,
    ]
    assert [i.note if i else "?" for i in infos] == [None, "noted", None]
    # the result is msgpack in the hash, beside plain-text metadata
    raw = await client.redis.hgetall(queue.keys.job(ids[0]))
    assert raw[b"state"] == b"completed" and raw[b"result"][:1] == b"\x82"
    assert b"result" not in await client.redis.hgetall(queue.keys.job(ids[2]))
