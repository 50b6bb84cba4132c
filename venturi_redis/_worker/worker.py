"""The worker: claims jobs, runs handlers, keeps leases, reclaims the dead.

Shape of a running worker (one anyio task group)::

    run()
    ├── lease keeper       one batched `extend` call per queue per tick
    │                      (keeper.py)
    ├── completer          per connection: finished runs' endings and the
    │                      claims that refill their slots, many per round trip
    │                      (completer.py)
    ├── per queue (runner.py):
    │   ├── claim loop     claims up to the free slots; when the queue has
    │   │                  nothing eligible, blocks on its wake list with the
    │   │                  next claim pipelined behind (one round trip per wake-up)
    │   ├── reclaimer      periodically takes back jobs whose lease expired
    │   └── scheduler      fires the queue's due schedules (scheduler.py)
    └── slot tasks         run the claimed jobs (at most `concurrency` handlers
                           per queue): execute.py runs one and returns its
                           ending, completer.py writes it; a batch KIND's
                           jobs run many per handler call (batch.py)

This module is the ``Worker`` itself: its arguments (checked by options.py),
registration, ``run`` and ``shutdown``, and one claimed job's way from its
handler to its written ending (``run_job``). The task groups ``run`` starts,
the drain and the signal watcher are serving.py (a mixin); the lease keeper,
which also renews the worker's registration, is keeper.py.

Every transition is one Lua script that checks the job's lease token, so a
worker that lost its lease (it hung, its connection dropped, the lease expired
and another worker reclaimed the job) can never complete, retry, pause or kill
a job it no longer owns: its late outcome is refused, journaled and logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Generic, cast

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup
from typing_extensions import TypeVar

from .._model.backoff import Backoff, to_ms
from .._model.endings import Released
from .._model.errors import ConfigurationError, TaskDefinitionError
from .._model.task import Task
from .._producer.client import Client, Queue
from .._producer.offload import OffloadFunction
from .._producer.retention import Retention
from .._producer.sharded import ShardedQueue
from .._store.store import KEEP_ALL, ClaimReply, Op
from . import options as _opt
from . import startup
from .completer import Completer
from .declared_limits import declared_limits
from .execute import execute
from .gc_tuning import FrozenStart
from .handler import BatchHandler, Handler, batch_settings, not_a_handler, sync_handle
from .job import Job
from .keeper import LeaseKeeper
from .recycle import Recycling
from .runner import (
    _IDLE_BLOCK_MAX,
    _MIN_BLOCK,
    RunnerSettings,
    _Runner,
)
from .scheduler import Scheduler, declared_schedules
from .serving import Serving
from .signals import SignalWatch
from .threads import HandlerThreads

if TYPE_CHECKING:
    from .._model.limits import Limit
    from .._model.schedule import Schedule
    from .metrics import WorkerObserver

log = logging.getLogger("venturi_redis.worker")
_DEFAULT_RETENTION = Retention()
_NOT_STARTED = "released on worker shutdown (not started)"
# Besides the claim, the scripts every job sends: expanded (2-4 ms each) at the
# first idle moment, not in the first job's completion, which the jobs
# enqueued meanwhile would wait out (W3's first jobs: benchmarks/w3_trace.py).
_JOB_PATH_SCRIPTS = ("complete", "extend")
StateT = TypeVar("StateT", default=None)


class Worker(Serving, Generic[StateT]):
    """Runs the handlers registered with it on jobs from one or more queues.

    Args:
        queues: A Queue, or several (each its own fault domain, with its own
            claim loop and its own ``concurrency`` slots). A ``ShardedQueue``
            stands for all its partitions, each a queue in that sense. Queue
            names (str) are accepted together with ``client``.
        client: The client that queue names are resolved on.
        state: The shared dependencies every handler receives (``App``).
        lifespan: Instead of ``state``: a function returning an async context
            manager (``@contextlib.asynccontextmanager``) that opens what the
            handlers share (a database pool, an HTTP client), yields it as
            their state, and closes it: entered as ``run()`` starts, exited
            once its last job ended (startup.py ``Lifespan``).
        concurrency: Handlers running at once, per queue.
        lease: Seconds a claim is valid without renewal. A running worker
            renews every ``lease / 3``; a dead worker's jobs are reclaimed
            after it expires. ``enqueue(lease=...)`` overrides it per job.
        max_failures: Retry backstop: failed runs after which a job goes to
            dead (pauses never count). ``None`` disables it.
        backoff: Default retry backoff (``Task.backoff()`` overrides it).
        jitter: Fraction of each retry delay shaved off, deterministically per
            job and attempt, so that retries of a burst spread out.
        batch_size: Most jobs taken by one claim (default: half of
            ``concurrency``, rounded up; docs/design.md, "The worker runtime");
            a worker with a ``vr.BatchHandler`` claims enough to fill batches.
        poll_interval: Longest an idle worker sleeps without a wake-up.
        reclaim_interval: Seconds between expired-lease sweeps
            (default ``min(lease / 2, 15)``).
        shutdown_grace: Seconds running jobs get to finish on shutdown before
            they are released back to pending with their carry.
        handle_signals: Turn SIGTERM / SIGINT into a graceful shutdown (a
            second signal skips the grace period). Only in the main thread.
        name: Shown as the lease owner (default ``host:pid:random``).
        retention: How long finished jobs are kept (``vr.Retention``: completed
            1 day, dead 7 days, cancelled 1 day by default); trimmed on the
            reclaim tick. ``None`` never removes them.
        check_eviction_policy: Refuse to start unless the server's
            ``maxmemory-policy`` is ``noeviction`` (an eviction could silently
            drop jobs). ``False`` skips that check; the version check stays.
        startup_wait: Seconds ``run()`` keeps trying a Redis it cannot reach
            at start (starting, loading its data, failing over) before it
            raises; ``0``: at once (startup.py; docs/deployment.md).
        observer: Told of every claim and every finished run (for metrics:
            ``vr.PrometheusMetrics``).
        freeze_gc: While running, keep the objects that existed when the
            worker started (imports, the application's setup) out of the
            garbage collector's full collections: the young generations
            collected and ``gc.freeze()`` at start, ``gc.unfreeze()`` at the
            end. A full collection walks every tracked object, and in a
            worker process that stalled the event loop for 20-30 ms about
            once per thousand jobs (the tail of pickup latency,
            docs/design.md). The one full collection that keeps old garbage
            from being frozen runs the first time the worker has nothing to
            run, not before its first jobs. Left alone when
            the process manages its collector itself (``gc`` disabled, or
            objects already frozen, beyond those CPython 3.12 freezes
            itself at start-up); ``False`` never touches it.
        gc_threshold: While running, the collector's young-generation
            threshold is at least this (CPython's default is 700 on 3.11
            and 3.12, 2,000 on 3.13): fewer collections of the young objects, and fewer of
            the older generations they trigger. Handlers that call out
            leave cyclic garbage behind (a redis-py command in the
            benchmark's handler, ~25 objects a job): at 700 the collector
            took ~5 µs per job, about a tenth of the worker's CPU, against
            ~1.6 µs at 5,000, whose young collections take ~0.1 ms each
            (docs/design.md, "The worker runtime"). Put back when the worker
            stops; never lowered; ``None`` leaves it as the process set it.
        health_file: A file touched at start and on every lease tick (a
            third of the lease) while the worker runs, for a liveness probe
            (docs/deployment.md): a blocked event loop stops touching it,
            Redis being down does not. ``None``: no file.
        schedules: Schedules declared in code (``vr.Schedule``), upserted on
            their queue (``Schedule.queue``, default the first) when the
            worker starts: a schedule already stored as declared is left as
            it is (its next fire time too). A stored schedule no longer
            declared is left alone (docs/schedules.md). Every worker fires
            the due schedules of its queues, declared or not.
        limits: Limits declared in code (``vr.Limit``), set on every queue
            of the worker when it starts, unless stored as declared already
            (docs/flow-control.md); a stored limit not declared is left alone.
        timeout: Seconds one run may take when its job sets no timeout of
            its own (``Task.timeout()``, ``enqueue(timeout=...)``). A run
            still going then is cancelled and counts as a failed run
            (retried with the backoff, dead past the backstop), journaled
            ``failed`` with a note saying it timed out and after how long.
            ``None`` (the default): no limit (docs/flow-control.md).
        blocked_loop_warning: Seconds the event loop may go without running
            (an ``async def handle`` that blocks it: no lease is renewed)
            before a warning names the job and the lines blocking it
            (loopwatch.py; docs/guarantees.md). ``None``: no watch.
        max_runs: Stop by itself once it has claimed this many runs, or
            (``max_memory_mib``) once its resident memory is above this many
            MiB; running jobs finish first, with no grace. ``venturi worker``
            then exits 0 and ``--processes`` starts a fresh child
            (recycle.py; docs/deployment.md). ``None``: no bound.
        log_runs: One INFO line per finished run on ``venturi_redis.worker``: its
            job, kind, queue, ending and duration (docs/observability.md, "Logs").

    Raises:
        ConfigurationError: An argument is out of range or of the wrong type
            (a bool is not a number here); the message names it.
    """

    def __init__(
        self,
        queues: Queue | ShardedQueue | str | Sequence[Queue | ShardedQueue | str],
        *,
        client: Client | None = None,
        state: StateT | None = None,
        lifespan: Callable[[], AbstractAsyncContextManager[StateT]] | None = None,
        concurrency: int = 16,
        lease: float = 30.0,
        max_failures: int | None = 25,
        backoff: Backoff | None = None,
        jitter: float = 0.25,
        batch_size: int | None = None,
        poll_interval: float = 5.0,
        reclaim_interval: float | None = None,
        shutdown_grace: float = 10.0,
        handle_signals: bool = True,
        name: str | None = None,
        retention: Retention | None = _DEFAULT_RETENTION,
        check_eviction_policy: bool = True,
        startup_wait: float = 30.0,
        observer: WorkerObserver | None = None,
        freeze_gc: bool = True,
        gc_threshold: int | None = 5_000,
        health_file: str | os.PathLike[str] | None = None,
        schedules: Sequence[Schedule] = (),
        timeout: float | None = None,
        limits: Sequence[Limit] = (),
        blocked_loop_warning: float | None = 1.0,
        max_runs: int | None = None,
        max_memory_mib: int | None = None,
        log_runs: bool = False,
    ) -> None:
        qs = _opt.worker_queues(queues, client)
        # Every other argument is checked here, where it is given, not when
        # run() first uses it (docs/guarantees.md, "Bad input").
        concurrency = _opt.count(concurrency, "concurrency")
        lease = _opt.seconds(lease, "lease")
        max_failures = _opt.optional_count(max_failures, "max_failures")
        backoff = _opt.instance_or_none(backoff, Backoff, "backoff", "a vr.Backoff")
        jitter = _opt.fraction(jitter, "jitter")
        poll_interval = _opt.seconds(poll_interval, "poll_interval")
        reclaim_interval = _opt.optional_seconds(reclaim_interval, "reclaim_interval")
        shutdown_grace = _opt.seconds(shutdown_grace, "shutdown_grace", zero=True)
        handle_signals = _opt.flag(handle_signals, "handle_signals")
        name = _opt.worker_name(name)
        retention = _opt.instance_or_none(retention, Retention, "retention", "a vr.Retention")
        check_eviction_policy = _opt.flag(check_eviction_policy, "check_eviction_policy")
        self.startup_wait = _opt.seconds(startup_wait, "startup_wait", zero=True)
        observer = _opt.observer(observer)
        freeze_gc = _opt.flag(freeze_gc, "freeze_gc")
        gc_threshold = _opt.optional_count(gc_threshold, "gc_threshold")
        timeout = _opt.optional_seconds(timeout, "timeout")
        self.blocked_loop_warning = _opt.optional_seconds(blocked_loop_warning, "blocked_loop_warning")
        self.max_runs = _opt.optional_count(max_runs, "max_runs")
        self.max_memory_mib = _opt.optional_count(max_memory_mib, "max_memory_mib")
        self.log_runs = _opt.flag(log_runs, "log_runs")
        self.recycling: Recycling | None = None  # made by each run() when a bound is set
        self._recycling = False  # stopping by itself: running jobs finish, with no grace
        self.health_file = _opt.path_or_none(health_file, "health_file")
        self.schedules = declared_schedules(schedules, qs)
        self.limits = declared_limits(limits)
        self.queues = qs
        self.lifespan = startup.Lifespan.of(lifespan, state)
        self.state = cast("StateT", state)  # None only while a lifespan has not made it
        self.concurrency = concurrency
        self.lease = lease
        self.lease_ms = to_ms(lease, "lease")
        if self.lease_ms < 1:
            raise ConfigurationError(f"lease must be at least 0.001 seconds, got {lease!r}")
        self.max_failures = max_failures
        self.timeout = timeout
        self.backoff = backoff or Backoff.fibonacci(1.0, 600.0)
        self.jitter = jitter
        self.batch_size = batch_size  # validated by the setter
        self.poll_interval = poll_interval
        # Longest single block of an idle claim on its queue's wake list: a
        # reply overdue by _BLOCK_MARGIN after it is how a dead connection (a
        # half-open one a NAT dropped, a server that stopped answering) shows,
        # so it is no longer than the lease renewal tick.
        self.idle_block = max(min(poll_interval, self.lease / 3, _IDLE_BLOCK_MAX), _MIN_BLOCK)
        if reclaim_interval is None:
            reclaim_interval = min(self.lease / 2, 15.0)
        self.reclaim_interval = reclaim_interval
        # Retention is trimmed on a reclaim tick, but not more often than the
        # shortest period needs (default periods are days: once a minute).
        shortest = min((retention.periods_ms() if retention else {}).values(), default=0) / 1000
        self.trim_interval = max(self.reclaim_interval, min(60.0, shortest))
        self.shutdown_grace = shutdown_grace
        self.handle_signals = handle_signals
        self.retention = retention
        # The bounds the completion scripts trim to as they complete (completer.py).
        self.retained = retention.retained() if retention is not None else KEEP_ALL
        self.check_eviction_policy = check_eviction_policy
        self.observer = observer
        self.freeze_gc = freeze_gc
        self.gc_threshold = gc_threshold
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._registry: dict[str, type[Any]] = {}
        settings = RunnerSettings(
            worker_id=self.id,
            lease_ms=self.lease_ms,
            idle_block=self.idle_block,
            poll_interval=self.poll_interval,
            reclaim_interval=self.reclaim_interval,
            trim_interval=self.trim_interval,
            retention=self.retention,
            max_failures=self.max_failures_arg,
        )
        self._runners = [_Runner(self, settings, q) for q in qs]
        # Each queue's scheduler looks at its due index every four reclaim
        # intervals (60 s by default), and at once when its runner's idle BLPOP
        # pops a schedules token (scheduler.py).
        self._schedulers = [
            Scheduler(q, lambda: self._registry, min(60.0, 4 * self.reclaim_interval)) for q in qs
        ]
        for runner, scheduler in zip(self._runners, self._schedulers, strict=True):
            runner.on_schedules_wake = scheduler.hint
        # Renews leases and, riding on the same tick, the worker's registration (keeper.py).
        self._keeper = LeaseKeeper(self.id, self._runners, qs, concurrency, self.lease_ms)
        # Writes each run's ending; the endings of one connection share round trips.
        self._completer = Completer(self, list({id(q.client): q.client for q in qs}.values()))
        self._stop: anyio.Event | None = None
        self._stopping = False
        self._force = False
        self._running = False
        self._changed = asyncio.Event()  # set whenever a job ends or shutdown escalates
        self._until_idle = False
        self._frozen_start = FrozenStart(False)  # made anew by each run()
        self._scripts_expanded = False
        # What a handler raised that stops the worker (KeyboardInterrupt, SystemExit):
        # run() raises it once the other jobs are released.
        self._fatal: KeyboardInterrupt | SystemExit | None = None
        # The slot tasks' task group while run() runs (a deferred completion's retry runs there).
        self._jobs_tg: TaskGroup | None = None
        # Sync handlers' threads: as many as the slots of every queue (threads.py).
        self.handler_threads = HandlerThreads(lambda: self.concurrency * len(self.queues))

    # -- registration --------------------------------------------------------------

    def register(self, *handlers: type[Handler[StateT]] | OffloadFunction[Any, Any]) -> Worker[StateT]:
        """Register Task+Handler classes (or ``@vr.offload`` functions) by their KIND."""
        for h in handlers:
            entry: type[Any] | OffloadFunction[Any, Any] = h
            if isinstance(h, OffloadFunction):
                from .offload import offload_handler  # only a worker of @vr.offload functions imports it

                entry = offload_handler(h)
            if not (isinstance(entry, type) and issubclass(entry, Task) and issubclass(entry, Handler)):
                raise TaskDefinitionError(not_a_handler(h))
            kind = entry.kind()
            entry.carry_type()  # fails now, not at the first run, if the carry is wrong
            entry.resume_adapter()  # likewise a RESUME type pydantic cannot validate
            sync_handle(entry)  # a `def handle` runs in a worker thread (threads.py)
            if issubclass(entry, BatchHandler):
                batch_settings(entry)  # checked again: a class attribute may have changed since
            existing = self._registry.get(kind)
            if existing is not None and existing is not entry:
                raise TaskDefinitionError(
                    f"KIND {kind!r} is already registered by {existing.__qualname__}; "
                    f"{entry.__qualname__} must use another KIND"
                )
            self._registry[kind] = entry
        return self

    @property
    def kinds(self) -> list[str]:
        """The registered KINDs."""
        return sorted(self._registry)

    # -- what the worker's parts ask of it (RunnerHost, RunHost, CompleterHost) -----------

    @property
    def registry(self) -> dict[str, type[Any]]:
        """The registered handler classes, by KIND."""
        return self._registry

    @property
    def running(self) -> bool:
        """Whether run() is running (the completer's batches send only then)."""
        return self._running

    @property
    def jobs_group(self) -> TaskGroup | None:
        """The slot tasks' task group while run() runs."""
        return self._jobs_tg

    async def claim(self, queue: Queue, op: Op[ClaimReply]) -> ClaimReply:
        """A claim loop's claim, in the round trip of the endings that freed its slots."""
        return await self._completer.claim(queue, op)

    def kind_label(self, kind: str) -> str:
        # Metrics labels: only registered kinds, so junk enqueued with random
        # KINDs cannot blow up the label cardinality.
        return kind if kind in self._registry else "unregistered"

    @property
    def batch_size(self) -> int:
        """Most jobs one claim takes: the ``batch_size`` given, else half of ``concurrency``.

        Half, not all, so that the slots do not run in step (docs/design.md,
        "The worker runtime", has the reason and the figures).
        """
        return self._batch_size or (self.concurrency + 1) // 2

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self._batch_size = _opt.optional_count(value, "batch_size")

    def only_queues(self, names: Sequence[str]) -> Worker[StateT]:
        """Consume only the queues called ``names`` (``venturi worker --queue``).

        A name is a queue this worker consumes, a sharded queue it consumes
        (meaning all its partitions), or one partition of it.
        """
        wanted = _opt.wanted_queues(self.queues, names)
        self.queues = [q for q in self.queues if q.name in wanted]
        self._runners = [r for r in self._runners if r.queue.name in wanted]
        self._schedulers = [s for s in self._schedulers if s.queue.name in wanted]
        # Registered (and renewing leases) on the queues it consumes, not on those it was built for.
        self._keeper = LeaseKeeper(self.id, self._runners, self.queues, self.concurrency, self.lease_ms)
        return self

    @property
    def max_failures_arg(self) -> str:
        """``max_failures`` as the scripts take it: a number, or 'none'."""
        return "none" if self.max_failures is None else str(self.max_failures)

    @property
    def stopping(self) -> bool:
        """Whether claiming has stopped (a shutdown, or a recycle)."""
        return self._stopping

    @property
    def shutting_down(self) -> bool:
        """Whether a run that starts now is asked to stop: a shutdown, not a recycle."""
        return self._stopping and not self._recycling

    # -- lifecycle -----------------------------------------------------------------

    def shutdown(self, *, grace: float | None = None) -> None:
        """Start a graceful shutdown: stop claiming, ask running jobs to stop.

        Jobs still running after the grace period are released back to pending
        with their carry (journaled as ``released``, not a failure). Called
        before ``run()`` has got going, it is kept: that run stops as it starts.
        """
        if grace is not None:
            self.shutdown_grace = _opt.seconds(grace, "grace", zero=True)
        if self._stopping and not self._recycling:
            self._force = True
        self._changed.set()  # a drain waits on it (a recycle's drain: the grace starts now)
        self._recycling = False
        for r in self._runners:
            for job in r.active.values():
                if job.ctx is not None:
                    job.ctx._cancel("worker shutting down")
        self._stop_claiming()

    async def run(self, *, until_idle: bool = False) -> None:
        """Run until ``shutdown()`` (or SIGTERM / SIGINT).

        With ``until_idle=True``, return once every queue has nothing running or
        pending (delayed and retry-waiting jobs included; suspended jobs don't
        count): for tests and batch jobs.

        Raises:
            KeyboardInterrupt: A handler raised it (so does ``SystemExit``):
                the worker stopped at once, released its other running jobs,
                recorded the culprit's run as failed, and re-raises it with a
                note naming the job (docs/guarantees.md).
            ConfigurationError: No handler is registered, or the worker is
                already running.
            redis.exceptions.ConnectionError: Redis did not answer within
                ``startup_wait`` (startup.py).
        """
        if not self._registry:
            raise ConfigurationError("no handlers registered: call worker.register(MyTaskHandler) first")
        if self._running:
            raise ConfigurationError("this worker is already running")
        watch = SignalWatch(self.id, self.shutdown)  # signals.py: from here to the end of run()
        with watch.installed(self.handle_signals):
            await self._run(watch, until_idle)
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal

    def crash(self, exc: KeyboardInterrupt | SystemExit, job: Job) -> None:
        """A handler raised ``exc``: stop now, and have run() raise it once the other jobs are released."""
        if self._fatal is None:
            exc.add_note(f"raised by the handler of job {job.id} ({job.kind}) on queue {job.queue.name}")
            self._fatal = exc
            log.critical(
                "worker %s: the handler of job %s (%s) raised %r; stopping (its other running jobs "
                "are released)",
                self.id,
                job.id,
                job.kind,
                exc,
            )
        self.shutdown()
        self._force = True  # no grace: the process is asked to stop
        self._changed.set()

    def _idle(self) -> None:
        """A claim loop is going to wait for work: if nothing runs anywhere, housekeeping."""
        if self._scripts_expanded and not self._frozen_start.pending:
            return  # all done: no walk of every queue's books per idle claim loop (many queues)
        if not any(r.active for r in self._runners):
            if not self._scripts_expanded:
                self._scripts_expanded = True
                for q in self.queues:
                    for name in _JOB_PATH_SCRIPTS:
                        q.store.sender.source(name)
            # After the scripts: the full collection frees what expanding them left.
            self._frozen_start.idle()

    # -- running one job ---------------------------------------------------------------

    async def run_job(self, runner: _Runner, job: Job) -> None:
        """Run a claimed job, from its handler to its written ending."""
        completer = self._completer
        try:
            if self._force:
                # Stopping at once (a handler raised KeyboardInterrupt or
                # SystemExit, or the grace ran out): a job a claim in flight
                # handed out meanwhile is not started. Started, it would be
                # cancelled at once, or run the culprit again and charge it
                # twice for one stop.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await completer.finish(job, Released(_NOT_STARTED), direct=True)
                return
            try:
                ending = await execute(self, job)
            except anyio.get_cancelled_exc_class():
                # The worker cancelled the run (the grace ran out, or run() was
                # cancelled): released with its carry, sent directly, since the
                # completer's senders are being cancelled too.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await completer.finish(job, Released("released on worker shutdown"), direct=True)
                raise
            if self._force:
                # Stopping at once (this handler, or another, raised SystemExit):
                # the batches may be gone, and this slot may be cancelled any moment.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await completer.finish(job, ending, direct=True)
            elif not completer.finish_soon(job, ending):
                await completer.finish(job, ending)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours: logged, its run failed
            await completer.internal_error(job, exc)  # its run ends failed now, not at its lease
        finally:
            if not job.deferred:  # else the completer settles it when its reply is in
                self._finish(runner, job)

    def job_done(self, job: Job) -> None:
        """A deferred completion is written (or given up on): off the books (``CompleterHost``)."""
        self._finish(job.runner, job)  # type: ignore[arg-type]  # a deferred job has its runner

    def _finish(self, runner: _Runner, job: Job) -> None:
        """The job's transition is written (or given up on): it leaves the worker's books."""
        if job.holds_slot:
            runner.release_slot(job)
        runner.active.pop(job.id, None)
        if self._until_idle or self._stopping:
            # Only a run that ends when the work does looks at what is left
            # (the claim loop's idle check, the drain's wait): a serving
            # worker's claim loop was woken when the job's slot came back.
            runner.poke.set()  # runner.wake()
            if self._until_idle and not runner.active:
                runner.interrupt.set()  # an idle wait is cut short to check whether all is done
            self._changed.set()
