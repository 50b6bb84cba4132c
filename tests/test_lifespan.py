"""``Worker(lifespan=...)``: the handlers' state opened as run() starts and closed once its last job ended.

What arq's ``on_startup``/``on_shutdown`` and SAQ's ``startup``/``shutdown``
do, as one async context manager (Starlette's lifespan): a database pool or
an HTTP client made once per worker, handed to every handler as its state,
and closed after the last job, however the run ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker

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
