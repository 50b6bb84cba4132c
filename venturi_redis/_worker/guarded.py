"""The application's code a run calls besides ``handle``, kept from breaking the run or the worker.

A run calls the task's ``timeout()`` when it starts and its ``backoff()``
when it fails, turns a raised exception into its note with ``str()``, and
tells the worker's observer (the application's metrics) of each claim and
ending. That code can raise or return what it should not. Each such slip is
logged once and the run goes on: with the worker's own setting, a note
naming the exception's class, or as if the observer had returned. Before,
each was an internal error of the worker that left the job to wait out its
lease, and an observer's could stop the worker (docs/guarantees.md, "The
application's code around a handler").
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

from .._model.backoff import Backoff
from .._model.errors import said

log = logging.getLogger("venturi_redis.worker")

# The slips already warned of in this process (task class, method, what it
# did): a broken method would otherwise log on every run of its kind.
_warned: set[tuple[type, str, type]] = set()


# The observer methods that raised, with the exception's type, already logged in this process.
_raised: set[tuple[str, type]] = set()


def observer_raised(method: str, exc: Exception) -> None:
    """An observer's ``method`` raised ``exc``: logged once per method and exception type, and ignored.

    An observer is the application's code (its metrics, its hooks); a bug in
    it must neither stop the worker nor hold a job, so every call of one is
    guarded and the run goes on as if it had returned.
    """
    key = (method, type(exc))
    if key not in _raised:
        _raised.add(key)
        log.warning("the worker's observer raised in %s(); ignored (logged once)", method, exc_info=exc)


def _slip(task: Any, method: str, what: str, cause: type) -> None:
    # Keyed by the cause's type, not by `what`: a message that names the job's
    # own values (`KeyError('acme-42')`) made an entry, and a WARNING, per job.
    key = (type(task), method, cause)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s.%s() %s; the worker's own is used (logged once)", type(task).__name__, method, what)


def task_backoff(task: Any) -> Backoff | None:
    """``task.backoff()``; None (the worker's backoff) when it raises or returns no ``vr.Backoff``."""
    try:
        value = task.backoff()
    except Exception as exc:  # noqa: BLE001 - the task's own method
        _slip(task, "backoff", f"raised {said(exc, named=True)}", type(exc))
        return None
    if value is None or isinstance(value, Backoff):
        return value
    _slip(task, "backoff", f"returned {type(value).__name__}, not a vr.Backoff or None", type(value))
    return None


def task_timeout(task: Any, default: float | None) -> float | None:
    """``task.timeout()`` in seconds; ``default`` when it is None, raises, or is no positive number."""
    try:
        value = task.timeout()
    except Exception as exc:  # noqa: BLE001 - the task's own method
        _slip(task, "timeout", f"raised {said(exc, named=True)}", type(exc))
        return default
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
