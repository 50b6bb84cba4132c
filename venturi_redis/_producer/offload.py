"""``@vr.offload``: run a function on a worker, read its typed result back.

This module is the decorator (``OffloadFunction`` for an ``async def``,
``SyncOffloadFunction`` for a plain ``def``): it checks the function's
types, builds its ``vr.Task`` class and enqueues calls with their ``pending``
snapshot. Reading results back is ``results.py`` (the result path is told
there, step by step); the worker half, the handler class that
``worker.register(fn)`` runs, is ``_worker/offload.py``. Nothing here imports
the worker, so a web process that offloads stays light.
"""

from __future__ import annotations

import functools
import inspect
import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    get_type_hints,
    overload,
)

from pydantic import ConfigDict, TypeAdapter, ValidationError

from .._model.backoff import to_ms
from .._model.enums import Priority
from .._model.errors import ConfigurationError, TaskDefinitionError, TaskError
from .._model.outcome import UNSET
from .._model.task import Task, validate_kind
from .._store.keys import validate_name
from .._store.prepare import prepare

if TYPE_CHECKING:
    from .client import Client
    from .results import OffloadHandle

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_RETENTION = timedelta(days=1)


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


def _check_function(fn: Callable[..., Any], owner: str) -> None:
    """Raise TypeError unless ``fn`` is a function a worker can call for one result."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@offload {owner}: a generator cannot be offloaded (a worker stores one result); "
            "define it with `def` or `async def`, returning its result"
        )
    if not (inspect.iscoroutinefunction(fn) or inspect.isfunction(fn) or inspect.ismethod(fn)):
        raise TypeError(
            f"@offload {owner}: decorate a function (`def` or `async def`), not a {type(fn).__name__}"
        )


class OffloadFunction(Generic[P, R]):
    """An async function made offloadable by ``@vr.offload``.

    Awaiting it still runs it here and now; ``.offload(client, ...)`` runs it
    on a worker instead and returns an ``OffloadHandle``. A plain ``def`` is
    a ``SyncOffloadFunction``, the same but for its direct call.

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
        fn: Callable[P, Any],
        *,
        queue: str,
        kind: str | None,
        retention: float | timedelta | None,
        priority: Priority | int | str | None,
        lease: float | timedelta | None,
        max_failures: int | None,
    ) -> None:
        owner = getattr(fn, "__qualname__", repr(fn))
        _check_function(fn, owner)
        if inspect.iscoroutinefunction(fn) is (sync := isinstance(self, SyncOffloadFunction)):
            which = "SyncOffloadFunction" if sync else "OffloadFunction"
            raise TypeError(f"@offload {owner}: not for a vr.{which}; decorate it with @vr.offload")
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
        # The worker's handler class, built by _worker/offload.py on first registration.
        self._handler: type[Any] | None = None
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<offload {self.kind} on queue {self.queue!r}>"

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, exactly as if it were not decorated."""
        return await self._fn(*args, **kwargs)  # type: ignore[no-any-return]

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
        from .results import TOKEN_BYTES, OffloadHandle  # the reading side: not at a worker's start

        task = self.task(*args, **kwargs)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        queue = client.queue(self.queue)
        job = prepare(
            task,
            client.max_payload_bytes,
            encryption=client.encryption,
            delay=0.0,
            priority=self._priority,
            lease=self._lease,
            max_failures=self._max_failures,
            carry=None,
        )
        if job.dedup:  # a merge would leave the snapshot describing no job
            raise TaskDefinitionError(f"{job.kind}: an offload task cannot have a dedup key")
        await client._recorded.ensure(client.redis, queue.name)  # the registry of queues (registry.py)
        # The job and its pending snapshot in one script call (one atomic step).
        await queue.store.enqueue_offloaded(job, token, self.retention_ms)
        return OffloadHandle(key=f"{self.queue}:{token}", job_id=job.id, result_type=self.result_type)

    def handle(self, key: str, job_id: str = "") -> OffloadHandle[R]:
        """A typed handle for a key kept elsewhere (a session, a database row)."""
        from .results import OffloadHandle

        return OffloadHandle(key=key, job_id=job_id, result_type=self.result_type)

    def _call(self, payload: Task[Any]) -> Any:
        """Worker side: call the function with the payload's fields."""
        values = {name: getattr(payload, name) for name in self._names}
        args = [values.pop(name) for name in self._positional]
        return self._fn(*args, **values)

    async def _run(self, payload: Task[Any]) -> Any:
        """Worker side: run the call, return the storable result."""
        return self._stored(await self._call(payload))

    def _stored(self, value: Any) -> Any:
        """The storable form of what the function returned; a wrong type is a permanent failure."""
        try:
            checked = self._result_adapter.validate_python(value)
        except ValidationError as exc:
            raise TaskError.permanent(
                f"{self.kind} returned a {type(value).__name__}, not its declared {self.result_type!r}: {exc}"
            ) from None
        return self._result_adapter.dump_python(checked, mode="json")


class SyncOffloadFunction(OffloadFunction[P, R]):
    """A plain ``def`` function made offloadable by ``@vr.offload``.

    Calling it still runs it here and now, synchronously; ``.offload(client,
    ...)`` is the same as an async one's. On a worker it runs in one of the
    handler threads, as a sync ``Handler.handle`` does (docs/design.md,
    "Synchronous handlers").
    """

    __wrapped__: Callable[P, R]  # type: ignore[assignment]

    # A sync call where the base's is awaited: the one difference between the two.
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:  # type: ignore[override]
        """Run the function here, exactly as if it were not decorated."""
        return self._fn(*args, **kwargs)  # type: ignore[no-any-return]


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


class _Decorate(Protocol):
    """What ``@vr.offload(...)`` with options returns: an ``async def`` or a ``def`` each typed."""

    # An `async def` matches both; the first wins (as with the function's overloads below).
    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> OffloadFunction[P, R]: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, fn: Callable[P, R], /) -> SyncOffloadFunction[P, R]: ...


@overload
def offload(fn: Callable[P, Awaitable[R]], /) -> OffloadFunction[P, R]: ...  # type: ignore[overload-overlap]
@overload
def offload(fn: Callable[P, R], /) -> SyncOffloadFunction[P, R]: ...
@overload
def offload(
    *,
    queue: str = "default",
    kind: str | None = None,
    retention: float | timedelta | None = DEFAULT_RETENTION,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
) -> _Decorate: ...
def offload(
    fn: Callable[P, Any] | None = None,
    /,
    *,
    queue: str = "default",
    kind: str | None = None,
    retention: float | timedelta | None = DEFAULT_RETENTION,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
) -> OffloadFunction[P, Any] | _Decorate:
    """Make a function offloadable to a worker, keeping it callable in-process.

    Example::

        @vr.offload(queue="reports")
        async def build_monthly(tenant_id: int, month: int) -> Report: ...

        handle = await build_monthly.offload(client, tenant_id=1, month=5)
        res = await vr.resolve(client, handle, timeout=30.0)   # res.value is a Report
        worker.register(build_monthly)                         # on the worker side

    A plain ``def`` works too (a ``SyncOffloadFunction``): calling it stays a
    plain call, and the worker runs it in a handler thread, as it runs a
    ``def handle``, so blocking code does not block the worker's event loop.

    Every parameter and the return value must be pydantic-serializable; this
    is checked here, at decoration time (TypeError naming the culprit), and
    so is the function itself (a generator, or a callable object, is refused).

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

    def wrap(f: Callable[P, Any]) -> OffloadFunction[P, Any]:
        # A ``def`` whose decorator hides an ``async def`` is a sync one here: its
        # coroutine is awaited on the worker's loop (_worker/offload.py).
        cls = OffloadFunction if inspect.iscoroutinefunction(f) else SyncOffloadFunction
        return cls(
            f,
            queue=queue,
            kind=kind,
            retention=retention,
            priority=priority,
            lease=lease,
            max_failures=max_failures,
        )

    return wrap(fn) if fn is not None else wrap  # type: ignore[return-value]
