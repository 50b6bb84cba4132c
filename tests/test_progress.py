"""``ctx.report_progress`` (issue 30): written at once, fenced, rate-limited with the last value landing."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, make_worker
from venturi_redis._model.codec import pack
from venturi_redis._store import calls_obs

pytestmark = pytest.mark.anyio


class Reporter(vr.Task):
    KIND: ClassVar[str] = "reporter"
    steps: int = 100


class ReporterJob(Reporter, vr.Handler[Any]):
    # Set by the test: the handler holds its run open until then.
    go_on: ClassVar[anyio.Event | None] = None

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress({"step": 0, "of": self.steps})
        if ReporterJob.go_on is not None:
            await ReporterJob.go_on.wait()
        for i in range(1, self.steps + 1):  # a tight loop: rate-limited inside
            await ctx.report_progress({"step": i, "of": self.steps})
        return vr.Outcome.completed()


async def _progress_of(queue: vr.Queue, job_id: str) -> Any:
    info = await queue.get(job_id)
    return None if info is None else info.progress


async def test_progress_is_visible_from_another_client_while_it_runs(queue: vr.Queue, url: str) -> None:
    await queue.set_events(True)
    job_id = await queue.enqueue(Reporter(steps=50))
    ReporterJob.go_on = anyio.Event()
    other = vr.Client.from_url(url).queue(queue.name)  # another client: what a dashboard sees
    try:
        worker = make_worker(queue, ReporterJob)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                while await _progress_of(other, job_id) is None:
                    await anyio.sleep(0.02)
            assert await _progress_of(other, job_id) == {"step": 0, "of": 50}
            info = await other.get(job_id)
            assert info is not None and info.state == vr.JobState.RUNNING
            ReporterJob.go_on.set()
            with anyio.fail_after(10):
                info = await other.wait(job_id)
            worker.shutdown()
        # The tight loop's last value landed, before the completion.
        assert info.state == vr.JobState.COMPLETED and info.progress == {"step": 50, "of": 50}
        events = []
        with anyio.fail_after(5):
            async for e in other.events(since="0"):
                events.append(e)
                if e.event == "completed":
                    break
        progress = [e for e in events if e.event == "progress"]
        assert progress[0].value == {"step": 0, "of": 50} and progress[-1].value == {"step": 50, "of": 50}
        assert progress[-1].kind == Reporter.KIND and progress[-1].run == 1
        # Rate-limited: 51 reports in a tight loop are far fewer writes.
        assert len(progress) < 20
        assert [e.event for e in events][-2:] == ["progress", "completed"]
    finally:
        ReporterJob.go_on = None
        await other.client.aclose()


async def test_a_stale_token_is_refused_and_writes_nothing(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Reporter())
    ((_, token),) = claimed_jobs(await claim_raw(queue, 1))
    c = queue.client

    async def report(tok: str, value: bytes) -> bool:
        call = calls_obs.progress(queue.keys, c._now_arg(), job_id=job_id, token=tok, value=value)
        return calls_obs.progressed(await c.sender.call(call))

    assert not await report("stale.1", pack(1))
    assert await _progress_of(queue, job_id) is None
    assert await report(token, pack(7))
    assert await _progress_of(queue, job_id) == 7


async def test_a_value_that_cannot_be_encoded_raises_at_once() -> None:
    ctx: vr.Context[vr.NoCarry] = vr.Context(
        job_id="j", queue="q", kind="k", run_count=1, failures=0, history=[], carry=vr.NoCarry()
    )
    with pytest.raises(vr.PayloadError):
        await ctx.report_progress(object())
    with pytest.raises(RuntimeError, match="worker"):
        await ctx.report_progress(1)
