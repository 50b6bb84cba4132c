"""``Worker(lifespan=...)``: the handlers' state opened as run() starts and closed once its last job ended.

What arq's ``on_startup``/``on_shutdown`` and SAQ's ``startup``/``shutdown``
do, as one async context manager (Starlette's lifespan): a database pool or
an HTTP client made once per worker, handed to every handler as its state,
and closed after the last job, however the run ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio


@dataclass
class Pool:
    """Stands for a connection pool: what happened to it, in order."""

    log: list[str] = field(default_factory=list)
    closed: bool = False


class Use(vr.Task):
    KIND: ClassVar[str] = "lifespan.use"
    n: int
    wait: float = 0.0


class UseJob(Use, vr.Handler[Pool]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], pool: Pool) -> vr.Outcome:
        assert not pool.closed, "a handler ran on a closed pool"
        await anyio.sleep(self.wait)
        pool.log.append(f"job {self.n}")
        return vr.Outcome.completed()


class UseSyncJob(Use, vr.Handler[Pool]):
    def handle(self, ctx: vr.Context[vr.NoCarry], pool: Pool) -> vr.Outcome:
        pool.log.append(f"sync job {self.n}")
        return vr.Outcome.completed()


def lifespan_of(pools: list[Pool], *, fail_enter: bool = False, fail_exit: bool = False) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[Pool]:
        pool = Pool()
        pools.append(pool)
        pool.log.append("open")
        if fail_enter:
            raise OSError("database unreachable")
        try:
            yield pool
        finally:
            await anyio.sleep(0.01)  # an await in the cleanup: a cancelled run still gets it done
            pool.log.append("close")
            pool.closed = True
            if fail_exit:
                raise RuntimeError("pool close failed")

    return lifespan


@pytest.mark.parametrize("handler", [UseJob, UseSyncJob], ids=["async", "sync"])
async def test_the_state_is_opened_before_the_first_job_and_closed_after_the_last(
    queue: vr.Queue, handler: type
) -> None:
    pools: list[Pool] = []
    await queue.enqueue_many([Use(n=i) for i in range(3)])
    worker = make_worker(queue, handler, lifespan=lifespan_of(pools), concurrency=1)
    assert worker.state is None
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
        await queue.enqueue(Use(n=3))
        await worker.run(until_idle=True)  # each run opens its own
    prefix = "sync job" if handler is UseSyncJob else "job"
    assert [p.log for p in pools] == [
        ["open", *(f"{prefix} {i}" for i in range(3)), "close"],
        ["open", f"{prefix} 3", "close"],
    ]
    assert worker.state is None  # nothing left pointing at a closed pool


async def test_a_shutdown_closes_the_state_after_the_running_job_finished(queue: vr.Queue) -> None:
    pools: list[Pool] = []
    job_id = await queue.enqueue(Use(n=1, wait=0.5))
    worker = make_worker(queue, UseJob, lifespan=lifespan_of(pools), shutdown_grace=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            while (info := await queue.get(job_id)) is None or info.state != vr.JobState.RUNNING:
                await anyio.sleep(0.01)
        worker.shutdown()
    assert pools[0].log == ["open", "job 1", "close"]
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED


async def test_a_cancelled_run_still_closes_the_state(queue: vr.Queue) -> None:
    pools: list[Pool] = []
    await queue.enqueue(Use(n=1, wait=30))
    worker = make_worker(queue, UseJob, lifespan=lifespan_of(pools))
    with anyio.move_on_after(1.0):
        await worker.run()
    assert pools[0].log == ["open", "close"] and pools[0].closed


async def test_a_state_that_cannot_be_opened_is_raised_and_nothing_is_claimed(queue: vr.Queue) -> None:
    pools: list[Pool] = []
    job_id = await queue.enqueue(Use(n=1))
    worker = make_worker(queue, UseJob, lifespan=lifespan_of(pools, fail_enter=True))
    with anyio.fail_after(30), pytest.raises(OSError, match="database unreachable"):
        await worker.run(until_idle=True)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.PENDING and info.run_count == 0
    assert await queue.workers() == []  # it left the registry


async def test_a_close_that_raises_is_raised_by_run_after_the_jobs(queue: vr.Queue) -> None:
    pools: list[Pool] = []
    await queue.enqueue(Use(n=1))
    worker = make_worker(queue, UseJob, lifespan=lifespan_of(pools, fail_exit=True))
    with anyio.fail_after(30), pytest.raises(RuntimeError, match="pool close failed"):
        await worker.run(until_idle=True)
    assert pools[0].log == ["open", "job 1", "close"]


async def test_bad_lifespans_are_refused(queue: vr.Queue) -> None:
    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[Pool]:
        yield Pool()

    with pytest.raises(vr.ConfigurationError, match="give lifespan= or state=, not both"):
        vr.Worker(queue, state=Pool(), lifespan=lifespan)
    with pytest.raises(vr.ConfigurationError, match="lifespan must be a function"):
        vr.Worker(queue, lifespan=lifespan())  # type: ignore[arg-type]  # called, not the function

    def not_a_context_manager() -> Pool:
        return Pool()

    worker = make_worker(queue, UseJob, lifespan=not_a_context_manager)
    with anyio.fail_after(30), pytest.raises(vr.ConfigurationError, match="not an async context manager"):
        await worker.run(until_idle=True)


# -- SIGTERM and SIGINT while the state opens or closes (`venturi worker`) -------------------

SIGNAL_APP = textwrap.dedent(
    """
    import contextlib
    import os
    import sys
    import time
    from pathlib import Path

    import anyio

    import venturi_redis as vr
    from tests.tasks import EchoJob

    MARKS = Path(os.environ["MARKS"])


    def say(line):
        print(line, file=sys.stderr, flush=True)


    @contextlib.asynccontextmanager
    async def hanging():  # a database that never answers
        say("OPENING")
        try:
            await anyio.sleep_forever()
        finally:
            say("OPEN CANCELLED")
        yield None


    @contextlib.asynccontextmanager
    async def slow_close():
        say("OPENED")
        try:
            yield None
        finally:
            say("CLOSING")
            while not (MARKS / "go").exists():  # closes once the test says so
                await anyio.sleep(0.02)
            say("CLOSED")


    def make_worker(lifespan):
        client = vr.Client.from_url(os.environ["REDIS_URL"])
        worker = vr.Worker(client.queue(os.environ["QUEUE"]), lifespan=lifespan)
        worker.register(EchoJob)
        return worker


    def opening():
        return make_worker(hanging)


    def closing():
        return make_worker(slow_close)
    """
)


def _signal_worker(tmp_path: Path, url: str, factory: str) -> subprocess.Popen[str]:
    (tmp_path / "signalapp.py").write_text(SIGNAL_APP)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "MARKS": str(tmp_path),
        "QUEUE": f"lifespan-signals-{tmp_path.name}",
    }
    command = [sys.executable, "-m", "venturi_redis.cli", "worker", f"signalapp:{factory}", "--redis", url]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen[str], seen: list[str], text: str) -> None:
    assert proc.stderr is not None
    while not any(text in line for line in seen):
        line = proc.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_state_opens_stops_the_worker_cleanly(
    redis_server: RedisServer, tmp_path: Path, signum: signal.Signals
) -> None:
    """Before, SIGTERM while a lifespan opened (a slow database) met the signal's default action:
    exit 143, nothing said, the lifespan's own cleanup never ran; SIGINT raised KeyboardInterrupt
    out of `venturi worker` (exit 130). Now the opening is cancelled and the worker exits 0."""
    proc = _signal_worker(tmp_path, redis_server.url, "opening")
    seen: list[str] = []
    try:
        _read_until(proc, seen, "OPENING")
    finally:
        proc.send_signal(signum)
        _, rest = proc.communicate(timeout=30)
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert f"{signum.name} received while opening the handlers' state; stopping (nothing claimed)" in err, err
    assert "OPEN CANCELLED" in err, err  # the lifespan's own finally ran
    assert "Traceback" not in err, err


def test_a_signal_while_the_state_closes_lets_the_close_finish(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A second SIGTERM (or Ctrl-C pressed twice) while the lifespan closed its pool killed the
    process mid-close (exit 143). Now the close goes on, said once, and the worker exits 0."""
    proc = _signal_worker(tmp_path, redis_server.url, "closing")
    seen: list[str] = []
    try:
        _read_until(proc, seen, "OPENED")
        proc.send_signal(signal.SIGTERM)
        _read_until(proc, seen, "CLOSING")
        proc.send_signal(signal.SIGTERM)
        _read_until(proc, seen, "SIGTERM received while closing; the close goes on")
        (tmp_path / "go").touch()
    finally:
        _, rest = proc.communicate(timeout=30)
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert "SIGTERM received, shutting down" in err, err
    assert "CLOSED" in err and err.index("CLOSED") < err.index("stopped"), err
    assert "Traceback" not in err, err
