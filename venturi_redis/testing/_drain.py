"""``drain()``: run a queue's jobs in a test until nothing is left to run.

Every job goes through the real scripts and the real codec, run by a real
``Worker``: a payload that cannot be stored, a carry that does not decode or a
merge that raises fails the test as it would fail in production. Only time is
not real: jobs that wait (a delay, a retry's backoff, a pause, a rate limit's
window) are made due by moving the client's ``Clock`` forward to the earliest
of them, never by sleeping.

What a worker would run, drain runs: jobs parked on a limit (flow control),
through the same claim and within the same caps, the jobs of an order key in
their key's order (a key whose holder a claim ended, an expired or cancelled
job, is let go at once instead of at the reclaim's next sweep), and the
schedules due on the clock, fired by the worker's own scheduler. Jobs waiting
on a paused order key, like suspended jobs, are left waiting. A schedule alone never moves the
clock (every schedule has a next fire time: drain would never end); a test
moves it (``clock.advance``) and drains again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Never, TypeVar, cast

import anyio

from .._model.errors import ConfigurationError, VenturiError
from .._model.records import JobInfo
from .._producer.base import server_now_ms
from .._producer.client import Queue
from .._producer.offload import OffloadFunction
from .._worker.declared_limits import declare_limits
from .._worker.handler import Handler
from .._worker.scheduler import declare
from .._worker.worker import Worker
from ._clock import Clock

# How long drain waits for a finished run before it looks at the queue anyway.
# Every run that ends tells drain at once (the worker's observer); this only
# bounds the wait when a job leaves the running set without a run ending
# (a job of a kind nobody registered is buried that way).
_RECHECK = 0.05
# lua/include/limits.lua's LIMIT_HELD: a limits:ready score from here up is a
# (kind, key) waiting for a slot to be freed, not for a time.
LIMIT_HELD = 4503599627370496


# The handlers' state: what ``state=`` gives must be what they take (Worker.register).
StateT = TypeVar("StateT")
# ``state``'s default: None at run time, typed Never so that the handlers alone
# decide StateT when no state is given (a None default would widen it).
_NO_STATE: Never = cast("Never", None)


class DrainLimitError(VenturiError):
    """drain() ran ``max_runs`` handler runs and the queue still had jobs to run."""


@dataclass
class DrainReport:
    """What one ``drain()`` did: its runs and the jobs it left finished or waiting.

    Each list holds the jobs that reached that state during the drain (a job
    that was already dead before it is not in ``dead``), oldest first.
    """

    runs: int = 0
    completed: list[JobInfo] = field(default_factory=list)
    dead: list[JobInfo] = field(default_factory=list)
    suspended: list[JobInfo] = field(default_factory=list)
    # How far drain moved the queue's clock, in milliseconds.
    advanced_ms: int = 0

    def job(self, job_id: str) -> JobInfo:
        """The reported job with id ``job_id`` (completed, dead or suspended)."""
        for info in (*self.completed, *self.dead, *self.suspended):
            if info.id == job_id:
                return info
        raise KeyError(f"job {job_id} did not complete, die or suspend during this drain")

    def notes(self) -> dict[str, str | None]:
        """Every reported job's note by id: what a test usually asserts on."""
        return {info.id: info.note for info in (*self.completed, *self.dead, *self.suspended)}


class _Runs:
    """The worker's observer: counts finished runs and wakes drain on each."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = anyio.Event()

    def job_claimed(self, queue: str, kind: str) -> None:
        pass

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        self.count += 1
        self.changed.set()

    async def wait(self) -> None:
        with anyio.move_on_after(_RECHECK):
            await self.changed.wait()
        self.changed = anyio.Event()


async def drain(
    queue: Queue,
    *handlers: type[Handler[StateT]] | OffloadFunction[Any, Any],
    state: StateT = _NO_STATE,
    max_runs: int = 1000,
    concurrency: int = 1,
    **worker_options: Any,
) -> DrainReport:
    """Run every job of ``queue`` that can run, until none is left, and report.

    A ``Worker`` with ``handlers`` registered runs the jobs, as it would in
    production: jobs of a limited kind within their limits, and the schedules
    due on the clock. Whenever nothing is running and nothing is due, but jobs
    wait for a later time (a delay, a retry's backoff, a pause, a rate
    limit's window), the queue's clock jumps to the earliest of them.
    Suspended jobs do not keep drain going: they are reported and stay
    suspended (``queue.resume(...)`` them and drain again).

    Args:
        queue: The queue to drain; its client's clock must be a ``Clock``
            (the ``venturi_client`` fixture's is) for drain to move time.
        *handlers: Task+Handler classes or ``@vr.offload`` functions.
        state: The worker's state, passed to every handler.
        max_runs: Most handler runs before drain gives up with
            ``DrainLimitError`` (a handler that pauses forever).
        concurrency: Jobs run at once (default 1: a test sees them in order).
        **worker_options: More ``vr.Worker`` arguments (``max_failures``,
            ``backoff``, ``lease``, ``schedules``, ``limits``...).

    Raises:
        DrainLimitError: ``max_runs`` runs did not empty the queue.
        ConfigurationError: jobs wait for a later time and the client's clock
            is not a ``Clock``.
    """
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ConfigurationError(f"max_runs must be a whole number >= 1, got {max_runs!r}")
    before = await _finished(queue)
    runs = _Runs()
    report = DrainReport()
    options: dict[str, Any] = {
        # A test's worker: no signal handlers, no retention trims, and the
        # process's collector left alone; a real server's eviction policy is
        # the operator's business, not the test's.
        "handle_signals": False,
        "check_eviction_policy": False,
        "retention": None,
        "freeze_gc": False,
        "gc_threshold": None,
        **worker_options,
    }
    worker: Worker[StateT] = Worker(queue, state=state, concurrency=concurrency, observer=runs, **options)
    worker.register(*handlers)
    # Declared now (as the worker does when it starts), so a schedule already
    # due is seen as due below, and one declared by this very drain exists
    # for the test's next drain after it moves the clock; limits likewise.
    await declare(worker.schedules)
    await declare_limits(worker.limits, worker.queues)
    while True:
        # One worker run per instant of the clock: it runs until nothing is
        # due and nothing runs, then stops, and the clock moves on.
        # shutdown() below stops the run even if it has not got going yet.
        await _let_go(queue, worker)
        if not await _settled(queue):
            if await _paused(queue):
                # No worker claims from a paused queue: drain would wait for ever.
                raise ConfigurationError(
                    f"queue {queue.name!r} is paused and has jobs due: drain would wait for ever; "
                    "resume it first (await queue.resume_queue())"
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                while not (await _settled(queue)) and runs.count < max_runs:
                    await runs.wait()
                    await _let_go(queue, worker)
                worker.shutdown()
        report.runs = runs.count
        next_due = await _next_due(queue)
        if next_due is None:
            break
        if runs.count >= max_runs:
            raise DrainLimitError(
                f"drain stopped after {runs.count} runs with jobs still pending on queue {queue.name!r} "
                "(a handler that pauses or fails forever?): raise max_runs if the work is that long"
            )
        clock = queue.client.clock
        if not isinstance(clock, Clock):
            raise ConfigurationError(
                f"queue {queue.name!r} has jobs waiting for a later time and its client reads Redis TIME: "
                "drain moves time only on a client made with clock=venturi_redis.testing.Clock() "
                "(the venturi_client fixture's)"
            )
        report.advanced_ms += max(0, next_due - clock())
        clock.advance_to(next_due)
    after = await _finished(queue)
    for state_name, target in (
        ("completed", report.completed),
        ("dead", report.dead),
        ("suspended", report.suspended),
    ):
        old = before[state_name]
        for job_id, score in after[state_name]:
            if dict(old).get(job_id) == score:
                continue  # there before the drain, untouched
            info = await queue.get(job_id)
            if info is not None:
                target.append(info)
    return report


# A job of a limited kind waits parked (flow control), its key in limits:ready
# scored by when it may be claimed: a time, or from 2**52 up (limits.lua's
# LIMIT_HELD and LIMIT_BLOCKED) a place in line for a slot, which a run ending
# frees. Only the times are a later time drain can move the clock to
# (tests/test_testing_plugin.py checks the constant against limits.lua).
_NOT_A_TIME = 2**52
# Limited keys whose rate window rolls first, looked at for one with parked jobs.
_READY_LOOK = 100


async def _settled(queue: Queue) -> bool:
    """Nothing running and nothing due now, read in one MULTI (no claim between the reads).

    Due: a pending job eligible now, a limited (kind, key) whose turn has come
    (``limits:ready``, scored by when it may run), a schedule to fire, or an
    order key to let go (``_let_go``). Jobs waiting on a paused order key, or
    behind a suspended holder, are not due: drain leaves them waiting, as it
    leaves suspended jobs (``Queue.is_drained`` says the same).
    """
    k = queue.keys
    now = await server_now_ms(queue.client)
    pipe = queue.client.redis.pipeline(transaction=True)
    pipe.zcard(k.running)
    pipe.scard(k.order_ended)
    for key in (*k.pending_high_first, k.limits_ready, k.schedules_due):
        pipe.zrangebyscore(key, "-inf", now, start=0, num=1)
    running, ended, *due = await pipe.execute()
    return int(running) == 0 and int(ended) == 0 and not any(due)


async def _let_go(queue: Queue, worker: Worker[Any]) -> None:
    """Let go now the order keys of the ordered jobs a claim ended (cancelled, expired,
    quarantined): the worker's reclaim does it at its next sweep, seconds away,
    and the key's next job may run (``order:ended``, lua/reclaim.lua)."""
    if await queue.client.redis.scard(queue.keys.order_ended):
        await queue.store.reclaim(batch=100, max_failures=worker.max_failures_arg)


async def _next_due(queue: Queue) -> int | None:
    """The earliest time (ms) a job may run: a pending job's eligibility, or the
    end of a limited job's rate window; None if no job waits for a time."""
    k = queue.keys
    pipe = queue.client.redis.pipeline(transaction=False)
    for key in k.pending_high_first:
        pipe.zrange(key, 0, 0, withscores=True)
    pipe.zrangebyscore(k.limits_ready, "-inf", f"({LIMIT_HELD}", start=0, num=1, withscores=True)
    pipe.exists(k.limits_parked)
    *reads, parked = await pipe.execute()
    if not parked:
        # A (kind, key) whose last job ran stays in the rotation until a claim
        # finds it empty, scored by its rate window's end: no job waits for that.
        reads.pop()
    firsts = [int(entries[0][1]) for entries in reads if entries]
    return min(firsts, default=None)


async def _paused(queue: Queue) -> bool:
    paused = await queue.client.redis.hget(queue.keys.meta, "paused")
    return paused in (b"1", "1")


async def _finished(queue: Queue) -> dict[str, list[tuple[str, float]]]:
    """Ids and scores of the completed, dead and suspended jobs, oldest first."""
    keys = {"completed": queue.keys.completed, "dead": queue.keys.dead, "suspended": queue.keys.suspended}
    pipe = queue.client.redis.pipeline(transaction=False)
    for key in keys.values():
        pipe.zrange(key, 0, -1, withscores=True)
    out: dict[str, list[tuple[str, float]]] = {}
    for name, entries in zip(keys, await pipe.execute(), strict=True):
        out[name] = [(raw.decode() if isinstance(raw, bytes) else str(raw), score) for raw, score in entries]
    return out
