"""The checks of what an enqueue is given, each refusal raised before anything is sent.

The values of a task's hooks (``dedup_key``, ``order_key``, ``limit_key``,
``timeout``, ``expires``), the ``at`` and bounds of a call, and the errors
they raise, worded once for every path that takes them: ``prepare``, the
sharded queue's routing, ``update``, schedules and the order-key operations.
"""

from __future__ import annotations

import inspect
import math
from datetime import datetime, timedelta

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError, PayloadTooLarge, TaskDefinitionError
from .._model.task import Task
from .keys import dedup_field, limit_field

DEDUP_KEY_MAX = 1024
LIMIT_KEY_MAX = 1024
ORDER_KEY_MAX = 1024


def not_a_task(value: object, call: str = "enqueue") -> str:
    """What ``call`` says of ``value``, which is no ``vr.Task`` instance: what it got, and,
    for what a user moving from a function-based queue passes (a task class, a function,
    an ``@vr.offload`` function), what to pass instead (docs/migrating.md)."""
    said = f"{call} expects a vr.Task instance"
    if isinstance(value, type) and issubclass(value, Task):
        return f"{said}, got the class {value.__qualname__}: build one, {value.__qualname__}(field=...)"
    name = getattr(value, "__qualname__", None) or type(value).__name__
    if callable(getattr(value, "offload", None)):
        return f"{said}, got the @vr.offload function {name}: enqueue it with {name}.offload(client, ...)"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return (
            f"{said}, got the function {name}: a job is a vr.Task subclass built with its "
            "fields (docs/migrating.md), or a function (def or async def) decorated with "
            f"@vr.offload, enqueued by {name}.offload(client, ...)"
        )
    return f"{said}, got {type(value).__name__}"


def checked_at(at: object, delay: object) -> int:
    """``enqueue(at=...)`` in ms since the epoch: an aware datetime, never beside a ``delay``.

    Checked before anything is read or written, so a refused call sends
    nothing. The caller subtracts the scripts' clock (one read of it) to make
    the job's delay: the job is eligible at ``at`` by that clock, the one every
    worker's claim uses, whatever this process's clock says.
    """
    if not isinstance(at, datetime):
        raise ConfigurationError(f"at must be a timezone-aware datetime, got {at!r}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise ConfigurationError(
            f"at must be timezone-aware (a naive datetime names no instant), got {at!r}: "
            "use datetime(..., tzinfo=UTC) or datetime.now(UTC) + timedelta(...)"
        )
    if not (delay == 0 and delay is not False):
        raise ConfigurationError(f"give at= or delay=, not both (got delay={delay!r})")
    return round(at.timestamp() * 1000)


def checked_dedup_field(kind: str, key: object) -> str:
    if not isinstance(key, str):
        raise TaskDefinitionError(f"{kind}.dedup_key() must return str or None, got {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"{kind} dedup key is not valid UTF-8 text: {exc}") from None
    if not 1 <= size <= DEDUP_KEY_MAX:
        raise ConfigurationError(
            f"{kind} dedup key must be 1 to {DEDUP_KEY_MAX} bytes of UTF-8, "
            f"got {size} bytes; hash a longer key yourself"
        )
    return dedup_field(kind, key)


def checked_timeout(kind: str, value: object) -> str:
    """A run timeout as enqueue.lua stores it: whole ms as text, '' for None (the worker's)."""
    if value is None:
        return ""
    ok = isinstance(value, timedelta) or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    )
    ms = to_ms(value, "timeout") if ok else 0  # type: ignore[arg-type]
    if not ok or ms < 1:
        raise ConfigurationError(f"{kind} timeout must be a positive finite number of seconds, got {value!r}")
    return str(ms)


def checked_expires(kind: str, value: object, delay_ms: int) -> str:
    """A start deadline as job_args.lua takes it: whole ms from the enqueue, as text.

    Past the deadline a job never starts, so one whose eligibility (``delay``,
    ``at``) is at or after it could never run: refused, as a bad value is.
    """
    if isinstance(value, timedelta):
        ok = value > timedelta(0)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
    ms = to_ms(value, "expires") if ok else 0  # type: ignore[arg-type]
    if not ok or ms < 1:
        raise ConfigurationError(
            f"{kind} expires must be a positive finite number of seconds (or a timedelta) "
            f"of at least 1 ms, got {value!r}"
        )
    if delay_ms >= ms:
        raise ConfigurationError(
            f"{kind} would be eligible {delay_ms} ms from now, at or past its deadline "
            f"(expires={value!r}): it could never run"
        )
    return str(ms)


def checked_limit_key(kind: str, key: object) -> str:
    """``Task.limit_key()`` as stored in the job's ``limit_key`` field ('' for None)."""
    if key is None:
        return ""
    if not isinstance(key, str):
        raise ConfigurationError(f"{kind}.limit_key() must return str or None, got {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"{kind} limit key is not valid UTF-8 text: {exc}") from None
    if size > LIMIT_KEY_MAX:
        raise ConfigurationError(
            f"{kind} limit key must be at most {LIMIT_KEY_MAX} bytes of UTF-8, got {size}"
        )
    return limit_field(key)


def checked_order_key(kind: str, key: object, dedup: str) -> str:
    """``Task.order_key()`` as stored in the job's ``order_key`` field: 1 to 1024 bytes of UTF-8.

    Not beside a dedup key: a merge changes a pending job in place, which an
    order of enqueues cannot say where to put (docs/semantics.md).
    """
    if not isinstance(key, str):
        raise ConfigurationError(f"{kind}.order_key() must return str or None, got {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"{kind} order key is not valid UTF-8 text: {exc}") from None
    if not 1 <= size <= ORDER_KEY_MAX:
        raise ConfigurationError(f"{kind} order key must be 1 to {ORDER_KEY_MAX} bytes of UTF-8, got {size}")
    if dedup:
        raise ConfigurationError(
            f"{kind} has both an order key and a dedup key: give it one or the other "
            "(an ordered job is never merged into another)"
        )
    return key


def check_batch_count(count: int, max_jobs: int) -> None:
    """Raise unless an ``enqueue_many`` of ``count`` tasks is within ``Client(max_batch_jobs=...)``."""
    if count > max_jobs:
        raise ConfigurationError(
            f"enqueue_many takes at most {max_jobs:,} tasks per call, got {count:,}: one call is "
            "one transaction, which Redis runs whole while it serves nobody else; enqueue them in "
            f"calls of {max_jobs:,} or fewer (each all or nothing), or raise Client(max_batch_jobs=...)"
        )


def batch_too_large(call: str, count: int, cap: int) -> PayloadTooLarge:
    """A call of many jobs whose payloads add up to more than ``Client(max_batch_bytes=...)``."""
    return PayloadTooLarge(
        f"{call} of {count:,} tasks: their payloads add up to over {cap:,} bytes encoded, the cap of "
        "one call (Client(max_batch_bytes=...)); Redis copies every byte of it while it serves "
        "nobody else: split the call"
    )


def payload_too_large(kind: str, size: int, cap: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{kind} payload is {size} bytes encoded, over the cap of {cap} "
        "(Client(max_payload_bytes=...)); store large data elsewhere and enqueue a reference"
    )
