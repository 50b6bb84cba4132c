"""Where tracing hooks in: two slots that ``venturi_redis.otel`` fills while it is instrumented.

Both are None otherwise, and then the hot path pays one None check for each:
nothing of OpenTelemetry is imported unless ``venturi_redis.otel`` is.

* ``TRACE`` (producer): the current trace context, as the W3C ``traceparent``
  (then a space and the ``tracestate`` when there is one); ``prepare`` stores
  it on the job (``Prepared.trace``, the job hash's ``trace`` field).
* ``RUN_SPAN`` (worker): given the claimed job, the async context manager a
  run's handler call runs in (its CONSUMER span, recording an exception); what
  it yields has ``timed_out(seconds)``, called when the run's own timeout cut
  the handler short.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

TRACE: Callable[[], str] | None = None
RUN_SPAN: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None
