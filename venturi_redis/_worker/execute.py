"""Running one claimed job: decode it, call its handler, and say how the run ended.

``execute`` returns the run's ending as a value (``_model/endings.py``), the
one place that decides it (docs/guarantees.md): a result completes, a
``vr.Outcome`` pauses or suspends, an error is a failed run (retried, or dead
at the backstop), a permanent ``TaskError`` or undecodable data is dead. The
worker hands the ending to its completer (``completer.py``), which writes it.
A cancellation the worker asked for (the shutdown grace ran out, ``run()``
cancelled) is re-raised: the worker releases the job on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import anyio
from pydantic import BaseModel

from .._model import tracing as _tracing
from .._model.codec import ValidatorRaised, model_decoder, pack, type_name, unpack, unpack_as, unpack_model
from .._model.endings import COMPLETED, Completed, Dead, Ending, Failed, Paused, Suspended
from .._model.enums import DeadReason
from .._model.errors import (
    EncryptionKeyMissing,
    PayloadError,
    PayloadTooLarge,
    TaskDefinitionError,
    TaskError,
    said,
)
from .._model.outcome import UNSET, Outcome
from .._model.redact import document_secrets, scrub, secret_values
from .._model.sealing import Encryption, missing_key
from .._model.sizes import NOTE_CHARS, bounded_note, over_cap
from .._model.task import NoCarry, Task
from .._store.store import bad_delay
from .context import Context
from .dependencies import UnreadableResult
from .failure_log import failed_run
from .guarded import task_backoff, task_timeout
from .handler import SYNC_HANDLERS
from .threads import HandlerThreads, call_handler

if TYPE_CHECKING:
    from .._producer.client import Client
    from .job import Job

log = logging.getLogger("venturi_redis.worker")
# Task.timeout itself: a task class that keeps it has no timeout of its own.
_NO_TIMEOUT = Task.timeout
# What Outcome.completed() returns: the usual run's outcome, with nothing to encode.
_DONE = Outcome.completed()


class _Plan(NamedTuple):
    """What every run of one handler class reads off the class, read at its first run.

    A pydantic class's attributes go through its metaclass's ``__getattr__``
    hook (about a thousand instructions each); a run read four of them.
    """

    decode: Callable[[bytes], Any]  # the payload's bytes to the task (codec.model_decoder)
    carry: BaseModel | None  # the shared NoCarry, or None: a fresh default_carry() per run
    timed: bool  # the class overrides Task.timeout()


_PLANS: dict[type[Any], _Plan] = {}


def _plan(handler_cls: type[Any]) -> _Plan:
    plan = _PLANS.get(handler_cls)
    if plan is None:
        try:
            no_carry = handler_cls.carry_type() is NoCarry
        except TaskDefinitionError:  # registration refuses it; a run would end dead, as before
            no_carry = False
        plan = _PLANS[handler_cls] = _Plan(
            model_decoder(handler_cls, task_name(handler_cls)),
            handler_cls.default_carry() if no_carry else None,  # NoCarry's: the one shared instance
            handler_cls.timeout is not _NO_TIMEOUT,
        )
    return plan


def task_name(handler_cls: type[Any]) -> str:
    """The task a handler class runs, as a note names it: the class that declares its
    ``KIND`` (``ShipV2``, not the ``ShipV2Job`` that extends it), else its own name."""
    for klass in handler_cls.__mro__:
        if "KIND" in vars(klass):
            return str(klass.__qualname__)
    return str(handler_cls.__qualname__)


# Characters of a failed run's traceback kept in its journal entry (the tail).
TRACEBACK_TAIL = 2048
# Characters each part of a traceback keeps (a frame, an exception's own line):
# an exception of 10 MB of text must not push every frame out of the tail.
_TRACEBACK_PART = TRACEBACK_TAIL // 4
# The error type of a run whose value is over its cap (as failure_of names ours).
_TOO_LARGE = "venturi_redis.PayloadTooLarge"


class RunHost(Protocol):
    """What running a job asks of its worker (the ``Worker`` is one)."""

    id: str
    state: Any
    # Worker(timeout=...): seconds a run may take when its job sets none.
    timeout: float | None
    handler_threads: HandlerThreads  # where sync handlers run (threads.py)

    @property
    def registry(self) -> dict[str, type[Any]]:
        """The registered handler classes, by KIND."""

    @property
    def shutting_down(self) -> bool:
        """Whether the worker is shutting down (a run that starts now is asked to stop).

        Not while it recycles (recycle.py): it claims no more, but what it claimed runs as usual.
        """

    def crash(self, exc: KeyboardInterrupt | SystemExit, job: Job) -> None:
        """A handler raised ``exc``: stop the worker, releasing its other jobs."""


async def execute(host: RunHost, job: Job) -> Ending:
    """Run ``job``'s handler: how the run ended (never raises but for a cancellation asked of it)."""
    registry = host.registry
    handler_cls = registry.get(job.kind)
    if handler_cls is None:
        return Dead(DeadReason.UNKNOWN_KIND, f"no handler for kind {job.kind!r} on worker {host.id}")
    started = start_run(host, handler_cls, job, registry)
    if not isinstance(started, tuple):
        return started  # its data does not decode (dead), or cannot be decrypted here (failed)
    task, ctx = started
    # The job's own timeout (stored at enqueue), else its task's (a job
    # enqueued without one stored: a workflow's), else the worker's.
    # A task class that does not override timeout() is not asked (two calls per job saved).
    limit: float | None
    if job.timeout_ms:
        limit = job.timeout_ms / 1000
    elif (
        (_PLANS.get(handler_cls) or _plan(handler_cls)).timed
        if type(task) is handler_cls
        else type(task).timeout is not _NO_TIMEOUT
    ):
        limit = task_timeout(task, host.timeout)
    else:
        limit = host.timeout
    try:
        timed_out = False
        try:
            run_span = _tracing.RUN_SPAN  # venturi_redis.otel, while instrumented
            if limit is None and run_span is None:  # the common case: no scope to pay for
                if type(task) in SYNC_HANDLERS:
                    outcome = await call_handler(host.handler_threads, task, ctx, host.state)
                else:
                    outcome = await task.handle(ctx, host.state)  # call_handler's async case, inline
            else:
                # The run's own deadline (a timeout): a cancellation of this
                # scope alone, caught here; the worker's (shutdown) passes through.
                deadline = math.inf if limit is None else limit
                if run_span is None:
                    with anyio.move_on_after(deadline) as scope:
                        outcome = await call_handler(host.handler_threads, task, ctx, host.state)
                else:
                    async with run_span(job) as span:
                        with anyio.move_on_after(deadline) as scope:
                            outcome = await call_handler(host.handler_threads, task, ctx, host.state)
                        if _past(scope):  # the span says why the run ended
                            span.timed_out(deadline)
                timed_out = _past(scope)
        finally:
            if ctx._progress is not None:  # a held-back report lands before the ending
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await ctx._progress.end()
                ctx._progress = None
            ctx._job = None
        if timed_out:
            note = f"timed out after {limit:g} s"
            failed_run(job.id, job.kind, "timeout", note)
            return Failed(note, backoff=task_backoff(task))
        if outcome is _DONE:
            return COMPLETED  # the usual run: nothing to encode
        if not isinstance(outcome, Outcome):
            return _not_an_outcome(handler_cls, outcome)
    except anyio.get_cancelled_exc_class():
        if not _cancel_was_asked():
            # The handler's own CancelledError (it awaited a task it cancelled,
            # or raised it): a failed run like any other error, and the worker
            # goes on. Released instead, it would run again after every restart,
            # and the backstop would never end it.
            note = "the handler raised CancelledError, which the worker did not ask for"
            return Failed(note, backoff=task_backoff(task))
        raise  # the worker releases the job (Worker.run_job)
    except GeneratorExit:
        raise  # this coroutine itself is being closed: nothing may be awaited
    except BaseException as exc:  # noqa: BLE001 - a failed run (error_ending says which)
        return error_ending(host, job, task, ctx, exc)
    result = outcome.result
    if outcome.kind == "completed" and not outcome.note and (result is UNSET or result is None):
        return COMPLETED  # the usual run: nothing to encode
    return outcome_ending(task, outcome, job)


def start_run(
    host: RunHost, handler_cls: type[Any], job: Job, registry: dict[str, type[Any]]
) -> tuple[Any, Context[Any]] | Dead | Failed:
    """A claimed job's task and context, decoded (or the ending of a job that cannot be:
    dead for data that does not decode, failed for a key this worker lacks).

    Sets ``job.ctx``; the context points back at the job until the run's end.
    ``registry``: the worker's handlers by KIND (``host.registry``, read once by the caller).
    """
    crypt = job.queue.client.encryption  # encryption at rest (_model/sealing.py), None: off
    plan = _PLANS.get(handler_cls) or _plan(handler_cls)
    try:
        task = plan.decode(job.payload if crypt is None else crypt.open(job.payload))
    except PayloadError as exc:
        if (missing := missing_key(job.payload, crypt)) is not None:
            return _key_missing(job, "payload", missing)
        return _undecodable("payload", exc, handler_cls, job.payload, crypt)
    try:
        carry: BaseModel = (
            unpack_model(handler_cls.carry_type(), job.carry if crypt is None else crypt.open(job.carry))
            if job.carry
            else plan.carry
            if plan.carry is not None
            else handler_cls.default_carry()
        )
    except (PayloadError, TaskDefinitionError) as exc:
        if (missing := missing_key(job.carry, crypt)) is not None:
            return _key_missing(job, "carry", missing)
        if isinstance(exc, TaskDefinitionError):
            return Dead(DeadReason.INVALID_PAYLOAD, f"carry does not decode: {bounded_note(str(exc))}")
        return _undecodable("carry", exc, handler_cls.carry_type(), job.carry, crypt)
    try:
        resume_input = (
            _decode_resume(handler_cls, job.resume_input if crypt is None else crypt.open(job.resume_input))
            if job.resume_input
            else None
        )
    except PayloadError as exc:
        if (missing := missing_key(job.resume_input, crypt)) is not None:
            return _key_missing(job, "resume input", missing)
        # The value came from queue.resume(); no retry can change it.
        return _undecodable("resume input", exc, None, job.resume_input, crypt, verb="validate")
    # Positional, in the signature's order (keywords cost more): once per run.
    ctx: Context[Any] = Context(
        job.id, job.queue.name, job.kind, job.run_count, job.failures, job.history, carry, resume_input
    )
    job.ctx = ctx
    # While the handler runs only (cleared when it returns): ctx -> job -> ctx is
    # a cycle, which only the cyclic GC would free (~5% of the worker's CPU per job).
    ctx._job = job
    ctx._registry = registry
    if host.shutting_down:
        ctx._cancel("worker shutting down")
    return task, ctx


def _undecodable(
    what: str,
    exc: PayloadError,
    model: type[BaseModel] | None,
    stored: bytes,
    crypt: Encryption | None,
    verb: str = "decode",
) -> Dead:
    """The ending of a run whose job's stored ``what`` does not decode or validate: dead at
    once (``invalid_payload``), since no retry changes stored bytes; a fixed model and an
    operator's retry do (docs/semantics.md, "Changing a task's model while its jobs wait").

    The note names each field that failed and why, with the values of ``model``'s
    sensitive fields masked (a validator's message may quote them). When a validator of
    the model raised something else (``codec.ValidatorRaised``: a migration of older
    payloads that meets one it did not expect), the journal keeps that exception's type
    and traceback as a failed run's, pointing at the validator's line.
    """
    secrets: list[str] = []
    if model is not None:
        with contextlib.suppress(PayloadError):  # not a document: no field of it to mask
            secrets = document_secrets(model, unpack(stored if crypt is None else crypt.open(stored)))
    note = bounded_note(scrub(f"{what} does not {verb}: {exc}", secrets))
    cause = exc.__cause__
    if isinstance(exc, ValidatorRaised) and cause is not None:
        error_type, tb = failure_of(cause, secrets)
        return Dead(DeadReason.INVALID_PAYLOAD, note, error_type, tb)
    return Dead(DeadReason.INVALID_PAYLOAD, note)


def _not_an_outcome(handler_cls: type[Any], returned: object) -> Dead:
    """A ``handle()`` that returned something other than a ``vr.Outcome``: dead at once.

    The handler ran to its end, side effects and all; a retry would run the
    same code again and repeat them (the 25 runs of the backstop would send an
    e-mail 25 times), so the job dies at its first such run, as a permanent
    error does, with a note that says what to write: a handler moved from
    Celery, RQ, arq or Dramatiq returns its value, or nothing
    (docs/migrating.md). Once the code is fixed, ``venturi dead retry
    --error-type TypeError`` brings these jobs back.
    """
    fix = (
        "None (it ended without a return): end it with `return vr.Outcome.completed()`"
        if returned is None
        else f"{type(returned).__name__}: to store it as the job's result, "
        "`return vr.Outcome.completed(result=value)`"
    )
    note = f"{handler_cls.__qualname__}.handle() must return a vr.Outcome, got {fix}"
    return Dead(DeadReason.PERMANENT, note, "TypeError")


def error_ending(host: RunHost, job: Job, task: Any, ctx: Context[Any], exc: BaseException) -> Ending:
    """What a handler's exception makes of its job's run (not a cancellation the worker asked for)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        # Meant for the process, not the job: the worker stops (its other
        # running jobs are released, as at a shutdown past its grace) and
        # run() raises it once they are. The culprit's run counts as failed:
        # a handler that calls sys.exit() does it again on every worker, and
        # the backstop ends it (docs/guarantees.md, "Handlers that raise").
        host.crash(exc, job)
        note = f"the handler raised {bounded_note(repr(exc))}; the worker stopped"
        return Failed(note, backoff=task_backoff(task))
    if isinstance(exc, UnreadableResult) and exc.job_id == job.id:
        # ctx.dependency_results() met a stored result its task's type no longer
        # validates: no retry changes it (a batch's other jobs, failed by the same
        # raise, are charged an ordinary failure below).
        _, tb = failure_of(exc, ())
        return Dead(DeadReason.INVALID_PAYLOAD, bounded_note(str(exc)), "venturi_redis.PayloadError", tb)
    if isinstance(exc, TaskError):
        # A raised message may quote the task's secrets: never stored, never logged.
        secrets = secret_values(task, ctx.carry)
        note = bounded_note(scrub(exc.message, secrets))
        error_type, tb = failure_of(exc, secrets)
        if exc.is_permanent:
            return Dead(DeadReason.PERMANENT, note, error_type, tb)
        failed_run(job.id, job.kind, error_type, note)
        return Failed(note, error_type, tb, task_backoff(task))
    # An Exception, or a BaseException of the handler's own (a library's,
    # `class Boom(BaseException)`) other than the three above: a failed run,
    # and the worker goes on. Before, the latter stopped the worker with a
    # traceback and left the job running, its run never recorded.
    secrets = secret_values(task, ctx.carry)
    note = bounded_note(scrub(said(exc), secrets))
    error_type, tb = failure_of(exc, secrets)
    failed_run(job.id, job.kind, error_type, note, tb if log.isEnabledFor(logging.DEBUG) else "")
    return Failed(note, error_type, tb, task_backoff(task))


def outcome_ending(task: Any, outcome: Outcome, job: Job) -> Ending:
    """What a handler's returned ``vr.Outcome`` makes of its job's run.

    A result or output is encoded here, under the queue client's
    ``max_result_bytes`` (and sealed by its encryption at rest, if on); one
    that cannot be stored (does not encode, or is over the cap) makes the run
    a failed run whose note says why, and nothing of it is written.
    """
    client: Client = job.queue.client
    done = outcome.kind == "completed"
    try:
        blob = _pack_optional(outcome.result if done else outcome.output, client)
    except PayloadError as exc:
        why = f"{'result' if done else 'output'} cannot be stored: {bounded_note(str(exc))}"
        if isinstance(exc, PayloadTooLarge):
            failed_run(job.id, job.kind, _TOO_LARGE, why)
            return Failed(why, _TOO_LARGE, backoff=task_backoff(task))
        return Failed(why, backoff=task_backoff(task))
    note = outcome.note
    if note and len(note) > NOTE_CHARS:
        note = bounded_note(note)
    if done:
        return Completed(note or "", blob) if note or blob else COMPLETED
    if outcome.kind == "pause":
        if (bad := bad_delay(outcome.delay_ms)) is not None:
            # The handler's outcome cannot be stored (a NaN delay): a failed run, never a lost job.
            return Failed(f"the run's outcome cannot be stored: {bad}", backoff=task_backoff(task))
        return Paused(outcome.delay_ms, note or "")
    return Suspended(note or "", blob)


def failure_of(exc: BaseException, secrets: Sequence[str]) -> tuple[str, str]:
    """A raised exception as the journal keeps it: its type, and the tail of its traceback.

    The type is qualified by its module (``KeyError``, ``shop.errors.OutOfStock``;
    venturi's own by the package, ``venturi_redis.TaskError``).
    The traceback (chained causes included) is scrubbed of the task's secrets as
    the note is, each of its parts (a frame, an exception's own lines) cut to
    ``_TRACEBACK_PART`` characters, its start and its end (the note keeps
    more of the message), then the whole cut to its last ``TRACEBACK_TAIL``
    characters at a line start: the frames nearest the raise, and the
    exception's own line. Before the parts were cut, an exception of 10 MB of
    text left no frame in the tail, only the end of its message.
    """
    cls = type(exc)
    module = cls.__module__
    if module.startswith("venturi_redis._"):
        module = "venturi_redis"  # our errors by their public name (vr.TaskError), not their module
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    text = "".join(_part(scrub(part, secrets)) for part in traceback.format_exception(exc)).rstrip("\n")
    if len(text) > TRACEBACK_TAIL:
        tail = text[-TRACEBACK_TAIL:]
        cut = tail.find("\n")
        text = "...\n" + (tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail)
    return name, text


def _part(text: str) -> str:
    """One part of a formatted traceback, cut to ``_TRACEBACK_PART`` characters: its start
    and its end (an exception's line ends as it was raised), what is between counted."""
    if len(text) <= _TRACEBACK_PART:
        return text
    half = _TRACEBACK_PART // 2
    return f"{text[:half]} ... ({len(text) - 2 * half:,} characters not kept) ... {text[-half:]}"


def _past(scope: anyio.CancelScope) -> bool:
    """Whether a run's timeout scope reached its deadline: a timed-out run.

    Whatever the handler did then: a handler that caught the cancellation and
    returned an outcome (or one that blocked the loop past the deadline) still
    overran its timeout, and a timed-out run is a failed run (docs/flow-control.md);
    ``cancelled_caught`` alone would record it as the handler said.
    """
    return scope.cancelled_caught or scope.cancel_called or anyio.current_time() >= scope.deadline


def _cancel_was_asked() -> bool:
    """Whether the CancelledError being handled was asked of this task.

    By the worker (the shutdown grace ran out) or by whoever cancelled
    ``run()``: either cancels a scope around the slot task. asyncio usually
    delivers that with ``task.cancel()`` (``cancelling()``), but anyio skips
    the call for a task whose awaited future is already done and tries again
    next turn: a ``run()`` cancelled in the same turn as the handler's own
    CancelledError shows only as the cancelled scope's deadline of -inf
    (tests/test_guarantees_worker.py). A handler that awaits a task it
    cancelled itself, or raises CancelledError, gets one that nobody asked for.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return True
    return anyio.current_effective_deadline() == -math.inf


def _decode_resume(handler_cls: type[Any], raw: bytes) -> Any:
    """``ctx.resume_input``: None on a first run, typed when the task declares ``RESUME``."""
    if not raw:
        return None
    adapter = handler_cls.resume_adapter()
    return unpack(raw) if adapter is None else unpack_as(adapter, raw, type_name(handler_cls.RESUME))


def _pack_optional(value: Any, client: Client) -> bytes:
    if value is UNSET or value is None:
        return b""
    raw = pack(value)
    if len(raw) > client.max_result_bytes:
        raise over_cap(
            f"the {type(value).__name__} returned", len(raw), client.max_result_bytes, "max_result_bytes"
        )
    crypt = client.encryption
    return raw if crypt is None else crypt.seal(raw)


def _key_missing(job: Job, what: str, exc: EncryptionKeyMissing) -> Failed:
    """A run whose job this worker cannot decrypt: a failed run, retried (docs/security.md).

    Not dead: the likeliest cause is a rollout, one pod not yet given the key
    the producers already encrypt with; another worker (or this one, restarted
    with the key) can run it. The backstop (``max_failures``) still ends a job
    no worker can ever read, with this note.
    """
    note = f"{what} cannot be read: {exc}"
    failed_run(job.id, job.kind, "venturi_redis.EncryptionKeyMissing", note)
    return Failed(note, "venturi_redis.EncryptionKeyMissing")
