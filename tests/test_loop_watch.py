"""The blocked-loop watch (``Worker(blocked_loop_warning=...)``, _worker/loopwatch.py).

An ``async def handle`` that blocks the event loop stops every lease renewal
of its worker. The watch says so while it lasts (the job, the lines it is
blocked on, the advice), then how long it lasted and what that meant for the
lease; a handler that waits without blocking, or blocks in a thread, is not
reported, nor is a whole process that was stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
WATCH_LOG = "venturi_redis.worker"


@pytest.fixture
def backend() -> str:
    return "redis"  # the loop and its threads do not care which store: the real server only


class Sleepy(vr.Task):
    KIND: ClassVar[str] = "loopwatch.sleepy"
    seconds: float
    how: str = "block"  # block: time.sleep on the loop; thread: in a worker thread; await: anyio.sleep


class SleepyJob(Sleepy, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.run_count == 1:
            if self.how == "block":
                time.sleep(self.seconds)  # blocking the loop is the point
            elif self.how == "thread":
                await anyio.to_thread.run_sync(time.sleep, self.seconds)
            else:
                await anyio.sleep(self.seconds)
        return vr.Outcome.completed()


class Told:
    """An observer that keeps what ``loop_blocked`` was told."""

    def __init__(self) -> None:
        self.blocks: list[float] = []

    def job_claimed(self, queue: str, kind: str) -> None:
        pass

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        pass

    def loop_blocked(self, seconds: float) -> None:
        self.blocks.append(seconds)


def watch_lines(caplog: pytest.LogCaptureFixture, worker: vr.Worker[Any]) -> list[str]:
    """What ``worker``'s watch said (another test's worker, left running, may say its own)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == WATCH_LOG
        and r.levelno == logging.WARNING
        and "event loop" in r.getMessage()
        and f"worker {worker.id}:" in r.getMessage()
    ]


# The block is 1.0 s; the watch measures it a quarter of its threshold short
# at most. Each lease puts that block well inside one of the three readings.
@pytest.mark.parametrize(
    ("lease", "meaning"),
    [
        (30.0, "no other job ran meanwhile"),
        (2.4, "lease renewals (every 0.8 s) were late meanwhile"),
        (0.6, "longer than the 0.6 s lease"),
    ],
)
async def test_a_blocking_handler_is_named_with_its_line_and_what_the_block_meant(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture, lease: float, meaning: str
) -> None:
    caplog.set_level(logging.WARNING, logger=WATCH_LOG)
    job_id = await queue.enqueue(Sleepy(seconds=1.0))
    told = Told()
    worker = await drain(queue, SleepyJob, lease=lease, blocked_loop_warning=0.2, observer=told)
    lines = watch_lines(caplog, worker)
    blocked = [line for line in lines if "has been blocked for" in line]
    again = [line for line in lines if "ran again after" in line]
    assert len(blocked) == 1 and len(again) == 1, lines
    assert f"running job {job_id} (loopwatch.sleepy) of queue {queue.name}" in blocked[0]
    assert "no lease is renewed" in blocked[0] and "plain def" in blocked[0]
    # The handler's own line, in this file, is where the stack ends; nothing of the worker's is shown.
    stack = blocked[0].split("Blocked at:\n", 1)[1]
    assert "time.sleep(self.seconds)  # blocking the loop is the point" in stack
    assert Path(__file__).name in stack and "venturi_redis" not in stack
    assert meaning in again[0], again
    assert len(told.blocks) == 1
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED


@pytest.mark.parametrize("how", ["thread", "await"])
async def test_a_handler_that_does_not_block_the_loop_is_not_reported(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.WARNING, logger=WATCH_LOG)
    await queue.enqueue(Sleepy(seconds=1.5, how=how))
    told = Told()
    worker = await drain(queue, SleepyJob, blocked_loop_warning=0.5, observer=told)
    assert watch_lines(caplog, worker) == [] and told.blocks == []


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("venturi-loop-watch:")]


async def test_the_watch_thread_lives_as_long_as_run_and_none_turns_it_off(queue: vr.Queue) -> None:
    await queue.enqueue(Sleepy(seconds=0.3, how="await"))
    for setting, watched in ((1.0, True), (None, False)):
        worker = make_worker(queue, SleepyJob, blocked_loop_warning=setting)
        seen: list[bool] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                while not seen or (watched and not seen[-1]):
                    await anyio.sleep(0.05)
                    seen.append(any(worker.id in t.name for t in watch_threads()))
            worker.shutdown()
        assert seen[-1] is watched
        assert not any(worker.id in t.name for t in watch_threads())  # stopped and joined with run()


# A process of its own whose loop blocks (--block) or which is stopped as a
# whole by SIGSTOP, then continued: only the first is a handler's block.
_CHILD = textwrap.dedent(
    """
    import logging, sys, time
    import anyio
    from venturi_redis._worker.loopwatch import LoopWatch

    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    async def main() -> None:
        watch = LoopWatch("child", 0.2, 30.0, list, {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            await anyio.sleep(0.3)
            print("ready", flush=True)
            if "--block" in sys.argv:
                time.sleep(1.0)
            else:
                sys.stdin.readline()  # the parent stops us, continues us, then writes a line
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)
    """
)


@pytest.mark.parametrize("stopped", [False, True])
def test_a_process_stopped_as_a_whole_is_not_a_blocked_loop(stopped: bool, tmp_path: Path) -> None:
    child = tmp_path / "child.py"  # a file, so that the warning's stack shows its lines
    child.write_text(_CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(child), *([] if stopped else ["--block"])],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        if stopped:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(1.0)
            proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate("go\n", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    if stopped:
        assert "blocked" not in err, err
    else:
        assert "has been blocked for" in err and "ran again after" in err, err
        assert "time.sleep(1.0)" in err


async def test_prometheus_counts_each_block(queue: vr.Queue) -> None:
    m = vr.PrometheusMetrics()
    await queue.enqueue_many([Sleepy(seconds=0.6), Sleepy(seconds=0.01)])
    await drain(queue, SleepyJob, blocked_loop_warning=0.2, observer=m, concurrency=1)
    assert m.registry.get_sample_value("venturi_event_loop_blocked_seconds_count") == 1
    assert b"venturi_event_loop_blocked_seconds_bucket" in m.render()


def test_a_run_abandoned_with_its_loop_leaves_no_watch_behind(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop stopped between two run_until_complete calls is not a blocked one, and a loop
    closed under a run that was never cancelled (its finally never runs) ends the watch thread."""
    caplog.set_level(logging.WARNING, logger=WATCH_LOG)
    loop = asyncio.new_event_loop()
    client = vr.Client.from_url(redis_server.url)
    # The collector left as it is: an abandoned run never puts it back (nor unfreezes it).
    worker = make_worker(
        client.queue("loopwatch-abandoned"),
        SleepyJob,
        blocked_loop_warning=0.1,
        freeze_gc=False,
        gc_threshold=None,
    )
    task = loop.create_task(worker.run())
    loop.run_until_complete(asyncio.sleep(0.5))
    assert any(worker.id in t.name for t in watch_threads())
    time.sleep(0.5)  # the loop stands still, not blocked: nothing runs on it
    loop.close()  # the run's task is dropped, never cancelled
    del task
    deadline = time.monotonic() + 5
    while any(worker.id in t.name for t in watch_threads()):
        assert time.monotonic() < deadline, "the watch thread outlived its loop"
        time.sleep(0.05)
    assert watch_lines(caplog, worker) == []


async def test_the_workers_listing_counts_the_blocks(
    queue: vr.Queue, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`venturi workers`, queue.workers() and the dashboard's queue page say how often a worker's
    loop was blocked and the longest block, while the worker runs; a record without those fields
    (an older release's) reads them as 0."""
    import httpx
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app
    from venturi_redis.dashboard import create_app

    caplog.set_level(logging.WARNING, logger=WATCH_LOG)
    await queue.enqueue(Sleepy(seconds=0.8))
    worker = make_worker(queue, SleepyJob, blocked_loop_warning=0.2, lease=1.5, concurrency=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while not [w for w in await queue.workers() if w.name == worker.id and w.loop_blocked]:
                await anyio.sleep(0.05)
        (info,) = [w for w in await queue.workers() if w.name == worker.id]
        ended = [line for line in watch_lines(caplog, worker) if "ran again after" in line]
        cli = await anyio.to_thread.run_sync(
            lambda: CliRunner().invoke(app, ["workers", "-q", queue.name, "--redis", redis_server.url])
        )
        transport = httpx.ASGITransport(app=create_app(queue.client))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
            page = (await h.get(f"/queues/{queue.name}")).text
            api = (await h.get(f"/api/queues/{queue.name}/workers")).json()["workers"]
        worker.shutdown()
    assert 1 <= info.loop_blocked <= len(ended)  # the record is as of its last heartbeat
    # The longest block is one the warnings reported ("about X s"), to the tenth.
    assert any(f"about {info.longest_block:.1f} s blocked" in line for line in ended), (info, ended)
    # The views are read after it: on a loaded machine the CLI's imports in a thread (the
    # GIL) may block the worker's loop once more, so they count at least as many blocks.
    assert cli.exit_code == 0, cli.output
    shown = re.search(r"(\d+)x, longest (\d+\.\d) s", " ".join(cli.output.split()))
    assert shown is not None and int(shown[1]) >= info.loop_blocked, cli.output
    assert float(shown[2]) >= round(info.longest_block, 1), cli.output
    (row,) = [w for w in api if w["name"] == worker.id]
    assert row["loop_blocked"] >= info.loop_blocked and row["longest_block"] >= info.longest_block
    assert re.search(r"\d+&times;, longest \d+\.\d s", page)
    doc = json.loads(info.to_json())
    del doc["loop_blocked"], doc["longest_block"]
    back = vr.WorkerInfo.from_json(json.dumps(doc))
    assert back is not None and back.name == worker.id
    assert back.loop_blocked == 0 and back.longest_block == 0.0
