"""``queue.wait`` (issue 30): completion, death, cancel, timeout, and the race between reading and waiting."""

from __future__ import annotations

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis._producer import events as events_mod

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["events on", "events off"])
async def equeue(queue: vr.Queue, request: pytest.FixtureRequest) -> vr.Queue:
    """The queue, with its event stream on (wait is pushed) or off (wait reads back)."""
    await queue.set_events(request.param == "events on")
    return queue


async def _wait_while_a_worker_runs(queue: vr.Queue, job_id: str, *handlers: type) -> vr.JobInfo:
    worker = make_worker(queue, *handlers)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            waiter = anyio.Event()
            result: list[vr.JobInfo] = []

            async def wait() -> None:
                result.append(await queue.wait(job_id, timeout=10))
                waiter.set()

            tg.start_soon(wait)
            await anyio.sleep(0.05)  # the waiter is waiting before the job runs
            tg.start_soon(worker.run)
            await waiter.wait()
        worker.shutdown()
    return result[0]


async def test_wait_returns_the_completed_job(equeue: vr.Queue) -> None:
    job_id = await equeue.enqueue(Echo(text="hi"))
    info = await _wait_while_a_worker_runs(equeue, job_id, EchoJob)
    assert info.id == job_id and info.state == vr.JobState.COMPLETED


async def test_wait_returns_the_dead_job(queue: vr.Queue) -> None:
    equeue = queue
    await equeue.set_events(True)
    job_id = await equeue.enqueue(Doomed())
    with anyio.fail_after(10):
        info = await _wait_while_a_worker_runs(equeue, job_id, DoomedJob)
    assert info.state == vr.JobState.DEAD and info.note == "resource gone"


async def test_wait_returns_the_cancelled_job_and_a_finished_one_at_once(queue: vr.Queue) -> None:
    equeue = queue
    await equeue.set_events(True)
    job_id = await equeue.enqueue(Echo(text="never"), delay=60)
    async with anyio.create_task_group() as tg:
        got: list[vr.JobInfo] = []

        async def wait() -> None:
            got.append(await equeue.wait(job_id, timeout=10))

        tg.start_soon(wait)
        await anyio.sleep(0.05)
        assert await equeue.cancel(job_id) == "cancelled"
    assert got[0].state == vr.JobState.CANCELLED
    with anyio.fail_after(1):  # already finished: no waiting
        assert (await equeue.wait(job_id)).state == vr.JobState.CANCELLED


async def test_wait_times_out_and_an_unknown_job_raises(queue: vr.Queue) -> None:
    equeue = queue
    await equeue.set_events(True)
    job_id = await equeue.enqueue(Echo(text="nobody runs me"))
    with pytest.raises(TimeoutError, match=job_id):
        await equeue.wait(job_id, timeout=0.3)
    with pytest.raises(vr.JobNotFound):
        await equeue.wait("01NOSUCHJOB0000000000000000", timeout=1)


@pytest.mark.parametrize("stage", ["subscribed", "read"])
async def test_a_finish_between_the_steps_is_not_missed(equeue: vr.Queue, stage: str) -> None:
    """The job completes right after wait took its position, or right after it read the job back."""
    job_id = await equeue.enqueue(Echo(text="racing"))

    async def hook(at: str) -> None:
        if at == stage:
            await drain(equeue, EchoJob)

    with anyio.fail_after(10):
        info = await events_mod.wait(equeue, job_id, 10, hook)
    assert info.state == vr.JobState.COMPLETED


def test_sync_queue_waits_too(url: str, queue_name: str) -> None:
    """SyncQueue.wait (a Django or Flask view): the same wait, blocking."""
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue_name)
        sq.set_events(True)
        job_id = sq.enqueue(Echo(text="sync"))
        with pytest.raises(TimeoutError):
            sq.wait(job_id, timeout=0.2)

        async def run_worker() -> None:  # on the SyncClient's loop thread
            await drain(sc.client.queue(queue_name), EchoJob)

        sc._call(run_worker)
        assert sq.wait(job_id, timeout=5).state == vr.JobState.COMPLETED
