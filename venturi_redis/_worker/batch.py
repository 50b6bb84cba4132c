"""Batch handlers: a batch KIND's claimed jobs, run many per ``handle_batch`` call.

A batch is several claimed jobs of one KIND handed to one handler call
(``vr.BatchHandler``, handler.py). Everything below the handler call is a
single job's: each job was claimed on its own by the claim script (limits,
priorities, expiry applied per job), keeps its own lease (renewed by the
keeper while it is in its runner's ``active``), and gets its own ending
(``_model/endings.py``) written by the completer on the same path as any
run's, so fencing, the journal and the backstop are unchanged.

How jobs become batches, per runner (one queue):

- ``Batching.place`` takes the claimed jobs of batch KINDs from the claim
  loop's dispatch into their KIND's forming batch. A forming batch holds one
  of the runner's ``concurrency`` slots from its first job to its handler's
  return: a batch is one handler call, whatever its size.
- A forming batch starts when it has ``BATCH_SIZE`` jobs, or ``BATCH_WAIT``
  seconds after its first job (0: as soon as the claim that brought it is
  dispatched, so a batch is at least what one claim brought).
- While a worker has a batch KIND, a claim asks for enough jobs to fill a
  batch, not only one per free slot; while its claims bring batch jobs
  only, a batch per free slot (up to ``MAX_CLAIM`` jobs per claim). An ordinary job
  such a claim brings beyond the free slots is *held* (claimed, its lease
  renewed, not started) until a slot frees; a batch job of a KIND whose new
  batch has no slot likewise. The claim loop places held jobs before it
  claims again, so no handler runs beyond ``concurrency``.
- While its claims bring batch jobs only, a claim goes out at once on a
  round trip of its own (runner.py's ``claim``), not in the completer's next
  pipeline: there it waited for the last claim's batches to run and went with
  their completions, so Redis and the worker took turns. Now Redis runs the
  next claim and the last completions while the batches run. The jobs ahead
  (claimed and waiting for a slot, or ended with their ending not yet
  written; a forming batch's jobs wait for their batch and do not count)
  stay within ``MAX_AHEAD``: past it the claim loop waits, looking again
  every ``_RECHECK`` seconds (an ending's write pokes nobody); with none
  ahead, it always claims. Every one of them is in the runner's ``active``,
  so its lease is renewed.
- At a shutdown, held jobs and forming batches are released unstarted.

A worker without a batch handler has no ``Batching`` (``runner.batching`` is
None): its claim loop and dispatch pay one ``is None`` test.

The dashboard shows a batch's jobs to each other by the run's note (no field
more for any job): every job of a batch ends with ``[batch LEAD of N]``
appended, LEAD being the batch's first job, whose own note also lists the
batch's job ids (``_model/batch_note.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._model import batch_note
from .._model.endings import COMPLETED, Completed, Ending, Failed, Released
from .._model.outcome import Outcome
from .execute import (
    _NO_TIMEOUT,
    RunHost,
    _cancel_was_asked,
    _past,
    error_ending,
    outcome_ending,
    start_run,
)
from .failure_log import failed_run
from .guarded import task_backoff, task_timeout
from .handler import BatchHandler, BatchItem, batch_settings, sync_batch
from .logcontext import RUNNING, BatchRun

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._producer.client import Queue
    from .completer import Completer
    from .job import Job

log = logging.getLogger("venturi_redis.worker")

# Most jobs one claim asks for to fill batches: a claim script runs alone on
# Redis, so it is kept to the size of enqueue_many's chunks (ENQUEUE_CHUNK).
# A larger BATCH_SIZE fills over several claims, within its BATCH_WAIT.
MAX_CLAIM = 500
# Most jobs a runner has ahead while its claims bring batch jobs only: claimed
# and waiting for a slot (a forming batch's jobs wait for their batch: not
# counted), or ended with their ending not yet written. Three claims' worth:
# one claim's batches running, the completions of the one before at Redis,
# and the next claim in flight (benchmarks/README.md, "Batch handlers against
# single jobs").
MAX_AHEAD = 3 * MAX_CLAIM
_RECHECK = 0.002
_NOT_STARTED = "released on worker shutdown (not started)"


class BatchHost(RunHost, Protocol):
    """What batching asks of its worker (the ``Worker`` is one)."""

    concurrency: int

    @property
    def completer(self) -> Completer:
        """Writes each run's ending."""

    @property
    def forcing(self) -> bool:
        """Whether the worker stops at once (no grace): endings go straight to Redis."""

    @property
    def jobs_group(self) -> TaskGroup | None:
        """The slot tasks' task group while run() runs: batches run there."""

    def job_done(self, job: Job) -> None:
        """The job's ending is written (or given up on): off the worker's books."""


class _Inbox(Protocol):
    def put(self, job: Job) -> None: ...


class BatchRunner(Protocol):
    """What batching asks of its runner (runner.py's ``_Runner`` is one)."""

    queue: Queue
    active: dict[str, Job]
    busy: int
    poke: asyncio.Event
    inbox: _Inbox


def batching_for(host: BatchHost, runner: BatchRunner) -> Batching | None:
    """The runner's batching, if its worker has a batch handler (else None: nothing to pay)."""
    kinds = {k: cls for k, cls in host.registry.items() if issubclass(cls, BatchHandler)}
    return Batching(host, runner, kinds) if kinds else None


class Batching:
    """One runner's forming batches and held jobs (see the module docstring)."""

    def __init__(self, host: BatchHost, runner: BatchRunner, kinds: dict[str, type[Any]]) -> None:
        self.host = host
        self.runner = runner
        self.batchers = {kind: _Batcher(self, cls) for kind, cls in kinds.items()}
        self.largest = min(MAX_CLAIM, max(b.size for b in self.batchers.values()))
        # Claimed jobs waiting for a slot, oldest first.
        self.held: deque[Job] = deque()
        # Whether an ordinary job came since the last claim was sized: a claim
        # then fills one batch only, so that a mixed queue's ordinary jobs are
        # not taken by the hundred to wait here for a slot.
        self.saw_ordinary = False
        # Whether the next claim goes out at once on a round trip of its own
        # (batch jobs only lately), not in the completer's next pipeline.
        self.claim_apart = False
        # Slots the batches hold (forming or in their handler), and the jobs of
        # the batches in their handler: what is not "ahead" (claimable()).
        self.slots = 0
        self.in_handlers = 0
        # How long the claim loop waits before it asks claimable() again when
        # the jobs ahead are at their bound (None: until it is poked).
        self.recheck: float | None = None

    def place(self, job: Job) -> bool:
        """Take a claimed job the dispatch cannot start at once: True if taken here.

        A batch KIND's job joins its forming batch; an ordinary job is taken
        only when no slot is free (it waits, held).
        """
        batcher = self.batchers.get(job.kind)
        if batcher is not None:
            if not batcher.add(job):
                self.held.append(job)
            return True
        self.saw_ordinary = True
        if self.held or self.runner.busy >= self.host.concurrency:
            if not self._place(job):
                self.held.append(job)
            return True
        return False

    def _place(self, job: Job) -> bool:
        batcher = self.batchers.get(job.kind)
        if batcher is not None:
            return batcher.add(job)
        runner = self.runner
        if runner.busy >= self.host.concurrency:
            return False
        job.holds_slot = True
        runner.busy += 1
        runner.inbox.put(job)
        return True

    def claimable(self, batch_size: int) -> int:
        """Place the held jobs that now fit; then how many jobs the next claim may ask for (0: wait)."""
        self.recheck = None
        held = self.held
        while held and self._place(held[0]):
            held.popleft()
        if held:
            return 0  # a slot first
        runner = self.runner
        free = self.host.concurrency - runner.busy
        # Forming batches hold their slot already; a larger one fills over several claims.
        room = min(MAX_CLAIM, sum(b.room for b in self.batchers.values()))
        ordinary, self.saw_ordinary = self.saw_ordinary, False
        self.claim_apart = not ordinary
        if free <= 0:
            return room
        # Only batch jobs lately: a batch per free slot, up to MAX_CLAIM (fewer
        # round trips: a drain of batch jobs is bound by them, not by the CPU).
        fill = self.largest if ordinary else min(MAX_CLAIM, free * self.largest)
        want = max(min(free, batch_size), room, fill)
        if ordinary:
            return want
        # Such a claim goes out while the last one's batches run (runner.py's
        # claim): the jobs ahead (claimed and waiting for a slot, or ended and
        # their ending not yet written) stay within MAX_AHEAD, which keeps the
        # claims from running ahead of the completions' writes. A forming
        # batch's jobs wait for their batch, not for a slot: not ahead. With
        # none ahead a claim always goes (a batch_size above the bound too).
        forming = sum(len(b.forming) for b in self.batchers.values())
        ahead = len(runner.active) - self.in_handlers - (runner.busy - self.slots) - forming
        if ahead > 0 and ahead + want > MAX_AHEAD:
            self.recheck = _RECHECK  # nothing pokes the claim loop when an ending is written
            return 0
        return want

    def stop(self) -> None:
        """The claim loop has stopped: held jobs and forming batches go back to pending, unstarted."""
        left = list(self.held)
        self.held.clear()
        for batcher in self.batchers.values():
            left += batcher.drop()
        tg = self.host.jobs_group
        if left and tg is not None:  # else the worker's own release of unstarted jobs takes them
            tg.start_soon(self._release, left)

    async def _release(self, jobs: list[Job]) -> None:
        host = self.host
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            for job in jobs:
                try:
                    await host.completer.finish(job, Released(_NOT_STARTED), direct=True)
                finally:
                    host.job_done(job)

    def slot_back(self) -> None:
        """A batch's handler returned: its slot can take another job or batch."""
        runner = self.runner
        runner.busy -= 1
        self.slots -= 1
        runner.poke.set()


class _Batcher:
    """One batch KIND's forming batch on one runner."""

    def __init__(self, batching: Batching, cls: type[Any]) -> None:
        self.batching = batching
        self.cls = cls
        self.size, self.wait = batch_settings(cls)
        self.sync = sync_batch(cls)
        self.forming: list[Job] = []
        self.timer: asyncio.Handle | None = None

    @property
    def room(self) -> int:
        """Jobs the forming batch still takes (0 when none is forming: a new one needs a slot)."""
        return self.size - len(self.forming) if self.forming else 0

    def add(self, job: Job) -> bool:
        """Add a claimed job to the forming batch (False: a new batch needs a slot, and none is free)."""
        forming = self.forming
        if not forming:
            b = self.batching
            if b.runner.busy >= b.host.concurrency:
                return False
            b.runner.busy += 1  # the batch's slot, until its handler returns
            b.slots += 1
            loop = asyncio.get_running_loop()
            # BATCH_WAIT 0: once the claim that brought this job is dispatched.
            self.timer = (
                loop.call_soon(self.start) if self.wait <= 0 else loop.call_later(self.wait, self.start)
            )
        forming.append(job)
        if len(forming) >= self.size:
            self.start()
        return True

    def start(self) -> None:
        """Run the forming batch now (it is full, or its wait is over)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        jobs, self.forming = self.forming, []
        if not jobs:
            return
        b = self.batching
        tg = b.host.jobs_group
        if tg is None:  # not running: the worker's release of unstarted jobs takes them
            b.slot_back()
            return
        tg.start_soon(self.run, jobs)

    def drop(self) -> list[Job]:
        """The forming batch's jobs, unstarted (a shutdown); its slot goes back."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        jobs, self.forming = self.forming, []
        if jobs:
            self.batching.slot_back()
        return jobs

    async def run(self, jobs: list[Job]) -> None:
        """Run one batch, from its handler call to every job's written ending (in a task of its own)."""
        RUNNING.set(BatchRun(jobs))  # what a record logged in this task belongs to (logcontext.py)
        b = self.batching
        host = b.host
        completer = host.completer
        try:
            b.in_handlers += len(jobs)
            try:
                endings = await execute_batch(host, self.cls, jobs, self.sync)
            finally:
                b.in_handlers -= len(jobs)
                b.slot_back()
        except anyio.get_cancelled_exc_class():
            # The worker cancelled the run (the grace ran out, or run() was
            # cancelled): every job released with its carry, directly.
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                for job in jobs:
                    try:
                        await completer.finish(job, Released("released on worker shutdown"), direct=True)
                    finally:
                        host.job_done(job)
            raise
        direct = host.forcing
        async with anyio.create_task_group() as tg:
            for job, ending in zip(jobs, endings, strict=True):
                if type(ending) is Completed and not direct:
                    # Handed to the connection's batch at once (deferred): nothing to wait for.
                    try:
                        await completer.finish(job, ending)
                    except Exception:
                        log.exception("queue %s: internal error ending job %s", job.queue.name, job.id)
                    if not job.deferred:
                        host.job_done(job)
                else:
                    tg.start_soon(_finish, host, job, ending, direct)


async def _finish(host: BatchHost, job: Job, ending: Ending, direct: bool) -> None:
    try:
        await host.completer.finish(job, ending, direct=direct)
    except Exception:
        log.exception("queue %s: internal error ending job %s", job.queue.name, job.id)
    finally:
        if not job.deferred:  # else the completer settles it when its reply is in
            host.job_done(job)


async def execute_batch(host: RunHost, cls: type[Any], jobs: list[Job], sync: bool) -> list[Ending]:
    """Run one batch's handler: each job's ending, in order (raises only a cancellation asked of it)."""
    endings: list[Ending | None] = [None] * len(jobs)
    items: list[BatchItem[Any]] = []
    ran: list[int] = []  # the positions of the jobs in the handler's call
    registry = host.registry
    for i, job in enumerate(jobs):
        started = start_run(host, cls, job, registry)
        if not isinstance(started, tuple):
            endings[i] = (
                started  # its data does not decode (dead) or cannot be decrypted here: not in the call
            )
            continue
        items.append(BatchItem(*started))
        ran.append(i)
    if items:
        ran_jobs = [jobs[i] for i in ran]
        returned = await _call(host, cls, items, ran_jobs, sync)
        for i, ending in zip(
            ran, _marked(_endings(host, cls, items, ran_jobs, returned), ran_jobs), strict=True
        ):
            endings[i] = ending
    return [e for e in endings if e is not None]


async def _call(
    host: RunHost, cls: type[Any], items: list[BatchItem[Any]], jobs: list[Job], sync: bool
) -> Any:
    """The handler's call: what it returned, or the exception it raised (as a value), or the
    timeout (a ``_TimedOut``); a cancellation the worker asked for is raised."""
    limit = _limit(host, items, jobs)
    try:
        try:
            with anyio.move_on_after(math.inf if limit is None else limit) as scope:
                returned = await (
                    _in_thread(host, cls, items) if sync else cls.handle_batch(items, host.state)
                )
            if limit is not None and _past(scope):
                return _TimedOut(limit)
            return returned
        finally:
            for item in items:
                ctx = item.ctx
                if ctx._progress is not None:  # a held-back report lands before the ending
                    with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                        await ctx._progress.end()
                    ctx._progress = None
                ctx._job = None
    except anyio.get_cancelled_exc_class() as exc:
        if not _cancel_was_asked():
            return _StrayCancel(exc)
        raise  # the batch's jobs are released (_Batcher.run)
    except GeneratorExit:
        raise  # this coroutine itself is being closed: nothing may be awaited
    except BaseException as exc:  # noqa: BLE001 - every job of the batch fails with it
        return _Raised(exc)


async def _in_thread(host: RunHost, cls: type[Any], items: list[BatchItem[Any]]) -> Any:
    """A sync ``handle_batch`` in a worker thread, as a sync ``handle`` runs (threads.py)."""
    loop = asyncio.get_running_loop()
    for item in items:
        item.ctx._loop = loop  # ctx.from_thread() runs coroutines on this loop
    label = f"a batch of {len(items)} from {items[0].ctx.job_id} ({items[0].ctx.kind})"
    try:
        returned = await host.handler_threads.run(label, cls.handle_batch, items, host.state)
    except asyncio.CancelledError:
        for item in items:
            item.ctx._cancel("the run was ended (its timeout, or the worker's shutdown) while its thread ran")
        raise
    if asyncio.iscoroutine(returned) or isinstance(returned, asyncio.Future):
        returned = await returned  # a `def` returning a coroutine: an async def under a decorator
    return returned


class _TimedOut:
    def __init__(self, limit: float) -> None:
        self.limit = limit


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _StrayCancel:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _endings(
    host: RunHost, cls: type[Any], items: list[BatchItem[Any]], jobs: list[Job], returned: Any
) -> list[Ending]:
    """Each item's ending, from what the handler's call came to."""
    n = len(items)
    if returned is None:
        return [COMPLETED] * n
    if isinstance(returned, _TimedOut):
        note = f"timed out after {returned.limit:g} s (the batch's handle_batch call)"
        for item in items:
            failed_run(item.ctx.job_id, item.ctx.kind, "timeout", note)
        return [Failed(note, backoff=task_backoff(item.task)) for item in items]
    if isinstance(returned, _StrayCancel):
        note = "the handler raised CancelledError, which the worker did not ask for"
        return [Failed(note, backoff=task_backoff(item.task)) for item in items]
    if isinstance(returned, _Raised):
        # A raise fails every job of the batch, each as its own raise would.
        exc = returned.exc
        return [error_ending(host, j, item.task, item.ctx, exc) for item, j in zip(items, jobs, strict=True)]
    if not isinstance(returned, Sequence) or isinstance(returned, (str, bytes)):
        got = type(returned).__name__
        note = (
            f"{cls.__qualname__}.handle_batch() must return None or a sequence of one vr.Outcome "
            f"or exception per item, got {got}; every job of the batch failed"
        )
        return [_failed(item, note) for item in items]
    if len(returned) != n:
        note = (
            f"{cls.__qualname__}.handle_batch() returned {len(returned)} entries for a batch of "
            f"{n} jobs (one per item, in order); every job of the batch failed"
        )
        return [_failed(item, note) for item in items]
    endings: list[Ending] = []
    for item, job, entry in zip(items, jobs, returned, strict=True):
        if isinstance(entry, Outcome):
            endings.append(outcome_ending(item.task, entry, job))
        elif isinstance(entry, (KeyboardInterrupt, SystemExit)):
            # Returned, not raised: this job's failure, not the process's stop.
            endings.append(
                _failed(item, f"handle_batch() returned {entry!r} for this job", type(entry).__name__)
            )
        elif isinstance(entry, BaseException):
            endings.append(error_ending(host, job, item.task, item.ctx, entry))
        else:
            got = type(entry).__name__
            note = (
                f"{cls.__qualname__}.handle_batch()'s entry for this job is a {got}, "
                "not a vr.Outcome or an exception"
            )
            endings.append(_failed(item, note))
    return endings


def _failed(item: BatchItem[Any], note: str, error_type: str = "TypeError") -> Ending:
    failed_run(item.ctx.job_id, item.ctx.kind, error_type, note)
    return Failed(note, error_type, backoff=task_backoff(item.task))


def _limit(host: RunHost, items: list[BatchItem[Any]], jobs: list[Job]) -> float | None:
    """The batch's run timeout: the shortest of its jobs' (None: none has one)."""
    limits: list[float] = []
    for item, job in zip(items, jobs, strict=True):
        task = item.task
        if job.timeout_ms:
            limits.append(job.timeout_ms / 1000)
            continue
        value = host.timeout if type(task).timeout is _NO_TIMEOUT else task_timeout(task, host.timeout)
        if value is not None:
            limits.append(value)
    return min(limits, default=None)


def _marked(endings: list[Ending], jobs: list[Job]) -> list[Ending]:
    """``endings`` with the batch's mark appended to each note (the dashboard's batch-mates)."""
    lead = jobs[0].id
    mate = batch_note.mark(lead, len(jobs))
    mate_done = Completed(mate)  # the usual ending of a batch-mate, made once per batch
    out: list[Ending] = []
    for k, ending in enumerate(endings):
        text = mate if k else batch_note.mark(lead, len(jobs), [job.id for job in jobs])
        if ending is COMPLETED:
            out.append(mate_done if k else Completed(text))
            continue
        note = getattr(ending, "note", "")
        try:
            out.append(dataclasses.replace(ending, note=f"{note} {text}" if note else text))
        except TypeError:
            out.append(ending)
    return out
