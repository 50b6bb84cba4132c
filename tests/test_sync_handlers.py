"""Synchronous handlers (issue 39, item 2): a plain ``def handle`` runs in a worker thread.

The event loop stays free while one blocks; at most ``concurrency`` of them
run at once; a run that ends without its thread (timeout, shutdown) ends as
an async one would and its thread's late outcome is discarded; a worker
process exits though such a thread never returns. Every test here runs on a
real redis-server; nothing asserts how long anything took (a wait that could
hang is bounded by ``fail_after`` so that a bug fails instead).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import events, make_worker
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def backend() -> str:
    return "redis"  # threads do not care which store: the real server only


# -- the handlers --------------------------------------------------------------------------------


class Blocker(vr.Task):
    """Sync: sleeps in time.sleep until ``state["go"]`` (a threading.Event) is set."""

    KIND: ClassVar[str] = "blocker"
    tag: str = ""


class BlockerJob(Blocker, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["threads"].append(threading.current_thread().name)
        state["started"].append(self.tag)
        # Blocking sleeps, never an await: with the handler on the loop, nothing
        # else would run. Bounded, so that such a bug fails the test instead of hanging it.
        deadline = time.monotonic() + 20
        while not state["go"].is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        state["cancel_seen"].append(ctx.is_cancelled())
        state["returned"].append(self.tag)
        return vr.Outcome.completed(result={"tag": self.tag, "released": state["go"].is_set()})


class Opener(vr.Task):
    """Async: sets ``state["go"]``, letting the blockers return."""

    KIND: ClassVar[str] = "opener"


class OpenerJob(Opener, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["go"].set()
        return vr.Outcome.completed(result="opened")


def fresh_state() -> dict[str, Any]:
    return {"go": threading.Event(), "threads": [], "started": [], "returned": [], "cancel_seen": []}


async def wait_for(check: Callable[[], Any], timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


# -- running beside async handlers ---------------------------------------------------------------


async def test_a_sync_handler_runs_in_a_thread_and_the_loop_stays_free(queue: vr.Queue) -> None:
    blocked = await queue.enqueue(Blocker(tag="b"))
    # Enqueued second: with the sync handler on the event loop, the opener
    # could never run, and the blocker would never be released.
    opener = await queue.enqueue(Opener())
    state = fresh_state()
    worker = make_worker(queue, BlockerJob, OpenerJob, concurrency=2, state=state)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    for job_id, result in ((blocked, {"tag": "b", "released": True}), (opener, "opened")):
        info = await queue.get(job_id)
        assert info is not None and (info.state, info.result) == (vr.JobState.COMPLETED, result)
    (name,) = state["threads"]
    assert name.startswith("venturi-handler-") and name != threading.current_thread().name


class Racer(vr.Task):
    KIND: ClassVar[str] = "racer"


class RacerJob(Racer, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        with state["lock"]:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        deadline = time.monotonic() + 20  # bounded, as Blocker's wait is
        while not state["go"].is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        with state["lock"]:
            state["now"] -= 1
        return vr.Outcome.completed()


async def test_at_most_concurrency_sync_handlers_run_at_once(queue: vr.Queue) -> None:
    jobs = await queue.enqueue_many([Racer() for _ in range(6)])
    state = {"lock": threading.Lock(), "now": 0, "most": 0, "go": threading.Event()}
    worker = make_worker(queue, RacerJob, concurrency=2, state=state)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(until_idle=True))
        await wait_for(lambda: state["most"] == 2)
        state["go"].set()
    assert state["most"] == 2
    for job_id in jobs:
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED


class Progress(BaseModel):
    steps: int = 0


class Reporter(vr.Task[Progress]):
    KIND: ClassVar[str] = "reporter"


class ReporterJob(Reporter, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[Progress], state: Any) -> vr.Outcome:
        ctx.carry.steps += 1
        ctx.set_attachment({"thread": threading.current_thread().name.startswith("venturi-handler-")})
        ctx.from_thread(ctx.report_progress, {"done": 1, "of": 2})
        state["deps"] = ctx.from_thread(ctx.dependency_results)
        with pytest.raises(RuntimeError, match="what the coroutine raised"):
            ctx.from_thread(state["boom"])
        if ctx.carry.steps < 2:
            return vr.Outcome.pause_in(0)
        return vr.Outcome.completed(result=ctx.carry.steps)


async def test_a_sync_handlers_context_carry_attachment_progress_from_its_thread(queue: vr.Queue) -> None:
    async def boom() -> None:
        raise RuntimeError("from_thread raises what the coroutine raised")

    job_id = await queue.enqueue(Reporter())
    state: dict[str, Any] = {"boom": boom}
    worker = make_worker(queue, ReporterJob, state=state)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    info = await queue.get(job_id)
    assert info is not None
    assert (info.state, info.result, info.carry) == (vr.JobState.COMPLETED, 2, {"steps": 2})
    assert info.attachment == {"thread": True}
    assert info.progress == {"done": 1, "of": 2}
    assert state["deps"] == {}
    paused = [e for e in await queue.journal(job_id) if e.event == "paused"]
    assert [e.attachment for e in paused] == [{"thread": True}]


async def test_from_thread_refuses_the_loop_and_a_context_with_no_thread(queue: vr.Queue) -> None:
    ctx: vr.Context[vr.NoCarry] = vr.Context(
        job_id="j", queue="q", kind="k", run_count=1, failures=0, history=[], carry=vr.NoCarry()
    )
    with pytest.raises(RuntimeError, match="for a sync handler"):
        ctx.from_thread(anyio.sleep, 0)


class Raiser(vr.Task):
    KIND: ClassVar[str] = "sync-raiser"


class RaiserJob(Raiser, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["thread"] = threading.current_thread().name
        raise LookupError("nothing here")


async def test_a_sync_handlers_error_is_a_failed_run_with_its_traceback(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Raiser(), max_failures=1)
    state: dict[str, Any] = {}
    worker = make_worker(queue, RaiserJob, state=state)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert state["thread"].startswith("venturi-handler-")  # raised in the thread, reported by the loop
    failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
    assert [e.note for e in failed] == ["nothing here"]
    assert failed[0].details["error_type"] == "LookupError"
    assert "in handle" in failed[0].details["traceback"]


def test_a_generator_handle_is_refused_at_registration() -> None:
    class Gen(vr.Task):
        KIND: ClassVar[str] = "gen"

    class GenJob(Gen, vr.Handler[Any]):
        def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> Iterator[vr.Outcome]:  # type: ignore[override]
            yield vr.Outcome.completed()

    worker: vr.Worker[Any] = vr.Worker("q", client=vr.Client.from_url("memory://gen"), handle_signals=False)
    with pytest.raises(vr.TaskDefinitionError, match="is a generator"):
        worker.register(GenJob)


# -- runs that end without their thread ----------------------------------------------------------


async def test_a_sync_handler_past_its_timeout_fails_and_its_late_outcome_is_discarded(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await queue.enqueue(Blocker(tag="late"), timeout=0.2, max_failures=1)
    state = fresh_state()
    worker = make_worker(queue, BlockerJob, state=state)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)  # the run ended at its timeout; its thread still sleeps
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD
    assert worker.handler_threads.abandoned == 1 and state["returned"] == []
    before = await queue.journal(job_id)
    assert [e.event for e in before] == ["enqueued", "claimed", "failed", "dead"]
    assert "timed out after 0.2 s" in (before[2].note or "")

    state["go"].set()  # the abandoned thread returns a completion now
    await wait_for(lambda: worker.handler_threads.abandoned == 0)
    assert state["returned"] == ["late"] and state["cancel_seen"] == [True]  # it was told, and ignored it
    assert await queue.journal(job_id) == before  # discarded: nothing reached Redis
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.result) == (vr.JobState.DEAD, None)
    assert any("abandoned thread" in r.getMessage() and job_id in r.getMessage() for r in caplog.records)


async def test_a_stuck_sync_handler_is_released_after_the_grace_and_run_returns(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Blocker(tag="stuck"))
    state = fresh_state()
    worker = make_worker(queue, BlockerJob, state=state, shutdown_grace=0.2)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await wait_for(lambda: state["started"] == ["stuck"])
            worker.shutdown()
    # run() returned while the thread still sleeps: the job went back to pending, not charged.
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 0)
    assert (await events(queue, job_id))[-1] == "released"
    assert state["returned"] == []
    state["go"].set()
    await wait_for(lambda: worker.handler_threads.abandoned == 0)
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.result) == (vr.JobState.PENDING, None)


async def test_a_second_shutdown_releases_a_stuck_sync_handler_without_the_grace(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Blocker(tag="stuck"))
    state = fresh_state()
    worker = make_worker(queue, BlockerJob, state=state, shutdown_grace=3600)
    with anyio.fail_after(30):  # an hour's grace: only the second call can end run() here
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await wait_for(lambda: state["started"] == ["stuck"])
            worker.shutdown()
            await anyio.sleep(0.1)
            worker.shutdown()
    assert (await events(queue, job_id))[-1] == "released"
    state["go"].set()


async def test_abandoned_threads_count_against_the_bound(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """One slot: the first job's thread is abandoned at its timeout and keeps
    the only thread; the second job waits for it, said in the log, and runs
    once the first thread returns."""
    first = await queue.enqueue(Blocker(tag="first"), timeout=0.2, max_failures=1)
    state = fresh_state()
    worker = make_worker(queue, BlockerJob, concurrency=1, state=state)
    caplog.set_level(logging.WARNING, logger="venturi_redis.worker")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await wait_for(lambda: worker.handler_threads.abandoned == 1)
        second = await queue.enqueue(Blocker(tag="second"))
        await wait_for(lambda: any("waits for a thread" in r.getMessage() for r in caplog.records))
        assert state["started"] == ["first"]  # no second thread was started for it
        state["go"].set()
        with anyio.fail_after(30):
            while (info := await queue.get(second)) is None or info.state != vr.JobState.COMPLETED:
                await anyio.sleep(0.01)
        worker.shutdown()
    assert state["started"] == ["first", "second"]
    assert len(set(state["threads"])) == 1
    info = await queue.get(first)
    assert info is not None and info.state == vr.JobState.DEAD


# -- a worker process whose sync handler never returns ---------------------------------------------


@pytest.fixture
def stuck_worker(redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[[float], Any]]:
    procs: list[subprocess.Popen[str]] = []

    def start(grace: float) -> Any:
        name = f"t-{uuid.uuid4().hex[:12]}"
        marker = tmp_path / f"{name}.started"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "STUCK_QUEUE": name,
            "STUCK_FILE": str(marker),
            "STUCK_GRACE": str(grace),
        }
        sc = vr.SyncClient(redis_server.url)
        from tests.procs.sync_stuck import Stuck

        job_id = sc.queue(name).enqueue(Stuck())
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "venturi_redis.cli",
                "worker",
                "tests.procs.sync_stuck:make",
                "--redis",
                redis_server.url,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return proc, sc.queue(name), job_id, sc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("signals", [1, 2], ids=["after-the-grace", "second-signal"])
def test_a_worker_process_exits_though_its_sync_handler_never_returns(
    stuck_worker: Callable[[float], Any], signals: int
) -> None:
    # A grace of an hour when a second signal must cut it short; a short one otherwise.
    proc, queue, job_id, sc = stuck_worker(3600 if signals == 2 else 0.5)
    with sc:
        proc.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # the thread sleeps an hour: only exiting without it ends this
        assert proc.returncode == 0, err
        info: Any = queue.get(job_id)
        assert (info.state, info.failures) == (vr.JobState.PENDING, 0), err
        last = queue.journal(job_id)[-1]
        assert (last.event, last.note) == ("released", "released on worker shutdown"), err


class Quitter(vr.Task):
    KIND: ClassVar[str] = "sync-quitter"


class QuitterJob(Quitter, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["thread"] = threading.current_thread().name
        sys.exit(3)


async def test_system_exit_in_a_sync_handler_stops_the_worker_as_in_an_async_one(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Quitter())
    state: dict[str, Any] = {}
    worker = make_worker(queue, QuitterJob, state=state, shutdown_grace=60)
    with pytest.raises(SystemExit) as raised, anyio.fail_after(30):
        await worker.run()
    assert raised.value.code == 3 and state["thread"].startswith("venturi-handler-")
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 1)
    # Its one run failed; a claim in flight as the worker stopped is given back unstarted.
    failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
    assert len(failed) == 1 and "SystemExit(3)" in (failed[0].note or "")
