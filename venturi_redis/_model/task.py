"""The task model: one pydantic model is a job's payload and its identity.

``Task`` is everything a producer needs (KIND, priority, dedup key, merge,
backoff, the carry type). The execution side, ``Handler``, lives apart in
``_handler.py`` so that a web process that only enqueues never imports the
worker's dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal

from pydantic import BaseModel, ConfigDict, Secret, SecretBytes, SecretStr, TypeAdapter
from typing_extensions import TypeVar

from .backoff import Backoff, to_ms
from .enums import Priority
from .errors import ConfigurationError, TaskDefinitionError
from .redact import marked_fields

if TYPE_CHECKING:
    from datetime import timedelta

    from .records import JournalEntry

_KIND_MAX = 256
# Validators of declared RESUME types, built once per task class.
_RESUME_ADAPTERS: dict[type, TypeAdapter[Any]] = {}
_CARRY_TYPES: dict[type, type[BaseModel]] = {}


class NoCarry(BaseModel):
    """The carry of a task that keeps nothing between runs (plain ``vr.Task``)."""

    model_config = ConfigDict(frozen=True)


_NO_CARRY = NoCarry()

CarryT = TypeVar("CarryT", bound=BaseModel, default=NoCarry)
TaskT = TypeVar("TaskT", bound="Task[Any]", default="Task[Any]")
# ``Merge.with_``'s own: a class-scoped TypeVar with a default would be solved
# as that default when the method is called on the bare class (pyright reads
# ``vr.Merge.with_`` as ``Merge[Task[Any], NoCarry].with_``).
_WithTaskT = TypeVar("_WithTaskT", bound="Task[Any]")
_WithCarryT = TypeVar("_WithCarryT", bound=BaseModel)


def validate_kind(kind: object, owner: str) -> str:
    """KIND must be a non-empty string of printable characters, at most 256 long."""
    if not isinstance(kind, str) or not kind:
        raise TaskDefinitionError(
            f'{owner} has no KIND: declare `KIND: ClassVar[str] = "..."`, a name '
            "unique per task type and stable across releases"
        )
    if len(kind) > _KIND_MAX or not kind.isprintable():
        raise TaskDefinitionError(
            f"{owner}.KIND {kind[:40]!r} is not valid: use at most {_KIND_MAX} printable characters"
        )
    return kind


# KIND as validated, per class, with the value it was validated from.
_KINDS: dict[type, tuple[object, str]] = {}


def task_kind(cls: type[Task[Any]]) -> str:
    """``cls.kind()``, validated once per class (again only if ``KIND`` is reassigned)."""
    raw = getattr(cls, "KIND", None)
    cached = _KINDS.get(cls)
    if cached is not None and cached[0] is raw:
        return cached[1]
    kind = cls.kind()
    # A class whose schema was not complete when it was defined (a forward
    # reference) is checked here, at its first enqueue, before anything is sent.
    refuse_secrets(cls, cls.__qualname__)
    _KINDS[cls] = (raw, kind)
    return kind


_SECRET_TYPES = (SecretStr, SecretBytes, Secret)
# The serializers pydantic gives its secret types (the generic ``Secret[T]``
# shows no class in its schema, only these).
_SECRET_SERIALIZERS = ("_serialize_secret", "_serialize_secret_field")


def _secret_path(schema: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The field path to the first secret type in a pydantic core schema, or None."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if isinstance(value, type):
                if issubclass(value, _SECRET_TYPES):
                    return path
            elif callable(value):
                if getattr(value, "__module__", "") == "pydantic.types" and (
                    getattr(value, "__name__", "") in _SECRET_SERIALIZERS
                ):
                    return path
            elif key == "fields" and isinstance(value, dict):
                for name, field_schema in value.items():
                    found = _secret_path(field_schema, (*path, str(name)))
                    if found is not None:
                        return found
            else:
                found = _secret_path(value, path)
                if found is not None:
                    return found
    elif isinstance(schema, list):
        for item in schema:
            found = _secret_path(item, path)
            if found is not None:
                return found
    return None


def refuse_secrets(model: type[BaseModel], owner: str) -> None:
    """Refuse a payload or carry model with a pydantic secret field (``SecretStr``, ...).

    Payloads are stored as msgpack of pydantic's JSON dump, where a secret is
    the mask ``"**********"``: the handler would get the mask and the value
    would be gone. Refusing at definition loses nothing silently.
    """
    if not getattr(model, "__pydantic_complete__", False):
        return  # forward references unresolved: task_kind checks at the first enqueue
    path = _secret_path(model.__pydantic_core_schema__, ())
    if path is not None:
        where = ".".join(path) or "a field"
        raise TaskDefinitionError(
            f"{owner}: field {where!r} is a pydantic secret type (SecretStr, SecretBytes, Secret[...]); "
            "venturi stores payloads and carries in Redis through pydantic's JSON dump, which masks "
            "secrets as '**********', so the handler would get the mask. Keep secrets out of the "
            "queue (enqueue a reference the handler looks up), or declare the field as str/bytes "
            "if storing it in Redis in plain text is acceptable"
        )


class Task(BaseModel, Generic[CarryT]):
    """Base class of every task: subclass it, declare ``KIND`` and the payload fields.

    ``vr.Task[Progress]`` declares a carry: typed state saved between runs of the
    same job (``Progress`` must be a pydantic model whose fields all have
    defaults). Plain ``vr.Task`` keeps nothing.

    Example::

        class Crawl(vr.Task[Progress]):
            KIND: ClassVar[str] = "crawl"
            site: str
            def priority(self) -> vr.Priority:
                return vr.Priority.HIGH
    """

    KIND: ClassVar[str]
    # Optional: the type ``queue.resume(job_id, value)`` values are validated
    # into before the next run sees them as ``ctx.resume_input``.
    RESUME: ClassVar[Any]
    # (dedup_window ms, debounce ms) as checked at class definition, or None
    # when the class uses neither: enqueue reads this one attribute, so a task
    # without them pays nothing more (docs/dedup.md, "Throttle and debounce").
    _vr_dedup_timing: ClassVar[tuple[int, int] | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        refuse_secrets(cls, cls.__qualname__)
        cls._vr_dedup_timing = dedup_timing(cls)
        for klass in cls.__mro__:  # the carry of ``Task[Carry]``, stored the same way
            meta = getattr(klass, "__pydantic_generic_metadata__", None)
            if meta and meta["origin"] is Task and meta["args"]:
                carry = meta["args"][0]
                if isinstance(carry, type) and issubclass(carry, BaseModel):
                    refuse_secrets(carry, f"{cls.__name__} carry {carry.__name__}")
                break

    def priority(self) -> Priority:
        """Claim priority of this job; ``enqueue(priority=...)`` overrides it."""
        return Priority.NORMAL

    def dedup_key(self) -> str | None:
        """Candidacy key for deduplication; ``None`` (the default) never coalesces."""
        return None

    @classmethod
    def dedup_window(cls) -> float | timedelta | None:
        """Throttle: how long a dedup key stays held after its job completes.

        ``None`` (the default): the key is free once the job is claimed. With a
        window, the key stays held while the job runs and for this long after
        it completes (measured on Redis's clock): an ``enqueue`` with the same
        key meanwhile returns that job's id and runs nothing, so a key runs at
        most once per window (docs/dedup.md). Needs a ``dedup_key``; read once,
        when the class is defined.
        """
        return None

    @classmethod
    def debounce(cls) -> float | timedelta | None:
        """Debounce: each enqueue of this key pushes the pending job's start back.

        ``None`` (the default): no change. With a debounce, a new job is
        eligible no sooner than this long after its enqueue, and a merge into
        the pending job with the same dedup key (whatever ``merge`` decides)
        moves its eligibility to now + debounce: a burst runs once, after it is
        quiet (docs/dedup.md). Needs a ``dedup_key``; read once, when the class
        is defined.
        """
        return None

    def merge(self, existing: Pending[Any, Any]) -> Merge[Any, Any]:
        """Decide what a collision with a pending job of the same dedup key does.

        The default replaces the pending payload and resets its carry.
        """
        return Merge.replace()

    def backoff(self) -> Backoff | None:
        """Per-task retry backoff; ``None`` (the default) uses the worker's."""
        return None

    def on_dependency_failure(self) -> Literal["fail", "ignore"]:
        """What this job does when a job it waits on goes dead or is cancelled (workflows).

        ``"fail"`` (the default): it goes dead too (reason ``dependency_failed``,
        its note naming the failed job), and so on down the tree. ``"ignore"``:
        it still runs once the others have finished, and the failed one is
        missing from ``ctx.dependency_results()``. Read at enqueue.
        """
        return "fail"

    def limit_key(self) -> str | None:
        """The key a per-key limit of this kind counts this job under (docs/flow-control.md).

        ``None`` (the default): a per-key limit does not apply to this job
        (a kind-wide one still does). At most 1 KiB of UTF-8; read at enqueue.
        """
        return None

    def order_key(self) -> str | None:
        """The key whose jobs run one at a time, in enqueue order (docs/semantics.md, "Ordered keys").

        ``None`` (the default): no order. Jobs of one queue with the same order
        key run one at a time, in the order they were enqueued, across every
        worker and process; a job that failed and will retry holds its key, a
        job that goes dead or is cancelled releases it. 1 to 1024 bytes of
        UTF-8; read at enqueue. Not with ``after=`` or a dedup key
        (``ConfigurationError``).
        """
        return None

    def timeout(self) -> float | None:
        """Seconds one run of this job may take before it is cancelled, a failed run.

        ``None`` (the default): the worker's ``timeout``; ``enqueue(timeout=...)``
        overrides both. Read at enqueue and stored with the job.
        """
        return None

    def expires(self) -> float | timedelta | None:
        """Seconds (or a timedelta) from enqueue within which this job must start, or never run.

        ``None`` (the default): no deadline. A job not *started* before its
        deadline (its first run or a retry) goes dead, reason
        ``vr.DeadReason.EXPIRED``; ``enqueue(expires=...)`` overrides it.
        Read at enqueue; the deadline is on Redis's clock (docs/semantics.md).
        """
        return None

    @classmethod
    def sensitive_fields(cls) -> frozenset[str]:
        """Payload fields whose values are never shown: masked in the notes the worker
        stores and logs, and by any reader that knows the task (docs/operations.md).

        The default: the fields declared ``Field(json_schema_extra={"sensitive": True})``.
        Override to name others.
        """
        return marked_fields(cls)

    @classmethod
    def kind(cls) -> str:
        """The validated ``KIND`` of this class."""
        return validate_kind(getattr(cls, "KIND", None), cls.__qualname__)

    @classmethod
    def resume_adapter(cls) -> TypeAdapter[Any] | None:
        """The validator of ``RESUME`` (``None`` when the task declares no resume type).

        A task that suspends declares what it expects back::

            class Approve(vr.Task):
                KIND: ClassVar[str] = "approve"
                RESUME: ClassVar[type[Decision]] = Decision

        The next run then sees ``ctx.resume_input`` as a ``Decision`` (validated
        by pydantic), and a value that does not validate sends the job to dead.
        Without ``RESUME`` the run sees the decoded msgpack (dicts, lists, ...).
        """
        if not hasattr(cls, "RESUME"):  # declared on Task, assigned only by subclasses
            return None
        cached = _RESUME_ADAPTERS.get(cls)
        if cached is None:
            tp = cls.RESUME
            try:
                cached = TypeAdapter(tp)
            except Exception as exc:
                raise TaskDefinitionError(
                    f"{cls.__qualname__}.RESUME = {tp!r} is not a type pydantic can validate: {exc}"
                ) from exc
            _RESUME_ADAPTERS[cls] = cached
        return cached

    @classmethod
    def carry_type(cls) -> type[BaseModel]:
        """The carry model declared by ``Task[Carry]`` (``NoCarry`` if none)."""
        cached = _CARRY_TYPES.get(cls)
        if cached is not None:
            return cached
        found: type[BaseModel] = NoCarry
        for klass in cls.__mro__:
            meta = getattr(klass, "__pydantic_generic_metadata__", None)
            if meta and meta["origin"] is Task and meta["args"]:
                carry = meta["args"][0]
                if not (isinstance(carry, type) and issubclass(carry, BaseModel)):
                    raise TaskDefinitionError(
                        f"{cls.__qualname__}: the carry {carry!r} must be a pydantic model"
                    )
                found = carry
                break
        _CARRY_TYPES[cls] = found  # a worker asks once per job: walk the MRO once per class
        return found

    @classmethod
    def default_carry(cls) -> BaseModel:
        """A fresh carry with every field at its default."""
        carry_cls = cls.carry_type()
        if carry_cls is NoCarry:
            return _NO_CARRY  # frozen and field-less: one instance serves every run
        try:
            return carry_cls()
        except Exception as exc:
            raise TaskDefinitionError(
                f"{cls.__qualname__}: carry {carry_cls.__name__} needs a default for every field"
            ) from exc


def _timing_ms(cls: type[Task[Any]], name: str, value: object) -> int:
    """A window or debounce in whole ms (0 for None), or ConfigurationError."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise ConfigurationError(
            f"{cls.__qualname__}.{name}() must return seconds (a number), a timedelta or None, got {value!r}"
        )
    return to_ms(value, f"{cls.__qualname__}.{name}()")


def dedup_timing(cls: type[Task[Any]]) -> tuple[int, int] | None:
    """``(dedup_window ms, debounce ms)`` of a task class, checked; None when both are off."""
    window = _timing_ms(cls, "dedup_window", cls.dedup_window())
    debounce = _timing_ms(cls, "debounce", cls.debounce())
    return (window, debounce) if window or debounce else None


@dataclass(frozen=True, slots=True)
class Pending(Generic[TaskT, CarryT]):
    """The pending job a new task collided with, as ``Task.merge`` sees it."""

    job_id: str
    payload: TaskT
    carry: CarryT
    run_count: int
    failures: int
    journal: Sequence[JournalEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Merge(Generic[TaskT, CarryT]):
    """A merge decision; build one with the class methods."""

    decision: Literal["keep", "replace", "with", "independent"]
    task: TaskT | None = None
    carry: CarryT | None = None

    @classmethod
    def keep(cls) -> Merge[Any, Any]:
        """The incoming task is redundant: the pending job stays untouched."""
        return cls("keep")

    @classmethod
    def replace(cls) -> Merge[Any, Any]:
        """The pending job takes the incoming payload; its carry resets to the default."""
        return cls("replace")

    @classmethod
    def with_(
        cls: type[Merge[Any, Any]], task: _WithTaskT, carry: _WithCarryT
    ) -> Merge[_WithTaskT, _WithCarryT]:
        """The pending job takes ``task`` and ``carry``, continuing its work."""
        return cls("with", task, carry)

    @classmethod
    def independent(cls) -> Merge[Any, Any]:
        """Not a duplicate after all: enqueue the incoming task as a new job."""
        return cls("independent")
