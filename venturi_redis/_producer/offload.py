"""``@vr.offload``: run an async function on a worker, read its typed result back.

The producer side (``.offload()``, ``resolve``, ``read_result``…) needs only a
``Client``; the worker side needs only ``worker.register(fn)``. Nothing here
imports the worker, so a web process that offloads stays light.

Result path, step by step:

1. ``fn.offload(client, ...)`` mints a token of 192 random bits, enqueues the
   job and writes a ``pending`` snapshot under ``venturi:{q}:offload:<token>``
   in the same script call (``lua/enqueue.lua``), so a read tells an unknown
   key from work in progress. The caller gets ``OffloadHandle.key``,
   ``"<queue>:<token>"``: a capability, returned to the caller only.
2. When the job settles (``complete``; ``dead``, the retry backstop and the
   reclaim backstop), the script that settles it rewrites the snapshot
   (``completed`` with the msgpack result, or ``failed`` with the raw error),
   sets its expiry (the retention) and publishes a redacted wake-up on
   ``venturi:{q}:offload:<token>:done`` (``lua/include/offload.lua``).
3. ``resolve`` subscribes, waits for the subscription to be confirmed, reads
   the snapshot, and only then waits for the wake-up: a job that settles at any
   moment is seen either by the read or by the subscription.
4. An operator's retry of a dead offload job (``lua/retry_dead.lua``) writes
   the ``pending`` snapshot again, without expiry, with the job's move back to
   pending: readers see the rerun coming and ``resolve`` waits for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Generic, Literal, ParamSpec, TypeVar, get_type_hints, overload

import anyio
from pydantic import ConfigDict, TypeAdapter, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.backoff import to_ms
from .._model.codec import unpack_as
from .._model.enums import Priority
from .._model.errors import ConfigurationError, PayloadError, TaskError, VenturiError
from .._model.outcome import UNSET, Outcome
from .._model.task import Task, validate_kind
from .._store.keys import QueueKeys, validate_name
from .client import Client

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

REDACTED = "terminal error"
"""What ``read_result_redacted`` (and the published wake-up) say instead of an error."""

DEFAULT_RETENTION = timedelta(days=1)
_TOKEN_BYTES = 24  # 192 random bits, 32 URL-safe characters
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
# Longest single pub/sub read. When it passes without a wake-up, resolve reads
# the snapshot once more: redis-py may reconnect and resubscribe a pub/sub
# connection without telling us, and a wake-up published while it was down is
# gone. The subscription is what makes resolve prompt; this re-read only
# bounds how late a lost wake-up can make it.
_WAIT_SLICE = 5.0

Status = Literal["completed", "failed", "pending"]


class OffloadNotFound(VenturiError, LookupError):
    """No snapshot exists under an offload key: never issued, or expired after its retention."""


@dataclass(frozen=True, slots=True)
class OffloadResult(Generic[T]):
    """Where an offloaded call stands.

    Attributes:
        status: ``"completed"``, ``"failed"`` or ``"pending"`` (queued, running,
            retrying, or ``resolve`` timed out).
        value: The function's return value, validated into its return type,
            when completed; else ``None``.
        error: Why it failed, when failed: the raw error from ``read_result``
            and ``resolve``, ``"terminal error"`` from ``read_result_redacted``.
        job_id: The job that ran (or will run) the call.
    """

    status: Status
    value: T | None = None
    error: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffloadHandle(Generic[T]):
    """What ``fn.offload(...)`` returns: where the result of one call will land.

    Attributes:
        key: ``"<queue>:<token>"``, the capability to read the result. Give it
            only to whoever may read the result; it is left out of ``repr``.
        job_id: The job's id (for ``queue.get`` and the journal).
        result_type: The type results are validated into.

    A key kept elsewhere (a session, a database row) becomes a typed handle
    again with ``fn.handle(key)``.
    """

    key: str = field(repr=False)
    job_id: str = ""
    result_type: Any = field(default=Any, repr=False, compare=False)


def _adapter(tp: Any) -> TypeAdapter[Any]:
    try:
        return _cached_adapter(tp)
    except TypeError:  # an unhashable annotation: build it every time
        return TypeAdapter(tp)


@functools.lru_cache(maxsize=256)
def _cached_adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _parse_key(client: Client, key: str) -> tuple[QueueKeys, str]:
    """The queue keys and token of a handle key; the key itself never goes in a message."""
    queue, sep, token = key.rpartition(":") if isinstance(key, str) else ("", "", "")
    if not sep or not _TOKEN_RE.fullmatch(token):
        raise ConfigurationError(
            "not an offload key: expected '<queue>:<token>' exactly as OffloadHandle.key gave it"
        )
    validate_name(queue)
    return QueueKeys.for_queue(queue, client.namespace), token


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _decode(raw: dict[bytes, bytes], adapter: TypeAdapter[Any], *, redact: bool) -> OffloadResult[Any]:
    status = _text(raw.get(b"status"))
    job_id = _text(raw.get(b"job_id")) or None
    if status == "pending":
        return OffloadResult("pending", job_id=job_id)
    if status == "failed":
        return OffloadResult("failed", error=REDACTED if redact else _text(raw.get(b"error")), job_id=job_id)
    if status == "completed":
        blob = raw.get(b"value")
        if blob:
            value = unpack_as(adapter, blob)
        else:  # the function returned None
            try:
                value = adapter.validate_python(None)
            except ValidationError as exc:
                raise PayloadError(f"offload result of job {job_id} is empty: {exc}") from exc
        return OffloadResult("completed", value=value, job_id=job_id)
    raise PayloadError(f"offload snapshot of job {job_id} has an unknown status {status!r}")


async def _read(client: Client, key: str, result_type: Any, *, redact: bool) -> OffloadResult[Any] | None:
    keys, token = _parse_key(client, key)
    raw = await client.redis.hgetall(keys.offload(token))
    return _decode(raw, _adapter(result_type), redact=redact) if raw else None


@overload
async def read_result(client: Client, handle: OffloadHandle[T], /) -> OffloadResult[T] | None: ...
@overload
async def read_result(client: Client, key: str, /, result_type: type[T]) -> OffloadResult[T] | None: ...
@overload
async def read_result(client: Client, key: str, /) -> OffloadResult[Any] | None: ...
async def read_result(
    client: Client, handle: OffloadHandle[Any] | str, /, result_type: Any = Any
) -> OffloadResult[Any] | None:
    """Read the authoritative snapshot once, without waiting; the raw error included.

    For server-side code that may see diagnostics. Returns ``None`` when no
    snapshot exists under the key (never issued, or expired).

    Raises:
        ConfigurationError: ``key`` is not an offload key.
        PayloadError: the stored value does not validate as ``result_type``.
    """
    if isinstance(handle, OffloadHandle):
        return await _read(client, handle.key, handle.result_type, redact=False)
    return await _read(client, handle, result_type, redact=False)


@overload
async def read_result_redacted(client: Client, handle: OffloadHandle[T], /) -> OffloadResult[T] | None: ...
@overload
async def read_result_redacted(
    client: Client, key: str, /, result_type: type[T]
) -> OffloadResult[T] | None: ...
@overload
async def read_result_redacted(client: Client, key: str, /) -> OffloadResult[Any] | None: ...
async def read_result_redacted(
    client: Client, handle: OffloadHandle[Any] | str, /, result_type: Any = Any
) -> OffloadResult[Any] | None:
    """Like ``read_result``, but a failure's error is always ``"terminal error"``.

    For a route that answers a browser holding the key: completed values and
    the pending state pass through; no diagnostic text ever does.
    """
    if isinstance(handle, OffloadHandle):
        return await _read(client, handle.key, handle.result_type, redact=True)
    return await _read(client, handle, result_type, redact=True)


async def resolve(
    client: Client,
    handle: OffloadHandle[T],
    *,
    # Not anyio.fail_after: a timeout is an answer here ("still pending"), not an error.
    timeout: float | timedelta | None,  # noqa: ASYNC109
) -> OffloadResult[T]:
    """Wait for an offloaded call to settle and return its authoritative result.

    Subscribes to the key's channel first, then reads the snapshot (returning
    at once if the call already settled), then waits for the wake-up and reads
    the snapshot again: no completion can fall between the read and the wait.

    Args:
        client: Any client of the Redis the job was enqueued on.
        handle: From ``fn.offload(...)`` or ``fn.handle(key)``.
        timeout: Seconds to wait; ``None`` waits as long as it takes. On
            timeout the result is ``pending``: nothing is cancelled.

    Raises:
        OffloadNotFound: no snapshot under the key (never issued, or expired).
    """
    return await _resolve(client, handle, timeout)


async def _nothing(stage: str) -> None:
    return None


async def _resolve(
    client: Client,
    handle: OffloadHandle[T],
    timeout: float | timedelta | None,  # noqa: ASYNC109
    hook: Callable[[str], Awaitable[None]] = _nothing,
) -> OffloadResult[T]:
    """``resolve``, with a hook called after each step so tests can inject races."""
    keys, token = _parse_key(client, handle.key)
    adapter = _adapter(handle.result_type)
    snapshot, channel = keys.offload(token), keys.offload_channel(token)
    seconds = math.inf if timeout is None else to_ms(timeout, "timeout") / 1000
    deadline = time.monotonic() + seconds
    failures = 0
    last: OffloadResult[Any] = OffloadResult("pending")
    while True:
        pubsub = client.redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            # Wait for the server's confirmation: only then is the subscription
            # in place, so a settle published after it cannot be missed.
            while True:
                left = max(0.0, min(_WAIT_SLICE, deadline - time.monotonic()))
                msg = await pubsub.get_message(timeout=left)
                if msg is not None and msg["type"] in ("subscribe", b"subscribe"):
                    break
                if time.monotonic() >= deadline:
                    return last
            await hook("subscribed")
            raw = await client.redis.hgetall(snapshot)
            if not raw:
                raise OffloadNotFound(
                    f"no offload snapshot for job key in queue {keys.name!r}: the key was never "
                    "issued, or its result expired after the retention; offload the call again"
                )
            last = _decode(raw, adapter, redact=False)
            if last.status != "pending":
                return last
            await hook("read")
            failures = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return last
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(_WAIT_SLICE, left))
                if msg is None and time.monotonic() >= deadline:
                    return last
                # A wake-up (redacted: the snapshot is the authority), or a
                # quiet slice: read back either way.
                raw = await client.redis.hgetall(snapshot)
                if raw:
                    last = _decode(raw, adapter, redact=False)
                    if last.status != "pending":
                        return last
        except _TRANSIENT:
            # The subscription may have missed a wake-up while it was down:
            # subscribe again and read back again, as at the start.
            failures += 1
            if time.monotonic() >= deadline:
                return last
            await anyio.sleep(min(0.05 * 2**failures, 2.0, max(0.0, deadline - time.monotonic())))
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await pubsub.aclose()


# -- the decorator -------------------------------------------------------------------------------


def _check_type(tp: Any, what: str, owner: str) -> None:
    """Raise TypeError unless pydantic can validate ``tp`` and serialize it to JSON."""
    try:
        adapter = TypeAdapter(tp)
        adapter.json_schema(mode="validation")
        adapter.json_schema(mode="serialization")
    except Exception as exc:
        name = getattr(tp, "__qualname__", None) or repr(tp)
        raise TypeError(
            f"@offload {owner}: {what} has type {name}, which pydantic cannot serialize; "
            f"offloaded arguments and results travel as data, so use a pydantic model, a "
            f"dataclass or a plain type instead ({type(exc).__name__})"
        ) from exc


_RESERVED = frozenset(dir(Task))


class OffloadFunction(Generic[P, R]):
    """An async function made offloadable by ``@vr.offload``.

    Awaiting it still runs it here and now; ``.offload(client, ...)`` runs it
    on a worker instead and returns an ``OffloadHandle``.

    Attributes:
        kind: The KIND of its jobs.
        queue: The queue its jobs go to.
        task_type: The generated ``vr.Task`` class (its fields are the parameters).
        result_type: The return annotation results are validated into.
    """

    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, Awaitable[R]]

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]],
        *,
        queue: str,
        kind: str | None,
        retention: float | timedelta | None,
        priority: Priority | int | str | None,
        lease: float | timedelta | None,
        max_failures: int | None,
    ) -> None:
        owner = getattr(fn, "__qualname__", repr(fn))
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@offload {owner}: decorate an `async def` function")
        validate_name(queue)
        self.queue = queue
        self.kind = validate_kind(kind or f"{fn.__module__}.{fn.__qualname__}", owner)
        self.retention_ms = 0 if retention is None else to_ms(retention, "retention")
        if retention is not None and self.retention_ms < 1:
            raise ConfigurationError(f"@offload {owner}: retention must be positive, or None to keep")
        self._priority = None if priority is None else Priority.parse(priority)
        self._lease = lease
        self._max_failures = max_failures
        self._fn = fn
        self._signature = inspect.signature(fn)
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise TypeError(f"@offload {owner}: cannot resolve its type annotations: {exc}") from exc

        fields: dict[str, tuple[Any, Any]] = {}
        self._positional: list[str] = []
        for name, param in self._signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"@offload {owner}: *{name} cannot be offloaded; name every parameter")
            if name in _RESERVED or name.startswith("_"):
                raise TypeError(f"@offload {owner}: parameter {name!r} collides with vr.Task; rename it")
            if name not in hints:
                raise TypeError(f"@offload {owner}: parameter {name!r} has no type annotation")
            _check_type(hints[name], f"parameter {name!r}", owner)
            default = ... if param.default is param.empty else param.default
            fields[name] = (hints[name], default)
            if param.kind is param.POSITIONAL_ONLY:
                self._positional.append(name)
        if "return" not in hints:
            raise TypeError(f"@offload {owner}: add a return annotation (`-> None` if it returns nothing)")
        self.result_type: Any = hints["return"]
        _check_type(self.result_type, "the return value", owner)
        self._result_adapter: TypeAdapter[Any] = TypeAdapter(self.result_type)
        self._names = list(fields)
        self.task_type: type[Task[Any]] = _task_class(fn, self.kind, fields)
        self._handler: type[Any] | None = None
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<offload {self.kind} on queue {self.queue!r}>"

    @property
    def __venturi_handler__(self) -> type[Any]:
        """The Task+Handler class ``worker.register(fn)`` registers.

        Built on first use, so that a producer (which only offloads) never
        imports the handler side.
        """
        if self._handler is None:
            self._handler = _handler_class(self)
        return self._handler

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, exactly as if it were not decorated."""
        return await self._fn(*args, **kwargs)

    def task(self, *args: P.args, **kwargs: P.kwargs) -> Task[Any]:
        """The job payload for these arguments, validated (what ``offload`` enqueues)."""
        bound = self._signature.bind(*args, **kwargs)
        return self.task_type(**bound.arguments)

    async def offload(self, client: Client, /, *args: P.args, **kwargs: P.kwargs) -> OffloadHandle[R]:
        """Enqueue a call for a worker and return its handle at once.

        The arguments are validated against the parameter types first; nothing
        is written if they do not validate. The job and its ``pending``
        snapshot are written in one atomic step.
        """
        task = self.task(*args, **kwargs)
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        job_id = await client.queue(self.queue)._enqueue_offload(
            task,
            token=token,
            retention_ms=self.retention_ms,
            priority=self._priority,
            lease=self._lease,
            max_failures=self._max_failures,
        )
        return OffloadHandle(key=f"{self.queue}:{token}", job_id=job_id, result_type=self.result_type)

    def handle(self, key: str, job_id: str = "") -> OffloadHandle[R]:
        """A typed handle for a key kept elsewhere (a session, a database row)."""
        return OffloadHandle(key=key, job_id=job_id, result_type=self.result_type)

    async def _run(self, payload: Task[Any]) -> Any:
        """Worker side: call the function with the payload's fields, return the storable result."""
        values = {name: getattr(payload, name) for name in self._names}
        args = [values.pop(name) for name in self._positional]
        value = await self._fn(*args, **values)
        try:
            checked = self._result_adapter.validate_python(value)
        except ValidationError as exc:
            raise TaskError.permanent(
                f"{self.kind} returned a {type(value).__name__}, not its declared {self.result_type!r}: {exc}"
            ) from None
        return self._result_adapter.dump_python(checked, mode="json")


def _task_class(fn: Callable[..., Any], kind: str, fields: dict[str, tuple[Any, Any]]) -> type[Task[Any]]:
    namespace: dict[str, Any] = {
        "__module__": fn.__module__,
        "__qualname__": f"{fn.__qualname__}.Task",
        "__doc__": f"The payload of an offloaded call to {fn.__qualname__}.",
        "__annotations__": {name: tp for name, (tp, _) in fields.items()},
        "KIND": kind,
        "model_config": ConfigDict(protected_namespaces=()),
    }
    for name, (_, default) in fields.items():
        if default is not ...:
            namespace[name] = default
    meta: Any = type(Task)  # pydantic's model metaclass builds the class, fields and all
    cls: type[Task[Any]] = meta(f"{fn.__name__}_task", (Task,), namespace)
    return cls


def _handler_class(entry: OffloadFunction[Any, Any]) -> type[Any]:
    from .._worker.context import Context
    from .._worker.handler import Handler

    class OffloadHandler(entry.task_type, Handler[Any]):  # type: ignore[misc,name-defined]
        __venturi_offload__: ClassVar[OffloadFunction[Any, Any]] = entry

        async def handle(self, ctx: Context[Any], state: Any) -> Outcome:
            return Outcome.completed(result=await entry._run(self))

    OffloadHandler.__qualname__ = f"{entry.task_type.__qualname__[: -len('.Task')]}.Handler"
    OffloadHandler.__module__ = entry.task_type.__module__
    return OffloadHandler


@overload
def offload(fn: Callable[P, Awaitable[R]], /) -> OffloadFunction[P, R]: ...
@overload
def offload(
    *,
    queue: str = "default",
    kind: str | None = None,
    retention: float | timedelta | None = DEFAULT_RETENTION,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
) -> Callable[[Callable[P, Awaitable[R]]], OffloadFunction[P, R]]: ...
def offload(
    fn: Callable[P, Awaitable[R]] | None = None,
    /,
    *,
    queue: str = "default",
    kind: str | None = None,
    retention: float | timedelta | None = DEFAULT_RETENTION,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
) -> OffloadFunction[P, R] | Callable[[Callable[P, Awaitable[R]]], OffloadFunction[P, R]]:
    """Make an async function offloadable to a worker, keeping it callable in-process.

    Example::

        @vr.offload(queue="reports")
        async def build_monthly(tenant_id: int, month: int) -> Report: ...

        handle = await build_monthly.offload(client, tenant_id=1, month=5)
        res = await vr.resolve(client, handle, timeout=30.0)   # res.value is a Report
        worker.register(build_monthly)                         # on the worker side

    Every parameter and the return value must be pydantic-serializable; this
    is checked here, at decoration time (TypeError naming the culprit).

    Args:
        queue: The queue its jobs go to; run it with a worker consuming it.
        kind: The jobs' KIND; by default ``"<module>.<qualified name>"``.
            Give one when the function lives in a script run as ``__main__``,
            or to keep the KIND stable across a rename.
        retention: How long a settled result stays readable (seconds or a
            timedelta; ``None`` keeps it until deleted). A ``pending``
            snapshot lives as long as its job is not settled.
        priority: Claim priority of its jobs.
        lease: Lease of its jobs' runs, for calls known to run long.
        max_failures: Retry backstop for its jobs (default: the worker's).
    """

    def wrap(f: Callable[P, Awaitable[R]]) -> OffloadFunction[P, R]:
        return OffloadFunction(
            f,
            queue=queue,
            kind=kind,
            retention=retention,
            priority=priority,
            lease=lease,
            max_failures=max_failures,
        )

    return wrap if fn is None else wrap(fn)
