"""A run's ending as its transition script, and the three routes a transition takes to Redis.

``Transitions.commit`` turns what ``execute`` decided (complete, pause,
suspend, retry, dead, release, or cancel when an operator asked) into the
script call, with the run's carry and attachment. It then goes:

- a completion, while the worker runs: handed to the connection's committer
  without waiting (``complete_soon``); the committer calls ``_completed``
  with the reply, and the job leaves the worker's books there (a connection
  error is retried in a task of its own, ``_complete_again``);
- any other transition while the worker runs: through the committer, awaited
  by the slot task;
- outside ``run()`` (a test's direct call), or ``direct`` (the worker is on
  its way out and the committer may be gone): straight to Redis.

A transient error is retried (up to 8 attempts, then the lease expires and
the reclaim runs the job again); a refusal after a retried call may be our
own first attempt having succeeded with its reply lost: logged, never
re-applied.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from anyio.abc import TaskGroup

from .._model.backoff import Backoff
from .._model.codec import pack, pack_model
from .._model.errors import LeaseLostError, PayloadError
from .._model.task import NoCarry
from .._store import calls
from .context import Context
from .runner import _TRANSIENT

if TYPE_CHECKING:
    from .._producer.client import Client
    from .committer import _Committer
    from .metrics import WorkerObserver
    from .runner import _Job, _Runner

log = logging.getLogger("venturi_redis.worker")
# Metrics names of each transition's outcome ("retry" is "failed" or "dead").
_OUTCOMES = {
    "complete": "completed",
    "pause": "paused",
    "suspend": "suspended",
    "retry": "failed",
    "dead": "dead",
    "release": "released",
    "cancel": "cancelled",
}


class TransitionHost(Protocol):
    """What sending transitions asks of its worker (the ``Worker`` is one)."""

    backoff: Backoff
    jitter: float
    observer: WorkerObserver | None
    _committers: dict[int, _Committer]
    # The slot tasks' task group while run() runs (a deferred completion's retry runs there).
    _jobs_tg: TaskGroup | None

    @property
    def _max_failures_arg(self) -> str: ...

    def _committer_for(self, client: Client) -> _Committer | None:
        """The connection's committer while the worker runs, else None."""

    def _kind_label(self, kind: str) -> str:
        """The metrics label for a KIND."""

    def _finish(self, runner: _Runner, job: _Job) -> None:
        """The job's transition is written (or given up on): off the worker's books."""


class Transitions:
    """Builds each run's transition call and sends it (see the module docstring)."""

    __slots__ = ("_host",)

    def __init__(self, host: TransitionHost) -> None:
        self._host = host

    async def commit(
        self,
        job: _Job,
        action: str,
        *,
        ctx: Context[Any] | None = None,
        note: str | None = None,
        reason: str = "",
        task: Any = None,
        delay_ms: int = 0,
        blob: bytes = b"",
        direct: bool = False,
        error: tuple[str, str] = ("", ""),
    ) -> None:
        """Run the transition script for ``action``, retrying transient errors.

        ``error`` is a failed run's exception type and traceback tail (execute's
        ``failure_of``), journaled by a retry or a death.

        A refusal after a retried call may be our own first attempt having
        succeeded with its reply lost; it is logged, never re-applied.
        ``direct`` sends it on the client's pool instead of the committer's
        next round trip (the worker is on its way out).
        """
        q = job.queue
        k = q.keys
        note_s = note or ""
        attachment = b""
        carry = b""
        if ctx is not None:
            try:
                attachment = pack(ctx.attachment) if ctx.attachment is not None else b""
                carry = b"" if isinstance(ctx.carry, NoCarry) else pack_model(ctx.carry)
            except PayloadError as exc:
                action, note_s, reason, attachment, carry = (
                    "dead",
                    f"cannot save run state: {exc}",
                    "bad_payload",
                    b"",
                    b"",
                )
        if action == "pause" and (bad := calls.bad_delay(delay_ms)) is not None:
            # The handler's outcome cannot be stored (a NaN delay): a failed run, never a lost job.
            action, note_s = "retry", f"the run's outcome cannot be stored: {bad}"
        if job.cancel_requested and action in ("pause", "suspend", "retry", "release"):
            # An operator cancelled the job while it ran: whatever else the run
            # decided, it ends cancelled (a completion or a death stands).
            action = "cancel"
            note_s = "cancelled by an operator" + (f" (the run ended with: {note_s})" if note_s else "")
        call: calls.Call | None
        completion: calls.Completion = []  # complete.lua takes many jobs: this one's values
        # complete.lua takes its clock from the committer's batch: no per-job clock here.
        now_s = "" if action == "complete" else q.client._now_arg()
        if action == "complete":
            completion = calls.completion(job.id, job.token, note_s, attachment, carry, blob)
            call = None  # the committer batches it; a direct call builds it in _send
        elif action == "pause":
            call = calls.pause(
                k,
                now_s,
                job_id=job.id,
                token=job.token,
                priority=job.priority,
                delay_ms=delay_ms,
                note=note_s,
                attachment=attachment,
                carry=carry,
            )
        elif action == "suspend":
            call = calls.suspend(
                k,
                now_s,
                job_id=job.id,
                token=job.token,
                note=note_s,
                attachment=attachment,
                carry=carry,
                output=blob,
            )
        elif action == "retry":
            policy = (task.backoff() if task is not None else None) or self._host.backoff
            call = calls.retry(
                k,
                now_s,
                job_id=job.id,
                token=job.token,
                priority=job.priority,
                note=note_s,
                attachment=attachment,
                carry=carry,
                base_ms=policy.base_ms,
                cap_ms=policy.cap_ms,
                jitter=self._host.jitter,
                max_failures=self._host._max_failures_arg,
                error_type=error[0],
                traceback=error[1],
            )
        elif action == "dead":
            call = calls.dead(
                k,
                now_s,
                job_id=job.id,
                token=job.token,
                note=note_s,
                attachment=attachment,
                carry=carry,
                reason=reason,
                error_type=error[0],
                traceback=error[1],
            )
        elif action == "cancel":
            call = calls.cancel(
                k, now_s, job_id=job.id, note=note_s, token=job.token, attachment=attachment, carry=carry
            )
        elif action == "release":
            call = calls.release(
                k, now_s, job_id=job.id, token=job.token, priority=job.priority, carry=carry, note=note_s
            )
        else:  # pragma: no cover - internal misuse
            raise ValueError(action)
        job.committing = True
        if job.runner is not None:
            job.runner.release_slot(job)
        if call is None and self._host._jobs_tg is not None and job.runner is not None and not direct:
            committer = self._host._committers.get(id(q.client))
            if committer is not None:
                # The slot task goes on to its next job at once; the committer
                # calls _completed with the reply (no task wake-up per job).
                job.deferred, job.completion = True, completion
                committer.complete_soon(q, completion, self._completed, job)
                return
        reply, attempt = await self._send(job, call, completion, direct=direct)
        if reply is not None:
            self._committed(job, action, reply, attempt)
            if reply.applied and (action == "dead" or (action == "retry" and reply.detail == "dead")):
                # A death is never silent (a permanent error, the backstop, an
                # unknown KIND, data that no longer decodes): one WARNING line.
                log.warning(
                    "job %s (%s) on queue %s is dead (%s): %s",
                    job.id,
                    job.kind,
                    q.name,
                    reason if action == "dead" else "max_failures",
                    note_s,
                )

    def _completed(self, job: _Job, reply: Any) -> None:
        """A deferred completion's reply (or error), from the committer; the job is then finished."""
        runner = job.runner
        assert runner is not None
        if isinstance(reply, _TRANSIENT) and self._host._jobs_tg is not None:
            # Try again as _commit does, in a task of its own (it sleeps between attempts).
            self._host._jobs_tg.start_soon(self._complete_again, job)
            return
        try:
            if isinstance(reply, BaseException):
                log.error(
                    "queue %s: internal error completing job %s", job.queue.name, job.id, exc_info=reply
                )
            else:
                self._committed(job, "complete", reply, 0)
        finally:
            self._host._finish(runner, job)

    async def _complete_again(self, job: _Job) -> None:
        runner = job.runner
        assert runner is not None
        assert job.completion is not None
        try:
            await anyio.sleep(0.1)
            reply, attempt = await self._send(job, None, job.completion, attempt=1)
            if reply is not None:
                self._committed(job, "complete", reply, attempt)
        except Exception:
            log.exception("queue %s: internal error completing job %s", job.queue.name, job.id)
        finally:
            self._host._finish(runner, job)

    async def _send(
        self,
        job: _Job,
        call: calls.Call | None,
        completion: calls.Completion,
        attempt: int = 0,
        *,
        direct: bool = False,
    ) -> tuple[calls.Transition | None, int]:
        """Send a transition, retrying transient errors: (its result, the attempts it took).

        ``call`` None: the job's ``completion`` (complete.lua takes many jobs).
        The result is None when it gave up (the lease will expire and the job be reclaimed).
        """
        q = job.queue
        name = "complete" if call is None else call.name
        while True:
            try:
                # The committers only send while run() runs them: a direct call
                # outside run() (a test) goes straight to Redis instead of waiting.
                committer = None if direct else self._host._committer_for(q.client)
                result: calls.Transition
                if call is None and committer is not None:
                    result = await committer.complete(q, completion)
                elif call is None:  # not running (a direct call in a test): no batching
                    one = calls.complete(q.keys, q.client._now_arg(), [completion])
                    result = calls.completed(await q.client._scripts.call(q.client.redis, *one))[0]
                elif committer is not None:
                    result = calls.transition(await committer.submit(call))
                else:
                    result = calls.transition(await q.client._scripts.call(q.client.redis, *call))
                break
            except _TRANSIENT as exc:
                attempt += 1
                if attempt > 8:
                    log.error(
                        "job %s: giving up on %s after %d attempts (%s); its lease will expire "
                        "and it will be reclaimed",
                        job.id,
                        name,
                        attempt,
                        exc,
                    )
                    return None, attempt
                await anyio.sleep(min(0.05 * 2**attempt, 2.0))
        return result, attempt

    def _committed(self, job: _Job, action: str, result: calls.Transition, attempt: int) -> None:
        """After a transition's result: the observer, and a lost lease logged.

        ``action`` is also the script's name (every transition's call is named after it).
        """
        q = job.queue
        if self._host.observer is not None and result.applied:
            outcome = _OUTCOMES.get(action, action)
            if action == "retry" and result.detail == "dead":
                outcome = "dead"
            self._host.observer.job_finished(
                q.name, self._host._kind_label(job.kind), outcome, time.monotonic() - job.started
            )
        if not result.applied:
            err = LeaseLostError(job.id, action, result.detail)
            if attempt:
                log.warning("%s (after a retried call, so possibly our own earlier success)", err)
            else:
                log.error("%s", err)
