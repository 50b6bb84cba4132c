"""Running one claimed job: decode it, call its handler, and turn what came of it into a transition.

Every ending has its transition (docs/guarantees.md): a result completes, a
``vr.Outcome`` pauses or suspends, an error is a failed run (retried, or dead
at the backstop), a permanent ``TaskError`` or undecodable data is dead, and a
cancellation the worker asked for releases the job. The transition itself is
sent by the worker (``RunHost._commit``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from pydantic import BaseModel

from .._model import tracing as _tracing
from .._model.codec import pack, unpack, unpack_as, unpack_model
from .._model.errors import PayloadError, TaskDefinitionError, TaskError
from .._model.outcome import UNSET, Outcome
from .._model.redact import scrub, secret_values
from .._model.task import Task
from .context import Context

if TYPE_CHECKING:
    from .runner import _Job

log = logging.getLogger("venturi_redis.worker")
# Task.timeout itself: a task class that keeps it has no timeout of its own.
_NO_TIMEOUT = Task.timeout
# Characters of a failed run's traceback kept in its journal entry (the tail).
TRACEBACK_TAIL = 2048


class RunHost(Protocol):
    """What running a job asks of its worker (the ``Worker`` is one)."""

    id: str
    state: Any
    _registry: dict[str, type[Any]]
    # Worker(timeout=...): seconds a run may take when its job sets none.
    timeout: float | None

    _stopping: bool  # read once per run: a plain attribute, not a property

    async def _commit(
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
        """Write the run's transition (``action`` names its script)."""

    def _crash(self, exc: KeyboardInterrupt | SystemExit, job: _Job) -> None:
        """A handler raised ``exc``: stop the worker, releasing its other jobs."""


async def execute(host: RunHost, job: _Job) -> None:
    """Run ``job``'s handler and commit what came of it (never raises but for a cancellation)."""
    handler_cls = host._registry.get(job.kind)
    if handler_cls is None:
        await host._commit(
            job,
            "dead",
            note=f"no handler for kind {job.kind!r} on worker {host.id}",
            reason="unknown_kind",
        )
        return
    try:
        task = unpack_model(handler_cls, job.payload)
    except PayloadError as exc:
        await host._commit(job, "dead", note=f"payload does not decode: {exc}", reason="bad_payload")
        return
    try:
        carry: BaseModel = (
            unpack_model(handler_cls.carry_type(), job.carry) if job.carry else handler_cls.default_carry()
        )
    except (PayloadError, TaskDefinitionError) as exc:
        await host._commit(job, "dead", note=f"carry does not decode: {exc}", reason="bad_payload")
        return
    try:
        resume_input = _decode_resume(handler_cls, job.resume_input) if job.resume_input else None
    except PayloadError as exc:
        # The value came from queue.resume(); no retry can change it.
        await host._commit(job, "dead", note=f"resume input does not validate: {exc}", reason="bad_payload")
        return
    ctx: Context[Any] = Context(
        job_id=job.id,
        queue=job.queue.name,
        kind=job.kind,
        run_count=job.run_count,
        failures=job.failures,
        history=job.history,
        carry=carry,
        resume_input=resume_input,
    )
    job.ctx = ctx
    # While the handler runs only (cleared below): ctx -> job -> ctx is a cycle,
    # which only the cyclic GC would free (~5% of the worker's CPU per job).
    ctx._job = job
    ctx._registry = host._registry
    if host._stopping:
        ctx._cancel("worker shutting down")
    # The job's own timeout (stored at enqueue), else its task's (a job
    # enqueued without one stored: a workflow's), else the worker's.
    # A task class that does not override timeout() is not asked (two calls per job saved).
    limit: float | None
    if job.timeout_ms:
        limit = job.timeout_ms / 1000
    elif type(task).timeout is _NO_TIMEOUT:
        limit = host.timeout
    else:
        limit = _task_timeout(task, host.timeout)
    try:
        timed_out = False
        try:
            run_span = _tracing.RUN_SPAN  # venturi_redis.otel, while instrumented
            if limit is None and run_span is None:
                outcome = await task.handle(ctx, host.state)  # the common case: no scope to pay for
            else:
                # The run's own deadline (a timeout): a cancellation of this
                # scope alone, caught here; the worker's (shutdown) passes through.
                deadline = math.inf if limit is None else limit
                if run_span is None:
                    with anyio.move_on_after(deadline) as scope:
                        outcome = await task.handle(ctx, host.state)
                else:
                    async with run_span(job) as span:
                        with anyio.move_on_after(deadline) as scope:
                            outcome = await task.handle(ctx, host.state)
                        if _past(scope):  # the span says why the run ended
                            span.timed_out(deadline)
                timed_out = _past(scope)
        finally:
            if ctx._progress is not None:  # a held-back report lands before the transition
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await ctx._progress.end()
                ctx._progress = None
            ctx._job = None
        if timed_out:
            note = f"timed out after {limit:g} s"
            log.info("job %s (%s) %s", job.id, job.kind, note)
            await host._commit(job, "retry", ctx=ctx, note=note, task=task)
            return
        if not isinstance(outcome, Outcome):
            got = type(outcome).__name__
            raise TypeError(f"{handler_cls.__qualname__}.handle() must return a vr.Outcome, got {got}")
    except anyio.get_cancelled_exc_class():
        if not _cancel_was_asked():
            # The handler's own CancelledError (it awaited a task it cancelled,
            # or raised it): a failed run like any other error, and the worker
            # goes on. Released instead, it would run again after every restart,
            # and the backstop would never end it.
            note = "the handler raised CancelledError, which the worker did not ask for"
            await host._commit(job, "retry", ctx=ctx, note=note, task=task)
            return
        # Sent directly, not through the committer: when run() itself is
        # cancelled, the committer's tasks are being cancelled too.
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await host._commit(job, "release", ctx=ctx, note="released on worker shutdown", direct=True)
        raise
    except (KeyboardInterrupt, SystemExit) as exc:
        # Meant for the process, not the job: the worker stops (its other
        # running jobs are released, as at a shutdown past its grace) and
        # run() raises it once they are. The culprit's run counts as failed:
        # a handler that calls sys.exit() does it again on every worker, and
        # the backstop ends it (docs/guarantees.md, "Handlers that raise").
        host._crash(exc, job)
        note = f"the handler raised {exc!r}; the worker stopped"
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await host._commit(job, "retry", ctx=ctx, note=note, task=task, direct=True)
        return
    except TaskError as exc:
        # A raised message may quote the task's secrets: never stored, never logged.
        secrets = secret_values(task, ctx.carry)
        note = scrub(exc.message, secrets)
        error = failure_of(exc, secrets)
        if exc.is_permanent:
            await host._commit(job, "dead", ctx=ctx, note=note, reason="permanent", error=error)
        else:
            await host._commit(job, "retry", ctx=ctx, note=note, task=task, error=error)
        return
    except GeneratorExit:
        raise  # this coroutine itself is being closed: nothing may be awaited
    except BaseException as exc:
        # An Exception, or a BaseException of the handler's own (a library's,
        # `class Boom(BaseException)`) other than the three above: a failed run,
        # and the worker goes on. Before, the latter stopped the worker with a
        # traceback and left the job running, its run never recorded.
        secrets = secret_values(task, ctx.carry)
        note = scrub(str(exc) or type(exc).__name__, secrets)
        log.info("job %s (%s) failed: %s", job.id, job.kind, note, exc_info=log.isEnabledFor(logging.DEBUG))
        await host._commit(job, "retry", ctx=ctx, note=note, task=task, error=failure_of(exc, secrets))
        return
    try:
        blob = _pack_optional(outcome.result if outcome.kind == "completed" else outcome.output)
    except PayloadError as exc:
        what = "result" if outcome.kind == "completed" else "output"
        await host._commit(job, "retry", ctx=ctx, note=f"{what} cannot be stored: {exc}", task=task)
        return
    if outcome.kind == "completed":
        await host._commit(job, "complete", ctx=ctx, note=outcome.note, blob=blob)
    elif outcome.kind == "pause":
        await host._commit(job, "pause", ctx=ctx, note=outcome.note, delay_ms=outcome.delay_ms)
    else:
        await host._commit(job, "suspend", ctx=ctx, note=outcome.note, blob=blob)


def failure_of(exc: BaseException, secrets: Sequence[str]) -> tuple[str, str]:
    """A raised exception as the journal keeps it: its type, and the tail of its traceback.

    The type is qualified by its module (``KeyError``, ``shop.errors.OutOfStock``;
    venturi's own by the package, ``venturi_redis.TaskError``).
    The traceback (chained causes included) is scrubbed of the task's secrets as
    the note is, then cut to its last ``TRACEBACK_TAIL`` characters at a line
    start: the frames nearest the raise, and the exception's own line.
    """
    cls = type(exc)
    module = cls.__module__
    if module.startswith("venturi_redis._"):
        module = "venturi_redis"  # our errors by their public name (vr.TaskError), not their module
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    text = scrub("".join(traceback.format_exception(exc)), secrets).rstrip("\n")
    if len(text) > TRACEBACK_TAIL:
        tail = text[-TRACEBACK_TAIL:]
        cut = tail.find("\n")
        text = "...\n" + (tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail)
    return name, text


def _past(scope: anyio.CancelScope) -> bool:
    """Whether a run's timeout scope reached its deadline: a timed-out run.

    Whatever the handler did then: a handler that caught the cancellation and
    returned an outcome (or one that blocked the loop past the deadline) still
    overran its timeout, and a timed-out run is a failed run (docs/flow-control.md);
    ``cancelled_caught`` alone would record it as the handler said.
    """
    return scope.cancelled_caught or scope.cancel_called or anyio.current_time() >= scope.deadline


def _task_timeout(task: Any, default: float | None) -> float | None:
    value = task.timeout()
    if value is None:
        return default
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        log.warning(
            "%s.timeout() returned %r, not a positive number of seconds; ignored", type(task).__name__, value
        )
        return default
    return float(value)


def _cancel_was_asked() -> bool:
    """Whether the CancelledError being handled was asked of this task.

    By the worker (the shutdown grace ran out) or by whoever cancelled
    ``run()``: either cancels a scope around the slot task, which asyncio
    delivers with ``task.cancel()``. A handler that awaits a task it cancelled
    itself, or raises CancelledError, gets one that nobody asked for.
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
    return unpack(raw) if adapter is None else unpack_as(adapter, raw)


def _pack_optional(value: Any) -> bytes:
    return b"" if value is UNSET or value is None else pack(value)
