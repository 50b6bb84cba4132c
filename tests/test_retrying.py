"""Failing jobs, visible as such: ``retrying`` and ``delayed`` in ``counts()``, and the
listings ``retrying``, ``delayed`` and ``limited`` (issue 39, item 3).

A job whose run failed waits for its retry in the ``retrying`` index
(docs/redis-layout.md), which ``retry.lua`` and ``reclaim.lua`` write and
the claim of a job with failures, a cancel, an operator's retry and a purge
leave. Time is a test clock: a backoff is waited out by moving it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.tasks import Echo, EchoJob
from venturi_redis._store import calls
from venturi_redis.testing import Clock

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("backend", ["redis", "memory"])]


class Charge(vr.Task):
    KIND: ClassVar[str] = "retrying-charge"
    order: int

    def backoff(self) -> vr.Backoff | None:
        # The third retry waits an hour of the test clock (the first two wait 0 s).
        return vr.Backoff.fibonacci(base=3600, cap=3600)


class FailingCharge(Charge, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise ConnectionError(f"provider down for order {self.order}")


class WorkingCharge(Charge, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


@pytest.fixture
async def clocked(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url, clock=Clock())
    try:
        yield c
    finally:
        await c.aclose()


def worker(queue: vr.Queue, handler: type[Any]) -> vr.Worker[None]:
    return vr.Worker(queue, handle_signals=False, check_eviction_policy=False, retention=None).register(
        handler
    )


async def fail_three_times(queue: vr.Queue, job_ids: list[str]) -> None:
    """Run the failing handler until each job has failed three times (its retry an hour away)."""
    w = worker(queue, FailingCharge)
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.run)
        with anyio.fail_after(30):
            for job_id in job_ids:
                while (info := await queue.get(job_id)) is None or info.failures < 3:
                    await anyio.sleep(0.01)
        w.shutdown()


async def test_a_failing_job_is_counted_and_listed_as_retrying(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    failing = await queue.enqueue(Charge(order=1))
    later = await queue.enqueue(Echo(text="tomorrow"), delay=86_400)
    await fail_three_times(queue, [failing])

    counts = await queue.counts()
    assert (counts["retrying"], counts["delayed"], counts["pending"]) == (1, 2, 2)
    assert [j.id for j in await queue.list_jobs(state="retrying")] == [failing]
    retrying = (await queue.list_jobs(state="retrying"))[0]
    assert (retrying.state, retrying.failures, retrying.note) == (
        vr.JobState.PENDING,
        3,
        "provider down for order 1",
    )
    assert sorted(j.id for j in await queue.list_jobs(state="delayed")) == sorted([failing, later])
    stats = await queue.stats()
    assert (stats.retrying, stats.delayed) == (1, 2)

    # Due again, it is claimed and completes: it leaves the index (claim.lua).
    assert isinstance(clocked.clock, Clock)
    clocked.clock.advance(3600)
    w = worker(queue, WorkingCharge)
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.run)
        with anyio.fail_after(30):
            while (info := await queue.get(failing)) is None or info.state is not vr.JobState.COMPLETED:
                await anyio.sleep(0.01)
        w.shutdown()
    counts = await queue.counts()
    assert (counts["retrying"], counts["delayed"], counts["completed"]) == (0, 1, 1)
    assert await queue.list_jobs(state="retrying") == []


async def test_a_cancelled_retrying_job_leaves_the_index(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    ids = [await queue.enqueue(Charge(order=n)) for n in (1, 2)]
    await fail_three_times(queue, ids)
    assert (await queue.counts())["retrying"] == 2

    assert await queue.cancel(ids[0]) == "cancelled"
    assert (await queue.counts())["retrying"] == 1
    assert [j.id for j in await queue.list_jobs(state="retrying")] == [ids[1]]


async def test_a_lease_expiry_is_a_failed_run_waiting_for_its_retry(
    clocked: vr.Client, queue_name: str
) -> None:
    queue = clocked.queue(queue_name)
    job_id = await queue.enqueue(Echo(text="x"))
    now = queue.client._now_arg()
    claim = calls.claim(queue.keys, now, count=1, worker="gone", token_base="t", default_lease_ms=1000)
    await clocked.sender.call(claim)  # a worker that dies with the job
    assert isinstance(clocked.clock, Clock)
    clocked.clock.advance(2)
    reclaim = calls.reclaim(queue.keys, queue.client._now_arg(), batch=10, max_failures="none")
    await clocked.sender.call(reclaim)
    assert (await queue.counts())["retrying"] == 1
    info = (await queue.list_jobs(state="retrying"))[0]
    assert (info.id, info.note) == (job_id, "lease expired")

    await worker(queue, EchoJob).run(until_idle=True)
    assert (await queue.counts())["retrying"] == 0


async def test_delayed_and_limited_jobs_are_listed_apart(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    now = await queue.enqueue(Echo(text="now"))
    later = await queue.enqueue(Echo(text="later"), delay=3600)
    await queue.set_limit("echo", concurrency=1)
    # The claim parks a job of a limited kind: hold one run so the other waits.
    claim = calls.claim(queue.keys, "", count=2, worker="w", token_base="t", default_lease_ms=60_000)
    await client.sender.call(claim)
    parked = await queue.enqueue(Echo(text="parked"))
    await client.sender.call(claim)  # parks it: the cap of 1 is taken

    assert [j.id for j in await queue.list_jobs(state="delayed")] == [later]
    assert [j.id for j in await queue.list_jobs(state="limited")] == [parked]
    counts = await queue.counts()
    assert (counts["delayed"], counts["limited"], counts["running"]) == (1, 1, 1)
    assert [j.id for j in await queue.list_jobs(state="running")] == [now]
    with pytest.raises(vr.ConfigurationError, match=r"unknown state 'failing'.*retrying, delayed, limited"):
        await queue.list_jobs(state="failing")
    await queue.clear_limit("echo")


async def test_one_failed_run_is_one_failed_run(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    job_id = await queue.enqueue(Charge(order=9), max_failures=1)
    await worker(queue, FailingCharge).run(until_idle=True)
    dead = [e for e in await queue.journal(job_id) if e.event == "dead"]
    assert dead[0].note == "retry backstop: 1 failed run (max_failures=1)"
