"""A claim whose reply was lost (_worker/lost_claims.py): its jobs are released at once, uncharged.

The claim runs in Redis, then the connection fails before its reply is read.
Before, the jobs waited out their lease under a worker that did not know it
held them and were reclaimed as ``lease_expired``, each charged a failed run.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.helpers import make_worker
from tests.tasks import Echo, EchoJob
from venturi_redis._worker.lost_claims import NOTE

pytestmark = pytest.mark.anyio

LEASE = 30.0  # far beyond the test's bound: a job left to its lease fails it


@pytest.fixture
def backend() -> str:
    return "redis"  # one worker's claim loop: the real server (the release is the store's release.lua)


def losing_first_reply(worker: vr.Worker[Any], *, dispatched: bool = False) -> list[int]:
    """The runner's first claim runs, then its reply is "lost" (a ConnectionError).

    ``dispatched``: its jobs were handed to the slots before the error (the
    reply was read): nothing of it is lost then. Returns the jobs it took.
    """
    runner = worker._runners[0]
    real = runner.claim
    took: list[int] = []

    async def claim(count: int) -> tuple[int, int, list[Any]]:
        got = await real(count)
        if took:
            return got
        took.append(len(got[2]))
        if dispatched:
            runner._dispatch(got[2], got[0])
        raise RedisConnectionError("Connection closed by server (simulated: the claim ran, its reply lost)")

    runner.claim = claim  # type: ignore[method-assign]
    return took


async def run_until_completed(worker: vr.Worker[Any], queue: vr.Queue, ids: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(15):  # half the lease
            while True:
                infos = [await queue.get(i) for i in ids]
                if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
                    break
                await anyio.sleep(0.05)
        worker.shutdown()


async def test_the_jobs_of_a_claim_whose_reply_was_lost_come_back_at_once_uncharged(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="venturi_redis.worker")
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(5)])
    worker = make_worker(queue, EchoJob, lease=LEASE, concurrency=10, batch_size=10)
    took = losing_first_reply(worker)
    await run_until_completed(worker, queue, ids)
    assert took == [5]
    for job_id in ids:
        info = await queue.get(job_id)
        # The lost claim counts as a run (a claim starts one), not as a failure.
        assert info is not None and (info.failures, info.run_count) == (0, 2)
        journal = await queue.journal(job_id)
        assert [e.event for e in journal] == ["enqueued", "claimed", "released", "claimed", "completed"]
        assert journal[2].note == NOTE
    said = [r.getMessage() for r in caplog.records if "reply was lost" in r.getMessage()]
    assert said and "5 job(s) released at once" in said[0], said


async def test_a_claim_whose_reply_was_read_is_not_released(queue: vr.Queue) -> None:
    """The error came after its jobs were handed out: they run once, nothing is released."""
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    worker = make_worker(queue, EchoJob, lease=LEASE, concurrency=10, batch_size=10)
    took = losing_first_reply(worker, dispatched=True)
    await run_until_completed(worker, queue, ids)
    assert took == [3]
    for job_id in ids:
        assert [e.event for e in await queue.journal(job_id)] == ["enqueued", "claimed", "completed"]


async def test_another_workers_jobs_in_the_window_are_left_alone(
    client: vr.Client, queue: vr.Queue, queue_name: str
) -> None:
    """Claimed at the same moment by someone else (their token, their name): not ours to release."""
    (theirs,) = await queue.enqueue_many([Echo(text="theirs")])
    other = make_worker(queue, EchoJob, lease=LEASE, name="other-worker")
    await other._runners[0].claim(1)  # claimed, held: the window's neighbour
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(2)])
    worker = make_worker(queue, EchoJob, lease=LEASE, concurrency=10, batch_size=10)
    losing_first_reply(worker)
    await run_until_completed(worker, queue, ids)
    held = await queue.get(theirs)
    assert held is not None and held.state == vr.JobState.RUNNING
    assert [e.event for e in await queue.journal(theirs)] == ["enqueued", "claimed"]
