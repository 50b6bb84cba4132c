"""The execution side of a task: worker code only.

A producer imports its Task classes and never this module's subclasses, so it
never imports what a handler needs (HTTP clients, database pools...).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from typing_extensions import TypeVar

from .._model.errors import TaskDefinitionError
from .._model.outcome import Outcome
from .._model.task import Task
from .context import Context

# Contravariant: a handler of ``Handler[App]`` runs on a ``Worker[SubApp]``
# (``Worker.register`` takes ``type[Handler[StateT]]``).
StateT = TypeVar("StateT", default=None, contravariant=True)

# The registered Handler classes whose ``handle`` is a plain ``def``: their runs
# go to a worker thread (threads.py). Filled by ``sync_handle`` when a class is
# registered; read once per run (a set lookup: the async path pays no more).
SYNC_HANDLERS: set[type] = set()


class Handler(Generic[StateT]):
    """Mix into a Task subclass to make it runnable by a ``Worker[StateT]``.

    Example::

        class CrawlJob(Crawl, vr.Handler[App]):
            async def handle(self, ctx: vr.Context[Progress], app: App) -> vr.Outcome:
                ...
                return vr.Outcome.completed()

    ``self`` is the validated payload; ``state`` is the worker's shared state.
    Return an Outcome; raise to fail (retryable), or raise
    ``TaskError.permanent(...)`` to send the job to dead.

    ``handle`` may also be a plain ``def``: it then runs in a worker thread,
    so blocking code (a synchronous HTTP client, an ORM, CPU work) does not
    block the worker's event loop. Prefer ``async def`` for I/O that has an
    async client: a thread cannot be stopped, only abandoned (docs/design.md,
    "Synchronous handlers").
    """

    if TYPE_CHECKING:
        # Declared as a callable so that a subclass may define ``handle`` with
        # ``async def`` or with ``def``; its parameters and return are still checked.
        handle: Callable[[Context[Any], StateT], Outcome | Awaitable[Outcome]]
    else:

        async def handle(self, ctx: Context[Any], state: StateT) -> Outcome:
            raise NotImplementedError(f"{type(self).__qualname__} must define handle(ctx, state)")


def sync_handle(cls: type[Any]) -> bool:
    """Whether ``cls.handle`` is a plain ``def`` (run in a worker thread); called at registration.

    A generator or async generator ``handle`` is refused: the worker could not
    tell what it returned; so is one that cannot be called as ``handle(ctx, state)``.
    A ``def`` that returns an awaitable (an ``async def``
    under a decorator that hides it) still works: the thread's result is awaited
    on the loop.
    """
    handle = getattr(cls, "handle", None)
    if inspect.isgeneratorfunction(handle) or inspect.isasyncgenfunction(handle):
        raise TaskDefinitionError(
            f"{cls.__qualname__}.handle is a generator: define it with `async def` or `def`, "
            "returning a vr.Outcome"
        )
    if inspect.isfunction(handle):
        # Refused here, not by every run's TypeError: a task body moved from
        # Celery or RQ keeps its old parameters (docs/migrating.md).
        sig = inspect.signature(handle)
        try:
            sig.bind(None, None, None)
        except TypeError:
            params = ", ".join(str(p.replace(annotation=p.empty)) for p in sig.parameters.values())
            raise TaskDefinitionError(
                f"{cls.__qualname__}.handle({params}) cannot be called as "
                "handle(ctx, state): define it as `def handle(self, ctx, state)` (or `async def`), "
                "its arguments being the task's fields (self.field), returning a vr.Outcome"
            ) from None
    if handle is None or inspect.iscoroutinefunction(handle) or not callable(handle):
        SYNC_HANDLERS.discard(cls)
        return False
    SYNC_HANDLERS.add(cls)
    return True


def not_a_handler(value: object) -> str:
    """What ``Worker.register`` says of ``value``, no Task+Handler class: for a task class
    (the producer's half, registered for its handler), which class to write."""
    said = f"register() expects a class deriving from both vr.Task and vr.Handler, got {value!r}"
    if isinstance(value, type) and issubclass(value, Task):
        name = value.__qualname__
        said += f": register its handler, class {name}Job({name}, vr.Handler[...]) with a handle()"
    return said


# BatchHandler's bounds: BATCH_SIZE in 1..MAX_BATCH_SIZE, BATCH_WAIT finite and >= 0.
MAX_BATCH_SIZE = 10_000
TaskT = TypeVar("TaskT")


class BatchItem(Generic[TaskT]):
    """One job of a batch: its validated task and its own run's context.

    ``ctx`` is the job's own ``vr.Context``: its id, run count, failures,
    journal, carry (saved with the job's own ending), attachment, progress
    and cancellation (an operator's cancel of this job flags this ``ctx``
    alone).
    """

    # A plain class with slots: made once per job of every batch (a frozen
    # dataclass's __init__ costs several times more).
    __slots__ = ("ctx", "task")

    def __init__(self, task: TaskT, ctx: Context[Any]) -> None:
        self.task = task
        self.ctx = ctx

    def __repr__(self) -> str:
        return f"BatchItem(job {self.ctx.job_id}, {type(self.task).__qualname__})"


class BatchHandler(Handler[StateT]):
    """Mix into a Task subclass to run its jobs many at a time, in one ``handle_batch`` call.

    Example::

        class SendMails(Mail, vr.BatchHandler[App]):
            BATCH_SIZE: ClassVar[int] = 100  # most jobs per call
            BATCH_WAIT: ClassVar[float] = 0.5  # wait this long for a fuller batch

            @classmethod
            async def handle_batch(
                cls, items: Sequence[vr.BatchItem[Mail]], app: App
            ) -> Sequence[vr.Outcome | BaseException] | None:
                await app.mailer.send_many([item.task for item in items])
                return None  # every job completed

    Each job keeps its own lease, fencing token, journal and retry backstop.
    Return ``None`` and every job of the batch completed; or return one
    entry per item, in order: a ``vr.Outcome`` (that job's outcome) or an
    exception (that job's failure, retried or dead as a single job's raise
    would be; ``vr.TaskError.permanent(...)`` kills it). A raised exception
    fails every job of the batch. A wrong number of entries fails every job
    of the batch, with a note that says so.

    ``handle_batch`` may be a plain ``def`` classmethod: it then runs in a
    worker thread, as a ``def handle`` does. A batch is one handler call: it
    takes one of the worker's ``concurrency`` slots, whatever its size
    (docs/semantics.md, "Batch handlers").
    """

    BATCH_SIZE: ClassVar[int] = 100
    BATCH_WAIT: ClassVar[float] = 0.0

    if TYPE_CHECKING:
        # A classmethod, `async def` or `def`; declared as a callable so either type-checks.
        handle_batch: Callable[
            [Sequence[BatchItem[Any]], StateT],
            Sequence[Outcome | BaseException] | Awaitable[Sequence[Outcome | BaseException] | None] | None,
        ]
    else:

        @classmethod
        async def handle_batch(cls, items, state):
            raise NotImplementedError(f"{cls.__qualname__} must define handle_batch(items, state)")

        async def handle(self, ctx, state):
            # The worker runs a batch kind's jobs through handle_batch (batch.py), never one by one.
            raise NotImplementedError(
                f"{type(self).__qualname__} is a batch handler: its jobs run in batches"
            )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        batch_settings(cls)


def batch_settings(cls: type[Any]) -> tuple[int, float]:
    """A batch handler class's ``(BATCH_SIZE, BATCH_WAIT)``, checked at class definition and registration.

    Raises:
        TaskDefinitionError: ``BATCH_SIZE`` is not an int in 1..10,000, or
            ``BATCH_WAIT`` is not a finite number of seconds >= 0.
    """
    size = getattr(cls, "BATCH_SIZE", 100)
    wait = getattr(cls, "BATCH_WAIT", 0.0)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
        raise TaskDefinitionError(
            f"{cls.__qualname__}.BATCH_SIZE must be an int from 1 to {MAX_BATCH_SIZE:,}, got {size!r}"
        )
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
        raise TaskDefinitionError(
            f"{cls.__qualname__}.BATCH_WAIT must be a finite number of seconds >= 0, got {wait!r}"
        )
    handle_batch = inspect.getattr_static(cls, "handle_batch", None)
    fn = getattr(handle_batch, "__func__", None)
    if not isinstance(handle_batch, classmethod) or fn is None:
        raise TaskDefinitionError(
            f"{cls.__qualname__}.handle_batch must be a classmethod: "
            "@classmethod async def handle_batch(cls, items, state)"
        )
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TaskDefinitionError(
            f"{cls.__qualname__}.handle_batch is a generator: define it with `async def` or `def`"
        )
    return size, float(wait)


def sync_batch(cls: type[Any]) -> bool:
    """Whether ``cls.handle_batch`` is a plain ``def`` (run in a worker thread)."""
    fn = getattr(inspect.getattr_static(cls, "handle_batch", None), "__func__", None)
    return not inspect.iscoroutinefunction(fn)
