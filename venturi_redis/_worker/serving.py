"""The worker's running tasks: what ``Worker.run`` starts, and how it winds them down.

A mixin of ``Worker`` (worker.py holds its arguments, registration and the
run/shutdown entry points): the service tasks (lease keeper, health file,
completer senders, reclaimers, schedulers), the slot
tasks and the claim loops in their task groups, the drain within the
shutdown grace, and the release of jobs claimed but never started.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from .._model.endings import Released
from . import startup
from .execute import execute
from .gc_tuning import FrozenStart, young_threshold_raised
from .handler import BatchHandler
from .housekeeping import sweep_forever
from .inbox import Inbox
from .loopwatch import LoopWatch
from .recycle import Recycling
from .registry import keep_touching
from .signals import SignalWatch
from .waiting import wait_groups

if TYPE_CHECKING:
    from .._producer.client import Queue
    from .._producer.retention import Retention
    from .completer import Completer
    from .job import Job
    from .keeper import LeaseKeeper
    from .runner import _Runner
    from .scheduler import Scheduler

log = logging.getLogger("venturi_redis.worker")
_NOT_STARTED = "released on worker shutdown (not started)"
# Calls at once beside the completer's pipelines: schedule rounds, drain checks, lost claims.
_SIDE_CALLS = 8


class Serving:
    """``Worker``'s task groups, from ``run()`` to every task stopped."""

    # Worker's, set in its __init__.
    id: str
    concurrency: int
    lease_ms: int
    shutdown_grace: float
    health_file: Any
    blocked_loop_warning: float | None
    lease: float
    idle_block: float
    reclaim_interval: float
    trim_interval: float
    retention: Retention | None
    observer: Any
    _keeper: LeaseKeeper
    _completer: Completer
    _runners: list[_Runner]
    _schedulers: list[Scheduler]
    _jobs_tg: TaskGroup | None
    _registry: dict[str, type[Any]]
    _force: bool
    _changed: asyncio.Event
    _recycling: bool
    _stopping: bool
    _stop: Any
    recycling: Recycling | None
    # What run() reads (_run, below).
    queues: list[Queue]
    max_runs: int | None
    max_memory_mib: int | None
    freeze_gc: bool
    gc_threshold: int | None
    _running: bool
    _until_idle: bool
    _fatal: KeyboardInterrupt | SystemExit | None
    _frozen_start: FrozenStart

    if TYPE_CHECKING:  # Worker's methods

        def shutdown(self, *, grace: float | None = None) -> None: ...

        def _finish(self, runner: _Runner, job: Job) -> None: ...

        @property
        def max_failures_arg(self) -> str: ...

        @property
        def kinds(self) -> list[str]: ...

    @property
    def completer(self) -> Completer:
        """Writes each run's ending (batch.py's ``BatchHost``)."""
        return self._completer

    @property
    def forcing(self) -> bool:
        """Whether the worker stops at once, without the grace (endings go straight to Redis)."""
        return self._force

    async def _run(self, watch: SignalWatch, until_idle: bool) -> None:
        """``run()`` inside its signal watch: the start, the serving, the close."""
        started = False
        with watch.starting("waiting for Redis"):
            started = await startup.start(self)  # type: ignore[arg-type]  # a Worker; False: a shutdown() came
        if not started or watch.stopped_starting:
            self._stopping = self._force = False
            return
        self._running = True
        self._until_idle = until_idle
        # A shutdown() that came before this point is kept, not reset: the
        # task running run() may not have started yet when it came (an app's
        # lifespan does start_soon(worker.run), and a server stopped at once
        # calls shutdown() right after), and forgetting it would leave run()
        # waiting for a second one forever. This run then stops as it starts.
        # The flags are cleared when run() ends, so a stopped worker can run again.
        self._stop = anyio.Event()
        if self._stopping:
            self._stop.set()
        startup.started(self.id, self.queues, self.kinds)
        self._fatal = None
        bounds = self.max_runs, self.max_memory_mib
        self.recycling = None if bounds == (None, None) else Recycling(*bounds, self._recycle)
        try:
            # Worker(lifespan=...): its state made here, closed once the last job ended.
            async with AsyncExitStack() as held:
                with watch.starting("opening the handlers' state"):
                    await held.enter_async_context(startup.state_held(self))  # type: ignore[arg-type]  # a Worker
                if not watch.stopped_starting:
                    watch.phase = "serving"
                    self._frozen_start = FrozenStart(self.freeze_gc)
                    with self._frozen_start, young_threshold_raised(self.gc_threshold):
                        await self._serve(until_idle)
                watch.phase = "closing"
        finally:
            watch.phase = "closing"
            await self._keeper.leave()
            with anyio.CancelScope(shield=True):
                for r in self._runners:
                    await r.close()
            self._running = False
            self._stopping = self._force = self._recycling = False
            log.info("worker %s stopped", self.id)

    async def _serve(self, until_idle: bool) -> None:
        """The worker's tasks: services, slot tasks, claim loops; returns once all have stopped."""
        async with anyio.create_task_group() as service_tg:
            service_tg.start_soon(self._keeper.run)
            if self.health_file is not None:
                service_tg.start_soon(keep_touching, self.health_file, self.lease_ms / 3000, self.id)
            if self.blocked_loop_warning is not None:
                service_tg.start_soon(self._loop_watch(self.blocked_loop_warning).run)
            if self.recycling is not None:
                service_tg.start_soon(self.recycling.watch_memory)
            await self._completer.run(service_tg)
            # The claim loops' and schedulers' calls outside the completer share a
            # few connections, however many queues (a pool holds 100 on redis-py 8).
            side_calls = anyio.CapacityLimiter(_SIDE_CALLS)
            for r in self._runners:
                r.side_calls = side_calls
            for scheduler in self._schedulers:
                scheduler.side_calls = side_calls
            # One sweep over every queue (expired leases, retention): housekeeping.py.
            service_tg.start_soon(sweep_forever, [r.queue for r in self._runners], self)
            for scheduler in self._schedulers:
                service_tg.start_soon(scheduler.run)
            try:
                async with anyio.create_task_group() as jobs_tg:
                    self._jobs_tg = jobs_tg
                    # batch.py is imported only by a worker with a vr.BatchHandler
                    # (issue 42: a worker's start-up); batching_for checks the same.
                    batches = any(issubclass(cls, BatchHandler) for cls in self._registry.values())
                    if batches:
                        from .batch import batching_for
                    # A worker with many queues waits for their wake-ups in groups (waiting.py).
                    groups = wait_groups(self._runners, self.id, self.idle_block, lambda: self._stopping)
                    for r in self._runners:
                        r.inbox = Inbox()
                        r.done = r.short = False  # its wait group waits for it once it is idle
                        r.batching = batching_for(self, r) if batches else None  # type: ignore[arg-type]  # a Worker
                        if r.group is not None and not batches:
                            r.start_slots_lazily()  # as its jobs come (batch.py places held jobs itself)
                        else:
                            for _ in range(2 * self.concurrency):
                                jobs_tg.start_soon(r.slot)
                    try:
                        async with anyio.create_task_group() as claim_tg:
                            for group in groups:
                                claim_tg.start_soon(group.run)  # each returns once its runners stop
                            for r in self._runners:
                                claim_tg.start_soon(r.claim_loop, until_idle)
                    finally:
                        for r in self._runners:
                            r.leave_group()
                    # Claiming has stopped (shutdown, or every queue drained).
                    for r in self._runners:
                        r.inbox.close()
                    await self._drain(jobs_tg)
            finally:
                self._jobs_tg = None
                await self._release_unstarted()
            service_tg.cancel_scope.cancel()

    def _loop_watch(self, threshold: float) -> LoopWatch:
        """The blocked-loop watch of this run (loopwatch.py): it names the job on the loop's stack."""
        return LoopWatch(
            self.id,
            threshold,
            self.lease,
            lambda: [j for r in self._runners for j in r.active.values()],
            {execute.__code__: "job"},
            lambda: self.observer,
            self._keeper.registration.loop_blocked,
        )

    async def _release_unstarted(self) -> None:
        """Jobs claimed but not started when the slots were cancelled go back to pending.

        A forced stop (or run() cancelled) can catch a job between its claim
        and its handler, in an inbox. It is released as a started one is,
        instead of waiting out its lease to be charged a failure.
        """
        left = [
            (r, j) for r in self._runners for j in r.active.values() if j.ctx is None and not j.committing
        ]
        if not left:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            for r, job in left:
                await self._completer.finish(job, Released(_NOT_STARTED), direct=True)
                self._finish(r, job)

    def _recycle(self, reason: str) -> None:
        """A recycling bound is reached: claim no more, let the running jobs finish, return from run()."""
        if self._stopping:
            return
        running = sum(len(r.active) for r in self._runners)
        log.warning(
            "worker %s: stopping to be started afresh: %s; its %d running job(s) finish first",
            self.id,
            reason,
            running,
        )
        self._recycling = True
        self._stop_claiming()

    def _stop_claiming(self) -> None:
        """Claim no more: each claim loop woken, its idle wait cut short, run()'s stop event set."""
        self._stopping = True
        for r in self._runners:
            r.wake()
            r.interrupt.set()
        if self._stop is not None:
            self._stop.set()

    async def _drain(self, jobs_tg: TaskGroup) -> None:
        # Recycling: every running job finishes, however long, until a
        # shutdown() (SIGTERM) comes; its grace counts from then.
        while self._recycling and any(r.active for r in self._runners):
            self._changed = asyncio.Event()
            await self._changed.wait()
        with anyio.move_on_after(self.shutdown_grace):
            while any(r.active for r in self._runners) and not self._force:
                self._changed = asyncio.Event()
                await self._changed.wait()
        if any(r.active for r in self._runners):
            # Out of patience: cancel the handlers; each releases its job (with
            # its carry) on the way out, under a shield.
            jobs_tg.cancel_scope.cancel()
