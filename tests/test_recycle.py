"""Recycling: ``Worker(max_runs=..., max_memory_mib=...)``, ``venturi worker --max-runs`` (recycle.py).

A worker that reaches a bound claims no more, lets its running jobs finish
(no grace, nothing released), and ``run()`` returns by itself; under
``--processes`` a fresh child starts at once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.procs.pworker import Stamp, StampJob
from tests.servers import RedisServer
from venturi_redis._worker.recycle import resident_mib

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def backend() -> str:
    return "redis"  # a worker's own bounds: the real server only


class Asked(vr.Task):
    KIND: ClassVar[str] = "recycle.asked"


class AskedJob(Asked, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        await anyio.sleep(0.05)
        return vr.Outcome.completed(result=ctx.is_cancelled())


async def states(queue: vr.Queue, ids: list[str]) -> list[vr.JobState]:
    infos = [await queue.get(i) for i in ids]
    return [i.state for i in infos if i is not None]


async def test_max_runs_claims_exactly_that_many_and_run_returns_by_itself(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Stamp() for _ in range(10)])
    worker = make_worker(queue, StampJob, max_runs=3, concurrency=4)
    with anyio.fail_after(20):
        await worker.run()  # no shutdown(), no until_idle: it stops by itself
    got = await states(queue, ids)
    assert got.count(vr.JobState.COMPLETED) == 3 and got.count(vr.JobState.PENDING) == 7, got
    for job_id in ids:
        assert "released" not in [e.event for e in await queue.journal(job_id)]


async def test_max_runs_is_one_budget_across_the_workers_queues(client: vr.Client, queue_name: str) -> None:
    queues = [client.queue(f"{queue_name}-{i}") for i in range(2)]
    ids = [i for q in queues for i in await q.enqueue_many([Stamp() for _ in range(10)])]
    worker = make_worker(queues, StampJob, max_runs=5, concurrency=3, batch_size=3)
    with anyio.fail_after(20):
        await worker.run()
    done = [s for q in queues for s in await states(q, ids)]
    assert done.count(vr.JobState.COMPLETED) == 5, done


async def test_running_jobs_finish_past_the_grace_and_nothing_is_released(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="venturi_redis.worker")
    ids = await queue.enqueue_many([Stamp(seconds=1.0) for _ in range(2)] + [Stamp() for _ in range(3)])
    # Both naps claimed at once (batch 2), well past the 0.1 s grace a SIGTERM would give them.
    worker = make_worker(queue, StampJob, max_runs=2, concurrency=2, batch_size=2, shutdown_grace=0.1)
    with anyio.fail_after(20):
        await worker.run()
    assert (await states(queue, ids))[:2] == [vr.JobState.COMPLETED] * 2
    said = [r.getMessage() for r in caplog.records if "started afresh" in r.getMessage()]
    assert len(said) == 1 and "max_runs=2" in said[0] and "2 running job(s) finish first" in said[0], said


async def test_a_shutdown_during_the_recycle_drain_brings_the_grace_back(queue: vr.Queue) -> None:
    (job_id,) = await queue.enqueue_many([Stamp(seconds=60)])
    worker = make_worker(queue, StampJob, max_runs=1, shutdown_grace=0.2)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            while worker.recycling is None or not worker.stopping:
                await anyio.sleep(0.02)
            await anyio.sleep(0.5)  # draining, with no grace: the 60 s nap runs on
            assert worker.running
            worker.shutdown()  # SIGTERM: the grace (0.2 s) from now, then the job is released
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.PENDING
    assert (await queue.journal(job_id))[-1].event == "released"


async def test_max_memory_mib_stops_the_worker_above_it(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="venturi_redis.worker")
    assert resident_mib() > 1  # this process: tens of MiB, read from /proc/self/statm
    await queue.enqueue(Stamp())
    worker = make_worker(queue, StampJob, max_memory_mib=1)
    with anyio.fail_after(20):
        await worker.run()
    said = [r.getMessage() for r in caplog.records if "started afresh" in r.getMessage()]
    assert len(said) == 1 and "above max_memory_mib=1" in said[0], said


def _env(server: RedisServer, name: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}


def test_the_cli_exits_0_after_max_runs(redis_server: RedisServer) -> None:
    name = f"recycle-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as client:
        q = client.queue(name)
        ids = [q.enqueue(Stamp()) for _ in range(4)]
        cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.pworker:make_worker"]
        done = subprocess.run(
            [*cmd, "--max-runs", "2", "--concurrency", "1"],
            cwd=ROOT,
            env=_env(redis_server, name),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "claimed 2 runs (max_runs=2)" in done.stderr
        infos = [q.get(i) for i in ids]
        assert [i.state for i in infos if i is not None].count(vr.JobState.COMPLETED) == 2


def test_processes_start_a_fresh_child_for_each_recycled_one(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = f"recycle-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "supervisor.log"
    cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.pworker:make_worker"]
    with vr.SyncClient(redis_server.url) as client:
        q = client.queue(name)
        ids = [q.enqueue(Stamp()) for _ in range(6)]
        with log.open("wb") as out:
            sup = subprocess.Popen(
                [*cmd, "--processes", "2", "--max-runs", "2", "--concurrency", "1"],
                cwd=ROOT,
                env=_env(redis_server, name),
                stdout=out,
                stderr=out,
            )
        try:
            deadline = time.monotonic() + 90
            while True:
                infos = [q.get(i) for i in ids]
                if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
                    break
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            sup.send_signal(signal.SIGTERM)
            assert sup.wait(timeout=60) == 0, log.read_text()
        finally:
            sup.kill()
            sup.wait()
    ran = [i.result for i in infos if i is not None]
    # No child ran more than its two; so at least three children ran the six.
    assert max(ran.count(pid) for pid in ran) <= 2 and len(set(ran)) >= 3, ran
    text = log.read_text()
    assert text.count("recycled itself; starting a fresh one") >= 1, text
    assert "restarting in" not in text  # no death, no backoff


async def test_the_runs_of_the_last_claim_are_not_asked_to_stop(queue: vr.Queue) -> None:
    """The claim that uses the budget up starts the recycle before its jobs start: they run as usual."""
    ids = await queue.enqueue_many([Asked() for _ in range(3)])
    worker = make_worker(queue, AskedJob, max_runs=2, concurrency=1, batch_size=2)
    with anyio.fail_after(20):
        await worker.run()
    infos = [await queue.get(i) for i in ids[:2]]
    assert [(i.state, i.result) for i in infos if i is not None] == [(vr.JobState.COMPLETED, False)] * 2
