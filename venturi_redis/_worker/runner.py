"""The per-queue half of a worker: claim loop, idle wake-ups, reclaim, lease renewal.

A ``_Runner`` claims jobs for one queue and hands them to the worker's slot
tasks through its ``Inbox`` (inbox.py). When the queue has nothing eligible, its claim
loop blocks on the queue's wake list with the next claim pipelined behind
(docs/design.md, "Waking workers").

The runner knows its worker through ``RunnerHost`` and ``RunnerSettings``
below, never by importing worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.codec import text
from .._producer.client import Queue
from .._producer.retention import Retention
from .._store.store import ClaimReply, Op
from .._transport.errors import TRANSIENT, server_full
from .._transport.redispy import socket_timeout, unpooled_connection
from .grouped import GroupedRunner
from .guarded import observer_raised
from .housekeeping import reclaim
from .inbox import Inbox
from .interrupt import Interrupt
from .job import Job, jobs_of
from .logcontext import RUNNING, Slot
from .lost_claims import LostClaims
from .waiting import WaitGroup, can_block

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .batch import Batching
    from .metrics import WorkerObserver
    from .recycle import Recycling

log = logging.getLogger("venturi_redis.worker")

# What the background loops (claim, reclaim, lease renewal) survive: any Redis
# error, not only a dropped connection. An error reply (OOM at maxmemory,
# READONLY during a failover, a script error) is logged and the loop tries
# again on its next tick, instead of taking the whole worker down with it.
_SURVIVABLE = (RedisError, OSError)
# An idle worker blocks on its queue's wake list for at most this long (and
# never longer than poll_interval) before it claims anyway: the claim that
# follows a timeout finds delayed jobs that came due, and a reply that does not
# come within the block plus _BLOCK_MARGIN means the connection is dead.
_IDLE_BLOCK_MAX = 5.0
_BLOCK_MARGIN = 1.5
_MIN_BLOCK = 0.01  # shorter waits are plain sleeps followed by a claim


async def _reply(conn: Any) -> Any:
    """The next reply on ``conn``; an error reply is returned, not raised (the next is still to read)."""
    try:
        return await conn.read_response()
    except ResponseError as exc:
        return exc


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """The worker's settings its runners read, fixed when the Worker is built."""

    worker_id: str
    lease_ms: int
    # Longest single block of an idle claim (Worker.__init__ says why).
    idle_block: float
    poll_interval: float
    reclaim_interval: float
    trim_interval: float
    retention: Retention | None
    max_failures: str  # as the scripts take it: a number, or "none"


class RunnerHost(Protocol):
    """What a runner asks of its worker as it runs (the ``Worker`` is one).

    The runner knows its worker only through this and ``RunnerSettings``:
    runner.py never imports worker.py.
    """

    concurrency: int
    observer: WorkerObserver | None
    recycling: Recycling | None  # Worker(max_runs=..., max_memory_mib=...)

    @property
    def batch_size(self) -> int: ...

    @property
    def stopping(self) -> bool: ...

    async def claim(self, queue: Queue, op: Op[ClaimReply]) -> ClaimReply:
        """Send a claim (in the same round trip as the endings that freed its slots, while running)."""

    async def run_job(self, runner: _Runner, job: Job) -> None:
        """Run a claimed job from the handler to its transition."""

    def _idle(self) -> None:
        """A claim loop is about to wait for work."""

    @property
    def jobs_group(self) -> TaskGroup | None:
        """The slot tasks' task group while run() runs (a runner that starts its slots lazily)."""

    def kind_label(self, kind: str) -> str:
        """The metrics label for a KIND."""


class _Runner(GroupedRunner):
    """The per-queue half of a worker: its claim loop and active jobs (the sweep reclaims:
    housekeeping.py; a wait group's part is grouped.py's)."""

    host: RunnerHost
    settings: RunnerSettings

    def __init__(self, host: RunnerHost, settings: RunnerSettings, queue: Queue) -> None:
        self.host = host
        self.settings = settings
        self.queue = queue
        # Every job this worker holds a lease on, until its transition is written.
        self.active: dict[str, Job] = {}
        # Jobs whose handler is still running: what `concurrency` limits.
        self.busy = 0
        self.poke = asyncio.Event()
        self.idle = False
        # Claimed jobs on their way to the slot tasks (made anew by each run()).
        self.inbox = Inbox()
        # Set to cut an idle wait short (shutdown; the last job of an
        # until_idle run finishing): pushes onto this worker's stop list.
        self.interrupt = Interrupt()
        self.stop_key = queue.keys.wake_stop(settings.worker_id)
        # A producer that creates or resumes a schedule leaves one token on this
        # list; the idle BLPOP that pops it (the same command, one more key)
        # tells the queue's scheduler to look now (scheduler.py).
        self.schedules_wake = queue.keys.schedules_wake
        self.on_schedules_wake: Callable[[], None] | None = None
        # The connection idle claims block on (None until the first one, and
        # after a failure). Not from the pool: it is held for seconds at a time.
        self._conn: Any = None
        # When the server's refusal of it may be logged again (_note_refused).
        self._refused_logged = 0.0
        # Forming batches and held jobs, when the worker has a batch handler
        # (batch.py; set by each run()): None costs the dispatch one test.
        self.batching: Batching | None = None
        # The last claim's token base and send time: noted if its reply is lost (lost_claims.py).
        self._claim_base = ""
        self._claim_sent = 0.0
        self.lost = LostClaims(queue, settings.worker_id, settings.lease_ms)
        # The wait group whose connection blocks for this queue when idle (a
        # worker with many queues: waiting.py; set by each run()), else None.
        self.group: WaitGroup | None = None
        self.done = False  # its claim loop has ended (a wait group stops waiting for it)
        self.slots_left = 0  # slot tasks still to start as jobs come (start_slots_lazily)
        self.short = False  # in a wait group: its last claim came back short (it is idle)
        # Bounds the calls the worker's claim loops and schedulers make beside the
        # completer's pipelines (a lost claim's look, the idle drain check): set by
        # each run(), so that 1,000 queues do not ask for 1,000 connections at once.
        self.side_calls: AbstractAsyncContextManager[Any] = contextlib.nullcontext()

    async def slot(self) -> None:
        """One long-lived task that runs claimed jobs one after another.

        Cheaper than a task per job (a task group spawn costs more than a
        no-op job's whole run). A run's slot is given back to the claim loop
        once its handler is done, while this task still waits for the run's
        transition, so a runner has twice ``concurrency`` of these.
        """
        run_job = self.host.run_job
        # Which job a record logged meanwhile belongs to: set once per slot task,
        # its job per run (a ContextVar.set and reset per run: 3% of a no-op job, logcontext.py).
        slot = Slot()
        RUNNING.set(slot)
        while True:
            # A job already waiting is taken without a coroutine; else wait for one.
            job = self.inbox.take()
            if job is None and (job := await self.inbox.get()) is None:
                return
            slot.job = job
            try:
                await run_job(self, job)
            finally:
                slot.job = None

    def wake(self) -> None:
        self.poke.set()

    def release_slot(self, job: Job) -> None:
        """The job's handler is done: its slot can take another job."""
        if job.holds_slot:
            job.holds_slot = False
            self.busy -= 1
            self.poke.set()

    def _claim_op(self, count: int, stop_key: str | None = None) -> Op[ClaimReply]:
        s = self.settings
        self._claim_base, self._claim_sent = secrets.token_hex(8), time.time()
        return self.queue.store.claim_op(
            count=count,
            worker=s.worker_id,
            token_base=self._claim_base,
            default_lease_ms=s.lease_ms,
            stop_key=stop_key,
        )

    async def claim(self, count: int) -> tuple[int, int, list[Job]]:
        op = self._claim_op(count)
        if self.batching is not None and self.batching.claim_apart:
            # Batch jobs only lately: the claim goes out now, on a round trip
            # of its own, while the last claim's batches run (batch.py).
            claimed = await self.queue.store.send(op)
        else:
            claimed = await self.host.claim(self.queue, op)
        return claimed.now, claimed.next, jobs_of(self.queue, claimed)

    async def idle_claim(self, want: int, seconds: float) -> tuple[int, int, list[Job]] | None:
        """Wait for a wake-up token (at most ``seconds``), then claim up to ``want`` jobs.

        On a plain Redis the claim is pipelined behind ``BLPOP wake stop`` on
        a connection of its own: Redis runs it the moment a token unblocks the
        BLPOP (or the BLPOP times out), so a job enqueued for an idle worker
        reaches it in one round trip, not a wake-up and then a claim. On
        Redis Cluster and in durable mode (whose claims must be followed by
        WAIT) the BLPOP goes through the client and the claim follows it.

        The claimed jobs are handed to the slot tasks here, the moment the
        reply is in. Returns None when ``interrupt`` cut the wait short and
        nothing was claimed.
        """
        if self.group is not None:
            return await self._grouped_claim(want, seconds)
        block = min(seconds, self.settings.idle_block)
        if block < _MIN_BLOCK:
            await self._wait(block)
            got = await self.claim(want)
            self._dispatch(got[2], got[0])
            return got
        result: tuple[int, int, list[Job]] | None = None
        # An interrupt during the block pushes our stop tokens, from a task of
        # its own, started by the interrupt itself. Not a watcher task per
        # block: cancelled at the end of every block, it left ~33 objects of
        # cyclic garbage per idle wake-up (its CancelledError's traceback and
        # frames), a young collection of 1-2 ms every ~125 W3 jobs.
        stopping: asyncio.Task[None] | None = None

        def interrupted() -> None:
            nonlocal stopping
            stopping = asyncio.get_running_loop().create_task(self._push_stop())

        self.interrupt.on_set(interrupted)
        try:
            try:
                if can_block(self.queue.client):
                    try:
                        result = await self._armed_claim(want, block)
                    except RedisConnectionError as exc:
                        if not server_full(exc):
                            raise
                        # Refused at maxclients, nothing sent: a pooled one this time.
                        self._note_refused(exc)
                        result = await self._blpop_then_claim(want, block)
                else:
                    result = await self._blpop_then_claim(want, block)
            except TRANSIENT as exc:
                if not server_full(exc):  # (the pool's are fine; the server may not give them back)
                    await self._drop_idle_connections()
                raise
            if result is not None:
                self._dispatch(result[2], result[0])
        finally:
            self.interrupt.on_set(None)
            if stopping is not None:
                # Our stop tokens, once pushed, if the claim did not take them
                # (it ran before they came): deleted after the push, not before.
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(2 * _BLOCK_MARGIN),
                    contextlib.suppress(*_SURVIVABLE),
                ):
                    await asyncio.shield(stopping)
                    await self.queue.client.redis.delete(self.stop_key)
        if result is None or (stopping is not None and not result[2]):
            return None
        return result

    def _note_refused(self, exc: BaseException) -> None:
        """The idle claims' own connection was refused (maxclients): logged once a minute at most."""
        now = time.monotonic()
        if now >= self._refused_logged:
            self._refused_logged = now + 60.0
            log.warning(
                "queue %s: Redis refused this worker's idle-claim connection (%s); its idle waits "
                "use one of the client's pooled connections until the server takes it "
                '(docs/deployment.md, "Connections each part holds")',
                self.queue.name,
                exc,
            )

    async def _drop_idle_connections(self) -> None:
        # The idle pooled connections likely went the same way as this one (a
        # restarted server, a dropped network path): close them now, so the
        # next claim opens a fresh one instead of first waiting out a socket
        # timeout on a dead one. Connections in use are left to their own
        # calls' timeouts.
        pool = getattr(self.queue.client.redis, "connection_pool", None)
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.disconnect(inuse_connections=False)

    async def _push_stop(self) -> None:
        # Two tokens: BLPOP takes one, the claim behind it finds the other
        # (and claims nothing). The expiry cleans up after a worker that died here.
        pipe = self.queue.client.redis.pipeline(transaction=False)
        pipe.rpush(self.stop_key, "1", "1")
        pipe.pexpire(self.stop_key, 60_000)
        with anyio.move_on_after(_BLOCK_MARGIN), contextlib.suppress(*_SURVIVABLE):
            await pipe.execute()

    async def _armed_claim(self, want: int, block: float) -> tuple[int, int, list[Job]]:
        q = self.queue
        conn = self._conn
        if conn is None:
            # The deadline below bounds the whole exchange instead. (redis-py's
            # per-read timeout is no use here: when it expires, read_response
            # returns None, which is also BLPOP's reply when it times out.)
            conn = self._conn = unpooled_connection(q.client.redis.connection_pool, untimed=True)
        op = self._claim_op(want, self.stop_key)
        commands = [
            ("BLPOP", q.keys.wake, self.stop_key, self.schedules_wake, f"{block:.3f}"),
            q.store.sender.packed(op.call),
        ]
        limit = block + _BLOCK_MARGIN
        try:
            with anyio.fail_after(limit):
                await conn.send_packed_command(conn.pack_commands(commands))
                # Both replies are read before an error reply is raised: raised
                # at the BLPOP's (WRONGTYPE, BUSY while a script runs past its
                # time, MISCONF), the claim's was left unread, and every later
                # exchange on this connection read the one before's replies
                # (the worker died parsing a BLPOP's as a claim's).
                popped = await _reply(conn)  # a token, a stop, nil (timed out), or an error
                reply = await _reply(conn)
        except TimeoutError:
            self._conn = None
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await conn.disconnect()
            raise RedisTimeoutError(f"no reply to BLPOP on {q.keys.wake} in {limit:.2f}s") from None
        except BaseException:
            # A reply may be unread (a timeout, a cancel): the connection is unusable.
            self._conn = None
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await conn.disconnect()
            raise
        # Both replies are read: the connection is fine, whatever they say.
        blpop_failed = isinstance(popped, ResponseError)
        if isinstance(reply, NoScriptError):
            # The script cache was flushed (a restart, SCRIPT FLUSH). The
            # claim did not run: run it the ordinary way.
            got = await self.claim(want)
        elif isinstance(reply, ResponseError):
            # A coded error is mapped; the BLPOP's error, if any, comes first.
            raise popped if blpop_failed else q.store.sender.map_error(reply)
        else:
            claimed = op.parse(reply)
            got = claimed.now, claimed.next, jobs_of(q, claimed)
        if not blpop_failed:
            self._popped(popped)
        elif not got[2]:
            # Nothing claimed: the BLPOP's error is the claim loop's to log and
            # back off from. Jobs claimed behind it are ours to run all the
            # same (dropped, they would wait out their lease unseen).
            raise popped
        return got

    def _popped(self, popped: Any) -> None:
        """What an idle BLPOP popped: a schedules token pokes the scheduler."""
        if popped and self.on_schedules_wake is not None and text(popped[0]) == self.schedules_wake:
            self.on_schedules_wake()

    async def _blpop_then_claim(self, want: int, block: float) -> tuple[int, int, list[Job]] | None:
        q = self.queue
        redis = q.client.redis
        # The read must outlast the block under the client's own socket timeout.
        timeout = socket_timeout(redis)
        if timeout:
            block = max(_MIN_BLOCK, min(block, timeout - _BLOCK_MARGIN))
        try:
            with anyio.fail_after(block + _BLOCK_MARGIN):
                popped = await redis.blpop([q.keys.wake, self.stop_key, self.schedules_wake], timeout=block)
        except TimeoutError:
            limit = block + _BLOCK_MARGIN
            raise RedisTimeoutError(f"no reply to BLPOP on {q.keys.wake} in {limit:.2f}s") from None
        self._popped(popped)
        if self.interrupt.is_set():
            return None
        return await self.claim(want)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    async def claim_loop(self, until_idle: bool) -> None:
        self.done = False
        try:
            await self._claim_loop(until_idle)
        finally:
            self.done = True
            if self.group is not None:
                self.group.changed()  # it no longer waits for this queue
            if self.batching is not None:
                self.batching.stop()  # held jobs and forming batches: released unstarted

    async def _claim_loop(self, until_idle: bool) -> None:
        w = self.host
        failures = 0
        # After a claim that came back short: how long the next one may wait
        # for a wake-up before it claims anyway (None: claim now).
        idle_for: float | None = None
        while not w.stopping:
            if self.lost.pending:
                async with self.side_calls:
                    await self.lost.release()
            free = w.concurrency - self.busy
            if self.batching is not None:
                # Held jobs placed first; then enough to fill a batch (batch.py).
                free = self.batching.claimable(w.batch_size)
            if free <= 0:
                if self.batching is not None and self.batching.recheck is not None:
                    # Batch jobs ahead at their bound: look again soon (a plain
                    # sleep: a timed-out wait leaves garbage for the collector).
                    await anyio.sleep(self.batching.recheck)
                else:
                    self.poke = asyncio.Event()
                    await self._wait(None)
                idle_for = None
                continue
            # Fresh events before the claim: a wake-up or an interrupt that
            # lands while the claim is in flight is kept, not lost.
            self.poke = asyncio.Event()
            self.interrupt = Interrupt()
            want = min(free, w.batch_size) if self.batching is None else free
            recycling = w.recycling
            if recycling is not None:
                want = recycling.reserve(want)  # max_runs: never more than is left
                if not want:  # another queue's claim holds what is left: it settles soon
                    await anyio.sleep(0.05)
                    continue
            try:
                if idle_for is None:
                    now, nxt, jobs = await self.claim(want)
                    self._dispatch(jobs, now)
                else:
                    got = await self.idle_claim(want, idle_for)  # its jobs are dispatched
                    idle_for = None
                    if got is None:
                        if recycling is not None:
                            recycling.settle(want, 0)
                        continue
                    now, nxt, jobs = got
                failures = 0
                if recycling is not None:
                    recycling.settle(want, len(jobs))
            except _SURVIVABLE as exc:
                if isinstance(exc, TRANSIENT) and self._claim_base:
                    self.lost.note(self._claim_base, self._claim_sent)  # it may have run
                if recycling is not None:
                    recycling.settle(want, 0)
                failures += 1
                delay = min(0.05 * 2**failures, 5.0)
                log.warning("queue %s: claim failed (%s); retrying in %.2fs", self.queue.name, exc, delay)
                await self._wait(delay)
                idle_for = None
                continue
            if len(jobs) == want:
                continue
            if jobs:
                # Going idle with jobs just handed out: let their slot tasks
                # start the handlers before this loop spends its time arming
                # the next idle claim (pickup latency, W3 in benchmarks/).
                await anyio.lowlevel.checkpoint()
            if until_idle and not self.active:
                async with self.side_calls:
                    drained = await self.queue.is_drained()
                if drained:
                    self.idle = True
                    return
            w._idle()
            idle_for = self.settings.poll_interval
            if nxt > 0:
                idle_for = min(idle_for, max(0.0, (nxt - now) / 1000))

    def _dispatch(self, jobs: list[Job], now: int = 0) -> None:
        """Hand claimed jobs to the slot tasks; each holds a slot until its handler is done.

        ``now``: the claim's clock (ms), for an observer's ``job_waited``.
        """
        self._claim_base = ""  # its reply is in: nothing of it is lost
        w = self.host
        batching = self.batching
        if w.observer is None and batching is None:  # the usual worker: nothing to tell, nothing held
            active, put = self.active, self.inbox.put
            self.busy += len(jobs)
            for job in jobs:
                active[job.id] = job
                job.runner = self
                job.holds_slot = True
                put(job)
            return
        waited = getattr(w.observer, "job_waited", None) if w.observer is not None else None
        for job in jobs:
            self.active[job.id] = job
            if w.observer is not None:
                kind = w.kind_label(job.kind)
                try:
                    w.observer.job_claimed(self.queue.name, kind)
                    if waited is not None and now and job.eligible_at:
                        waited(self.queue.name, kind, max(0.0, (now - job.eligible_at) / 1000))
                except Exception as exc:  # noqa: BLE001 - the application's observer: never holds a job
                    observer_raised("job_claimed", exc)
            if batching is not None:
                job.runner = self
                if batching.place(job):  # a batch job, or one held until a slot frees
                    continue
            job.runner, job.holds_slot = self, True
            self.busy += 1
            self.inbox.put(job)

    async def _wait(self, seconds: float | None) -> None:
        with anyio.move_on_after(seconds if seconds is not None else math.inf):
            await self.poke.wait()

    async def reclaim_once(self) -> int:
        """One reclaim sweep of this queue alone (the worker sweeps all its queues at once:
        housekeeping.py); how many jobs it took back."""
        return await reclaim([self.queue], self.settings.max_failures, self.host.observer)

    async def extend(self) -> None:
        jobs = [j for j in self.active.values() if not j.lost]
        if not jobs:
            return
        q = self.queue
        lost, cancel = await q.store.extend([(j.id, j.token, j.lease_ms) for j in jobs])
        for job_id in cancel:
            job = self.active.get(job_id)
            if job is not None and not job.cancel_requested:
                job.cancel_requested = True
                log.info("queue %s: job %s (%s) was cancelled; stopping it", q.name, job.id, job.kind)
                if job.ctx is not None:
                    job.ctx._cancel("cancelled by an operator")
        for job_id in lost:
            job = self.active.get(job_id)
            if job is not None and not job.lost and not job.committing:
                job.lost = True
                log.error(
                    "queue %s: lease on job %s (%s) was lost; its outcome will be refused",
                    q.name,
                    job.id,
                    job.kind,
                )
                if job.ctx is not None:
                    job.ctx._cancel("lease lost")
