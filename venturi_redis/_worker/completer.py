"""The completer: what each run's ending becomes, written many per round trip.

``execute`` returns a run's ending (``_model/endings.py``); ``Completer.finish``
takes it from there, top-down:

1. the run's state (its carry and attachment) is encoded; an ending that
   cannot be stored becomes the one that can (state that does not encode:
   the job dies ``INVALID_PAYLOAD``; an operator's cancel that arrived while
   it ran turns a pause, suspend, failure or release into ``Cancelled``);
2. the queue's store builds the ending's call (``QueueStore.end_run``, or one
   job's values of a batched completion);
3. the connection's ``_Batch`` sends it with whatever else is ready (other
   runs' endings, the claim loops' next claims) in one pipeline
   (``store.send_ops``), and hands each caller its parsed reply;
4. the reply is settled here: the observer told, a refused transition (a
   lost lease) logged, a death logged, and the job leaves the worker's books
   (``CompleterHost.job_done``).

A completion does not keep its slot task waiting: the batch settles it when
its reply is in (``finish`` returns at once), so a burst of finished runs
costs one task wake-up per round trip, not one per job. Every other ending
is awaited by its slot task. Outside ``run()`` (a test's direct call), or
``direct`` (the worker is on its way out and the batch may be gone), the call
goes straight to Redis.

A transient error (a dropped connection; a server answering BUSY while a
script runs) is retried (up to 8 attempts, then the lease expires and
the reclaim runs the job again); a refusal after a retried call may be our
own first attempt having succeeded with its reply lost: logged, never
re-applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup
from pydantic import BaseModel

from .._model.backoff import Backoff
from .._model.codec import pack, pack_model
from .._model.endings import (
    COMPLETED,
    Cancelled,
    Completed,
    Dead,
    Ending,
    Failed,
    Paused,
    Released,
    Suspended,
)
from .._model.enums import DeadReason
from .._model.errors import LeaseLostError, PayloadError, said
from .._model.outcome import UNSET
from .._model.sizes import bounded_note, over_cap
from .._model.task import NoCarry
from .._store.store import APPLIED, NO_STATE, EndingArgs, Lease, Op, Retained, RunState, send_ops
from .._transport.errors import TRANSIENT, refused_busy
from .context import Context
from .execute import failure_of
from .failure_log import failed_run
from .guarded import observer_raised
from .logcontext import job_fields, run_ended

if TYPE_CHECKING:
    from .._producer.client import Client, Queue
    from .._store.store import ClaimReply, Completion, Transition
    from .job import Job
    from .metrics import WorkerObserver

log = logging.getLogger("venturi_redis.worker")


def _retryable(exc: object) -> bool:
    """Whether an ending's call may simply be sent again: its connection failed,
    or the server answered BUSY (the call did not run). Given up on, the job
    would wait out its lease and run again."""
    return isinstance(exc, TRANSIENT) or refused_busy(exc)


# Metrics names of each ending ("failed" becomes "dead" at the backstop).
_OUTCOMES: dict[type[Any], str] = {
    Completed: "completed",
    Paused: "paused",
    Suspended: "suspended",
    Failed: "failed",
    Dead: "dead",
    Released: "released",
    Cancelled: "cancelled",
}
# The script each ending is written by, as a lost lease's log line names it.
_SCRIPTS: dict[type[Any], str] = {
    Completed: "complete",
    Paused: "pause",
    Suspended: "suspend",
    Failed: "retry",
    Dead: "dead",
    Released: "release",
    Cancelled: "cancel",
}
# Most completions in one complete.lua call (a longer burst takes several calls).
_COMPLETE_BATCH = 200
# Most bytes of values (attachments, carries, results) in one complete.lua
# call: Redis copies them while it serves nobody else (~5 ms a MB), so a burst
# of runs with large results goes out as several calls, others served between.
_COMPLETE_BYTES = 16 << 20
# The error type of a run whose state is over its cap (as execute.py names it).
_TOO_LARGE = "venturi_redis.PayloadTooLarge"
# Pipelines in flight at once: while one is at Redis, the worker builds and
# sends the next, so the worker's CPU and Redis's overlap instead of taking
# turns (in-process drain at concurrency 100: about +15%, benchmarks/README.md).
_IN_FLIGHT = 2


class CompleterHost(Protocol):
    """What the completer asks of its worker (the ``Worker`` is one)."""

    backoff: Backoff
    jitter: float
    observer: WorkerObserver | None
    log_runs: bool  # Worker(log_runs=True): one INFO line per finished run (logcontext.run_ended)
    # The worker's retention, as the finishing scripts take it (they trim as they finish).
    retained: Retained

    @property
    def max_failures_arg(self) -> str: ...

    @property
    def running(self) -> bool:
        """Whether run() is running (the batches send only then)."""

    @property
    def jobs_group(self) -> TaskGroup | None:
        """The slot tasks' task group while run() runs (a completion's retry runs there)."""

    def kind_label(self, kind: str) -> str:
        """The metrics label for a KIND."""

    def job_done(self, job: Job) -> None:
        """The job's ending is written (or given up on): off the worker's books."""


class Completer:
    """Writes each run's ending (see the module docstring); one per worker."""

    __slots__ = ("_batches", "_host")

    def __init__(self, host: CompleterHost, clients: list[Client]) -> None:
        self._host = host
        # One batch per connection: the endings of finished runs share round trips.
        self._batches: dict[int, _Batch] = {id(c): _Batch(c, host.retained) for c in clients}

    async def run(self, tg: TaskGroup) -> None:
        """Start every connection's senders in ``tg`` (for as long as it runs)."""
        for batch in self._batches.values():
            tg.start_soon(batch.run)

    def batch_for(self, client: Client) -> _Batch | None:
        """The connection's batch while the worker runs, else None (a direct call)."""
        return self._batches.get(id(client)) if self._host.running else None

    async def claim(self, queue: Queue, op: Op[ClaimReply]) -> ClaimReply:
        """A claim, in the next round trip of its connection (after that trip's endings)."""
        batch = self.batch_for(queue.client)
        if batch is None:
            return await queue.store.send(op)
        result: ClaimReply = await batch.submit(op, claim=True)
        return result

    def finish_soon(self, job: Job, ending: Ending) -> bool:
        """``finish`` without an await, for the usual run: a completion handed to its
        batch while the worker runs. Whether it was; if not, the caller awaits ``finish``."""
        if ending.__class__ is not Completed or job.runner is None or self._host.jobs_group is None:
            return False
        # The slot tasks' group is there only while run() runs, and so are the batches.
        batch = self._batches.get(id(job.queue.client))
        if batch is None:
            return False
        ctx = job.ctx
        if ctx is None or (
            (ctx._attachment is UNSET or ctx._attachment is None) and ctx.carry.__class__ is NoCarry
        ):
            state = NO_STATE  # the usual run: nothing to save
        else:
            state, written = self._state(job, ending)
            if written is not ending:
                return False  # its state does not encode: finish() writes the death
        job.committing = True
        job.runner.release_slot(job)
        job.deferred = True
        job.completion = job.queue.store.completion(job.id, job.token, ending, state)
        batch.complete_soon(job.queue, job.completion, self._completed, job)
        if ending is not COMPLETED or state is not NO_STATE:  # not the usual run: it may hold values
            batch.hold(_size(job.completion))
        return True

    async def internal_error(self, job: Job, exc: Exception) -> None:
        """The worker's own code failed on ``job``'s way (a bug: logged with its traceback).

        Its run ends failed now, noted with the error, rather than left to wait
        out its lease and be reclaimed as ``lease_expired`` (charged the same
        failure, with nothing said). Not when its ending was already on its way
        or its lease is lost: that ending, or the reclaim, stands.
        """
        log.error(
            "queue %s: internal error running job %s",
            job.queue.name,
            job.id,
            exc_info=exc,
            extra=job_fields(job),
        )
        if job.committing or job.lost:
            return
        note = f"internal error in the worker: {type(exc).__name__}: {said(exc)}"[:1000]
        error_type, tb = failure_of(exc, ())  # not scrubbed of task secrets: no task is at hand here
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await self.finish(job, Failed(note, error_type, tb), direct=True)
            except Exception:
                log.exception("queue %s: job %s: its failed run could not be written", job.queue.name, job.id)

    async def finish(self, job: Job, ending: Ending, *, direct: bool = False) -> None:
        """Write ``ending`` for ``job``'s run.

        A completion handed to its batch is settled there, and taken off the
        worker's books (``CompleterHost.job_done``) once written; for every
        other ending the caller does that when this returns.
        """
        decided = ending
        state, ending = self._state(job, ending)
        if ending is not decided and isinstance(ending, Failed):  # its state was over the cap
            failed_run(job.id, job.kind, ending.error_type, ending.note)
        host = self._host
        if job.cancel_requested and isinstance(ending, (Paused, Suspended, Failed, Released)):
            # An operator cancelled the job while it ran: whatever else the run
            # decided, it ends cancelled (a completion or a death stands).
            note = ending.note
            ending = Cancelled(
                "cancelled by an operator" + (f" (the run ended with: {note})" if note else "")
            )
        job.committing = True
        if job.runner is not None:
            job.runner.release_slot(job)
        store = job.queue.store
        if isinstance(ending, Completed) and not direct and host.jobs_group is not None:
            batch = self.batch_for(job.queue.client)
            if batch is not None and job.runner is not None:
                # The slot task goes on to its next job at once; the batch
                # settles this one when its reply is in.
                job.deferred = True
                job.completion = store.completion(job.id, job.token, ending, state)
                batch.complete_soon(job.queue, job.completion, self._completed, job)
                if ending is not COMPLETED or state is not NO_STATE:
                    batch.hold(_size(job.completion))
                return
        op = store.end_run(Lease(job.id, job.token, job.priority), ending, state, self._args(ending))
        result, attempt = await self._send(job, op, direct=direct)
        if result is not None:
            self._settled(job, ending, result, attempt)

    def _state(self, job: Job, ending: Ending) -> tuple[RunState, Ending]:
        """The run's encoded state, and the ending that can be stored with it."""
        ctx: Context[Any] | None = job.ctx
        if ctx is None:
            return NO_STATE, ending
        if ctx.attachment is None and type(ctx.carry) is NoCarry:
            return NO_STATE, ending  # the usual run: nothing to save
        try:
            attachment = pack(ctx.attachment) if ctx.attachment is not None else b""
            if not isinstance(ctx.carry, BaseModel):  # the handler set ctx.carry to something else
                what = type(ctx.carry).__name__
                raise PayloadError(f"ctx.carry was set to a {what}; it must stay the task's carry model")
            carry = b"" if isinstance(ctx.carry, NoCarry) else pack_model(ctx.carry)
        except PayloadError as exc:
            return NO_STATE, Dead(
                DeadReason.INVALID_PAYLOAD, f"cannot save run state: {bounded_note(str(exc))}"
            )
        client = job.queue.client
        cap = client.max_payload_bytes
        if len(attachment) > cap or len(carry) > cap:
            attachment, carry, ending = _unsaved(job, ending, attachment, carry, cap)
        crypt = client.encryption  # encryption at rest: sealed as the producer seals
        if crypt is not None:
            attachment = crypt.seal(attachment) if attachment else attachment
            carry = crypt.seal(carry) if carry else carry
        return RunState(attachment, carry), ending

    def _args(self, ending: Ending) -> EndingArgs:
        host = self._host
        policy = (ending.backoff if isinstance(ending, Failed) else None) or host.backoff
        return EndingArgs(policy.base_ms, policy.cap_ms, host.jitter, host.max_failures_arg, host.retained)

    def _completed(self, job: Job, reply: Any) -> None:
        """A deferred completion's reply (or error), from its batch; the job is then off the books."""
        host = self._host
        if reply is APPLIED and host.observer is None and not host.log_runs:
            host.job_done(job)  # the usual reply: nothing to tell, log or retry
            return
        if _retryable(reply) and host.jobs_group is not None:
            # Try again as finish does, in a task of its own (it sleeps between attempts).
            host.jobs_group.start_soon(self._complete_again, job)
            return
        try:
            if isinstance(reply, BaseException):
                log.error(
                    "queue %s: internal error completing job %s", job.queue.name, job.id, exc_info=reply
                )
            else:
                self._settled(job, COMPLETED, reply, 0)
        finally:
            host.job_done(job)

    async def _complete_again(self, job: Job) -> None:
        assert job.completion is not None
        op = job.queue.store.complete_op([job.completion], self._host.retained)
        one: Op[Transition] = Op(op.call, lambda reply: op.parse(reply)[0])
        try:
            await anyio.sleep(0.1)
            result, attempt = await self._send(job, one, attempt=1)
            if result is not None:
                self._settled(job, COMPLETED, result, attempt)
        except Exception:
            log.exception("queue %s: internal error completing job %s", job.queue.name, job.id)
        finally:
            self._host.job_done(job)

    async def _send(
        self, job: Job, op: Op[Transition], attempt: int = 0, *, direct: bool = False
    ) -> tuple[Transition | None, int]:
        """Send an ending's op, retrying transient errors: (its result, the attempts it took).

        The result is None when it gave up (the lease will expire and the job be reclaimed).
        """
        while True:
            try:
                # The batches only send while run() runs them: a direct call
                # outside run() (a test) goes straight to Redis instead of waiting.
                batch = None if direct else self.batch_for(job.queue.client)
                if batch is None:
                    return await job.queue.store.send(op), attempt
                result: Transition = await batch.submit(op)
                return result, attempt
            except Exception as exc:
                if not _retryable(exc):
                    raise
                attempt += 1
                if attempt > 8:
                    log.error(
                        "job %s: giving up on %s after %d attempts (%s); its lease will expire "
                        "and it will be reclaimed",
                        job.id,
                        op.call.name,
                        attempt,
                        exc,
                    )
                    return None, attempt
                await anyio.sleep(min(0.05 * 2**attempt, 2.0))

    def _settled(self, job: Job, ending: Ending, result: Transition, attempt: int) -> None:
        """After an ending's reply: the observer, a lost lease logged, a death logged."""
        q = job.queue
        host = self._host
        died = result.applied and (
            isinstance(ending, Dead) or (isinstance(ending, Failed) and result.detail == "dead")
        )
        if host.observer is not None and result.applied:
            outcome = "dead" if died else _OUTCOMES[type(ending)]
            try:
                host.observer.job_finished(
                    q.name, host.kind_label(job.kind), outcome, time.monotonic() - job.started
                )
            except Exception as exc:  # noqa: BLE001 - the application's observer: never stops the worker
                observer_raised("job_finished", exc)
        if not result.applied:
            err = LeaseLostError(job.id, _SCRIPTS[type(ending)], result.detail)
            if attempt:
                msg = "%s (after a retried call, so possibly our own earlier success)"
                log.warning(msg, err, extra=job_fields(job))
            else:
                log.error("%s", err, extra=job_fields(job))
            return
        if host.log_runs:
            run_ended(job, ending, result, time.monotonic() - job.started)
        if died:
            # A death is never silent (a permanent error, the backstop, an
            # unknown KIND, data that no longer decodes): one WARNING line.
            reason = ending.reason if isinstance(ending, Dead) else DeadReason.MAX_FAILURES
            log.warning(
                "job %s (%s) on queue %s is dead (%s): %s",
                job.id,
                job.kind,
                q.name,
                reason.value,
                ending.note,
                extra=job_fields(job),
            )


def _unsaved(
    job: Job, ending: Ending, attachment: bytes, carry: bytes, cap: int
) -> tuple[bytes, bytes, Ending]:
    """A run's state with a value over ``Client(max_payload_bytes=...)``: what is saved, and its ending.

    The value over the cap is not written ('' leaves the job's stored one as
    it was: the last carry that fit is what the next run starts from). A run
    that would have moved its job on (completed, paused, suspended) is a
    failed run instead, with a note naming the cap: its state was not saved.
    Any other ending stands (a failure, a death, a release, a cancel), its
    note saying what was not saved.
    """
    why: list[str] = []
    if len(carry) > cap:
        why.append(str(over_cap("its carry", len(carry), cap, "max_payload_bytes")))
        carry = b""
    if len(attachment) > cap:
        why.append(str(over_cap("its attachment", len(attachment), cap, "max_payload_bytes")))
        attachment = b""
    reason = "the run's state was not saved: " + "; ".join(why)
    if isinstance(ending, (Completed, Paused, Suspended)):
        return attachment, carry, Failed(reason, _TOO_LARGE)  # logged by finish(), once
    note = f"{ending.note} ({reason})" if ending.note else reason
    return attachment, carry, dataclasses.replace(ending, note=note)


def _size(completion: Completion) -> int:
    """The bytes of a completion's large values: its attachment, carry and result (a note is
    bounded small: sizes.NOTE_CHARS)."""
    return sum(len(value) for value in completion[3:] if isinstance(value, bytes))


_Entry = tuple["Queue", "Completion", Any, Any]


def _counted(group: list[_Entry]) -> list[list[_Entry]]:
    """A queue's completions in calls of at most ``_COMPLETE_BATCH``."""
    return [group[i : i + _COMPLETE_BATCH] for i in range(0, len(group), _COMPLETE_BATCH)]


def _chunked(group: list[_Entry]) -> list[list[_Entry]]:
    """A queue's completions in calls of at most ``_COMPLETE_BATCH``, each closed once its
    values reach ``_COMPLETE_BYTES`` (so a call holds at most that and one job's values)."""
    chunks: list[list[_Entry]] = [[]]
    held = 0
    for entry in group:
        chunk = chunks[-1]
        if len(chunk) >= _COMPLETE_BATCH or held >= _COMPLETE_BYTES:
            chunk = []
            chunks.append(chunk)
            held = 0
        chunk.append(entry)
        held += _size(entry[1])
    return chunks


class _Batch:
    """Sends one connection's endings and claims, many per round trip.

    Handlers finish in bursts (a claim batch of no-op jobs finishes almost at
    once). What is submitted while a pipeline is in flight goes out together
    in the next one: the claim loops' claims first (they refill the slots
    those runs freed in the same round trip), then every other ending as its
    own script, then the completions of a queue as one ``complete`` call over
    all of them (each job still checked, written and journaled on its own). A
    lone call goes out at once: batching only happens under load.

    Claims go before the completions so that the running set never empties
    between a batch's completions and the next claim: a sorted set of up to
    128 members is a listpack, in which each of a claim's inserts scans the
    whole set; kept above that, it stays a skiplist (about 8% of Redis's
    instructions per job, benchmarks/redis_cost.py). A concurrency slot a
    completion gives back is then used by the next claim, a round trip later.

    Two pipelines may be in flight at once. That is safe because nothing
    orders one pipeline after another: a job's task waits for its ending's
    reply before it sends anything else for that job, and a claim loop waits
    for its claim before it claims again.
    """

    def __init__(self, client: Client, retained: Retained) -> None:
        self.client = client
        self.retained = retained
        # What is waiting for the next pipeline: (op, future) for an awaited
        # call; (queue, completion, done, job) for a completion nobody awaits.
        self._ops: list[tuple[Op[Any], asyncio.Future[Any], bool]] = []
        self._completions: list[tuple[Queue, Completion, Any, Any]] = []
        self._bytes = 0  # of the values of _completions (only counted when there are some)
        self._kick = anyio.Event()
        # Whether _kick is set: the calls after the first of a round trip skip setting it again.
        self._kicked = False

    async def submit(self, op: Op[Any], *, claim: bool = False) -> Any:
        """Run ``op`` in the next round trip (a claim before that trip's endings): its parsed reply."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append((op, reply, claim))
        self._wake_sender()
        return await reply

    def complete_soon(self, queue: Queue, completion: Completion, done: Any, job: Any) -> None:
        """A completion without waiting: the sender calls ``done(job, result)`` with the job's
        ``Transition`` (or the exception), from its own task."""
        self._completions.append((queue, completion, done, job))
        self._wake_sender()

    def hold(self, size: int) -> None:
        """The last completion handed over holds ``size`` bytes of values (told only when it
        may hold some: the usual completion costs nothing more)."""
        self._bytes += size

    def _wake_sender(self) -> None:
        """Set ``_kick`` once per round trip (the calls after the first skip setting it again)."""
        if not self._kicked:
            self._kicked = True
            self._kick.set()

    async def run(self) -> None:
        """Two senders: while one's pipeline is at Redis, the other gathers and sends the next."""
        async with anyio.create_task_group() as tg:
            for _ in range(_IN_FLIGHT):
                tg.start_soon(self._sender)

    async def _sender(self) -> None:
        while True:
            await self._kick.wait()
            # Let the tasks that are ready now (other runs finishing, a claim
            # loop woken by the slots they freed) add their calls to this batch.
            await anyio.lowlevel.checkpoint()
            # Reset and take in one step (no await between): a call added
            # before the reset is taken here, one added after sets the new event.
            self._kick = anyio.Event()
            self._kicked = False
            ops, self._ops = self._ops, []
            completions, self._completions = self._completions, []
            size, self._bytes = self._bytes, 0
            if not ops and not completions:
                continue  # the other sender took them
            await self._send(ops, completions, size)

    async def _send(
        self,
        ops: list[tuple[Op[Any], asyncio.Future[Any], bool]],
        completions: list[tuple[Queue, Completion, Any, Any]],
        size: int = 0,
    ) -> None:
        # The pipeline: the claims, the awaited endings, then one complete call
        # per queue (per _COMPLETE_BATCH completions).
        pipeline: list[Op[Any]] = [op for op, _, claim in ops if claim]
        n_claims = len(pipeline)
        pipeline += [op for op, _, claim in ops if not claim]
        first_complete = len(pipeline)
        # By queue (its key prefix: two Queue objects of one queue share a call), in order.
        by_queue: dict[str, list[tuple[Queue, Completion, Any, Any]]] = {}
        for entry in completions:
            prefix = entry[0].keys.prefix
            group = by_queue.get(prefix)
            if group is None:
                by_queue[prefix] = [entry]
            else:
                group.append(entry)
        chunks: list[list[tuple[Queue, Completion, Any, Any]]] = []
        for group in by_queue.values():
            store = group[0][0].store
            for chunk in _chunked(group) if size > _COMPLETE_BYTES else _counted(group):
                chunks.append(chunk)
                pipeline.append(store.complete_op([entry[1] for entry in chunk], self.retained))
        try:
            results = await send_ops(self.client.sender, pipeline)
        except Exception as exc:  # noqa: BLE001 - handed to every waiter, which retries
            results = [exc] * len(pipeline)
        claims = iter(results[:n_claims])
        plain = iter(results[n_claims:first_complete])
        for _op, future, claim in ops:
            value = next(claims) if claim else next(plain)
            if future.done():
                continue  # its waiter was cancelled
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)
        complete_results = results[first_complete:]
        for chunk, per_call in zip(chunks, complete_results, strict=True):
            values = [per_call] * len(chunk) if isinstance(per_call, BaseException) else per_call
            for (_, _, done, job), value in zip(chunk, values, strict=True):
                try:
                    done(job, value)
                except Exception:
                    log.exception("internal error handling a completion's reply")
