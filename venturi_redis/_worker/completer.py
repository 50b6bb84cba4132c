"""The completer: what each run's ending becomes, written many per round trip.

``execute`` returns a run's ending (``_model/endings.py``); ``Completer.finish``
takes it from there, top-down:

1. the run's state (its carry and attachment) is encoded; an ending that
   cannot be stored becomes the one that can (state that does not encode:
   the job dies ``INVALID_PAYLOAD``; an operator's cancel that arrived while
   it ran turns a pause, suspend, failure or release into ``Cancelled``);
2. the queue's store builds the ending's call (``QueueStore.end_run``, or one
   job's values of a batched completion);
3. the connection's ``Outbox`` (``outbox.py``) sends it with whatever else is ready (other
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

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import anyio
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
from .._store.store import APPLIED, NO_STATE, EndingArgs, Lease, Op, Retained, RunState
from .._transport.errors import TRANSIENT, refused_busy
from .context import Context
from .execute import failure_of
from .failure_log import failed_run
from .guarded import observer_raised
from .logcontext import job_fields, run_ended
from .outbox import Outbox, completion_bytes

if TYPE_CHECKING:
    from .._producer.client import Client, Queue
    from .._store.store import ClaimReply, Transition
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
# The error type of a run whose state is over its cap (as execute.py names it).
_TOO_LARGE = "venturi_redis.PayloadTooLarge"


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
        self._batches: dict[int, Outbox] = {id(c): Outbox(c, host.retained) for c in clients}

    async def run(self, tg: TaskGroup) -> None:
        """Start every connection's senders in ``tg`` (for as long as it runs)."""
        for batch in self._batches.values():
            tg.start_soon(batch.run)

    def batch_for(self, client: Client) -> Outbox | None:
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
        # Built before the run counts as committing: should building raise, the
        # run's failure is written now (internal_error), not left to its lease.
        completion = job.queue.store.completion(job.id, job.token, ending, state)
        job.committing = True
        job.runner.release_slot(job)
        job.deferred = True
        job.completion = completion
        batch.complete_soon(job.queue, completion, self._completed, job)
        if ending is not COMPLETED or state is not NO_STATE:  # not the usual run: it may hold values
            batch.hold(completion_bytes(completion))
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
        # The call is built before the run counts as committing (no await
        # between the two): should building it raise, internal_error writes the
        # run's failure now instead of leaving the job to wait out its lease.
        store = job.queue.store
        if isinstance(ending, Completed) and not direct and host.jobs_group is not None:
            batch = self.batch_for(job.queue.client)
            if batch is not None and job.runner is not None:
                # The slot task goes on to its next job at once; the batch
                # settles this one when its reply is in.
                completion = store.completion(job.id, job.token, ending, state)
                job.committing = True
                job.runner.release_slot(job)
                job.deferred = True
                job.completion = completion
                batch.complete_soon(job.queue, completion, self._completed, job)
                if ending is not COMPLETED or state is not NO_STATE:
                    batch.hold(completion_bytes(completion))
                return
        op = store.end_run(Lease(job.id, job.token, job.priority), ending, state, self._args(ending))
        job.committing = True
        if job.runner is not None:
            job.runner.release_slot(job)
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
