"""OpenTelemetry tracing: from the enqueue in a web process to the run in a worker.

::

    from venturi_redis.otel import VenturiInstrumentor

    VenturiInstrumentor().instrument()  # once, at start-up, in producers and workers

Needs the ``otel`` extra (``pip install 'venturi-redis[otel]'``). Once
instrumented:

* ``Queue.enqueue``, ``Queue.enqueue_many`` and ``Queue.enqueue_flow`` run in a PRODUCER span
  ``send <queue>``, and each job stores the W3C trace context of that span
  (its hash's ``trace`` field, written by the enqueue script itself, so a
  worker that claims the job at once still finds it).
* Each run is a CONSUMER span ``process <queue>`` whose parent is that context
  (a retry's run is a new span in the same trace, linked to the run before
  it); the handler's own spans nest under it. A handler that raises records the exception and sets the
  span's status to ERROR (whatever then happens to the job: retried or dead), with the
  values of the task's sensitive fields masked as in the stored note.
* Attributes follow the messaging semantic conventions: ``messaging.system``
  (``redis``), ``messaging.destination.name`` (the queue),
  ``messaging.operation.type`` (``send`` / ``process``),
  ``messaging.message.id`` (the job id; for a batch, ``messaging.batch.message_count``),
  plus ``venturi.kind`` and ``venturi.run``.

Not instrumented, venturi_redis imports nothing of OpenTelemetry and pays one
None check per enqueue and per run (``_model/tracing.py``). A run span costs
the worker one ``HMGET`` of the job's ``trace`` and ``trace_run`` fields before
the handler runs, and one ``HSET`` of ``trace_run`` (its own context, for the
next run's link) after it.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from redis.exceptions import RedisError

from . import __version__
from ._model import tracing as _tracing
from ._model.codec import unpack_model
from ._model.redact import scrub, secret_values
from ._producer.client import Queue

_W3C = TraceContextTextMapPropagator()
# Queue's own methods while instrumented (BaseInstrumentor is a singleton).
_originals: dict[str, Any] = {}
_SYSTEM = "redis"

__all__ = ["VenturiInstrumentor"]


def _current_trace() -> str:
    """The current span's W3C context as stored on a job: traceparent[ tracestate]."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    parent = carrier.get("traceparent", "")
    state = carrier.get("tracestate", "")
    return f"{parent} {state}" if parent and state else parent


def _trace_of(span: trace.Span) -> str:
    """``span``'s W3C traceparent."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def _context_of(stored: bytes | str | None) -> otel_context.Context | None:
    """The context a job's ``trace`` field stands for (None when it has none)."""
    if not stored:
        return None
    text = stored.decode() if isinstance(stored, bytes) else stored
    parent, _, state = text.partition(" ")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    return _W3C.extract(carrier)


class _Run:
    """What the worker may tell a run's span (``_model/tracing.py``'s RUN_SPAN yields it)."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def timed_out(self, seconds: float) -> None:
        """The run's own timeout cut the handler short (no exception reaches the span)."""
        self.span.set_status(Status(StatusCode.ERROR, f"timed out after {seconds:g} s"))


def _secrets(job: Any) -> list[str] | None:
    """The values of the run's sensitive fields, which the worker masks in its notes
    (``_model/redact.py``): its task's (decoded again from the payload, on this error
    path only) and its carry's as the handler left it. None when the task cannot be
    read (no handler class, a payload that no longer decodes): nothing can be masked."""
    ctx = getattr(job, "ctx", None)
    registry = getattr(ctx, "_registry", None) or {}
    cls = registry.get(job.kind)
    if cls is None:
        return None
    try:
        crypt = job.queue.client.encryption
        task = unpack_model(cls, job.payload if crypt is None else crypt.open(job.payload))
    except Exception:  # noqa: BLE001 - it decoded for the run; anything now means: unknown
        return None
    return secret_values(task, getattr(ctx, "carry", None))


def _record_failure(span: trace.Span, job: Any, exc: BaseException) -> None:
    """``span.record_exception`` and an ERROR status, with the task's sensitive values
    masked in all three texts, as in the stored note (docs/observability.md).

    The exception event is written here rather than by ``record_exception``, whose
    message and stacktrace come from the exception itself: a handler's error often
    quotes its input (``card 4242... declined``), and spans leave for whatever
    backend the exporter sends them to. When the secrets cannot be known, the
    event carries the exception's type alone.
    """
    cls = type(exc)
    module = cls.__module__
    kind = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    secrets = _secrets(job)
    attributes: dict[str, str] = {"exception.type": kind, "exception.escaped": "False"}
    status = cls.__name__
    if secrets is not None:
        message = scrub(str(exc), secrets)
        attributes["exception.message"] = message
        attributes["exception.stacktrace"] = scrub("".join(traceback.format_exception(exc)), secrets)
        status = f"{cls.__name__}: {message}"
    span.add_event("exception", attributes)
    span.set_status(Status(StatusCode.ERROR, status))


class VenturiInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces venturi_redis's enqueues (PRODUCER spans) and runs (CONSUMER spans).

    ``VenturiInstrumentor().instrument(tracer_provider=...)``; without a
    provider, the global one. ``uninstrument()`` restores everything.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(__name__, __version__, tracer_provider=kwargs.get("tracer_provider"))
        enqueue, enqueue_many, enqueue_flow = Queue.enqueue, Queue.enqueue_many, Queue.enqueue_flow
        _originals.update(enqueue=enqueue, enqueue_many=enqueue_many, enqueue_flow=enqueue_flow)

        def send_span(queue: Queue, **attributes: Any) -> Any:
            """The PRODUCER span of one enqueue call: ``send <queue>``."""
            return tracer.start_as_current_span(
                f"send {queue.name}",
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": _SYSTEM,
                    "messaging.destination.name": queue.name,
                    "messaging.operation.type": "send",
                    **attributes,
                },
            )

        @functools.wraps(enqueue)
        async def traced_enqueue(self: Queue, task: Any, **options: Any) -> str:
            with send_span(self, **{"venturi.kind": getattr(task, "KIND", "") or ""}) as span:
                job_id: str = await enqueue(self, task, **options)
                span.set_attribute("messaging.message.id", job_id)
                return job_id

        @functools.wraps(enqueue_many)
        async def traced_enqueue_many(self: Queue, tasks: Sequence[Any], **options: Any) -> list[str]:
            with send_span(self, **{"messaging.batch.message_count": len(tasks)}):
                ids: list[str] = await enqueue_many(self, tasks, **options)
                return ids

        @functools.wraps(enqueue_flow)
        async def traced_enqueue_flow(self: Queue, parent: Any, children: Any, **options: Any) -> Any:
            with send_span(self, **{"venturi.kind": getattr(parent, "KIND", "") or ""}):
                return await enqueue_flow(self, parent, children, **options)

        @contextlib.asynccontextmanager
        async def run_span(job: Any) -> AsyncIterator[_Run]:
            queue = job.queue
            job_key = queue.keys.job(job.id)
            try:
                stored, previous = await queue.client.redis.hmget(job_key, "trace", "trace_run")
            except (RedisError, OSError):  # the run goes on, in a trace of its own
                stored = previous = None
            links = []
            before = trace.get_current_span(_context_of(previous)).get_span_context() if previous else None
            if before is not None and before.is_valid:
                links.append(trace.Link(before))
            span = tracer.start_span(
                f"process {queue.name}",
                context=_context_of(stored),
                kind=SpanKind.CONSUMER,
                links=links,
                attributes={
                    "messaging.system": _SYSTEM,
                    "messaging.destination.name": queue.name,
                    "messaging.operation.type": "process",
                    "messaging.message.id": job.id,
                    "venturi.kind": job.kind,
                    "venturi.run": job.run_count,
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                yield _Run(span)
            except Exception as exc:  # the handler's error: recorded, then handled by the worker
                _record_failure(span, job, exc)
                raise
            finally:
                otel_context.detach(token)
                span.end()
                # The next run (a retry, a pause's next step) links to this one.
                with contextlib.suppress(RedisError, OSError), anyio.move_on_after(1, shield=True):
                    await queue.client.redis.hset(job_key, "trace_run", _trace_of(span))

        Queue.enqueue = traced_enqueue  # type: ignore[method-assign]
        Queue.enqueue_many = traced_enqueue_many  # type: ignore[method-assign]
        Queue.enqueue_flow = traced_enqueue_flow  # type: ignore[method-assign]
        _tracing.TRACE = _current_trace
        _tracing.RUN_SPAN = run_span

    def _uninstrument(self, **kwargs: Any) -> None:
        if _originals:
            Queue.enqueue = _originals["enqueue"]  # type: ignore[method-assign]
            Queue.enqueue_many = _originals["enqueue_many"]  # type: ignore[method-assign]
            Queue.enqueue_flow = _originals["enqueue_flow"]  # type: ignore[method-assign]
        _originals.clear()
        _tracing.TRACE = None
        _tracing.RUN_SPAN = None
