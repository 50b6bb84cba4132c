"""The execution side of a task: worker code only.

A producer imports its Task classes and never this module's subclasses, so it
never imports what a handler needs (HTTP clients, database pools...).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from .._model.errors import TaskDefinitionError
from .._model.outcome import Outcome
from .context import Context

StateT = TypeVar("StateT", default=None)

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
    tell what it returned. A ``def`` that returns an awaitable (an ``async def``
    under a decorator that hides it) still works: the thread's result is awaited
    on the loop.
    """
    handle = getattr(cls, "handle", None)
    if inspect.isgeneratorfunction(handle) or inspect.isasyncgenfunction(handle):
        raise TaskDefinitionError(
            f"{cls.__qualname__}.handle is a generator: define it with `async def` or `def`, "
            "returning a vr.Outcome"
        )
    if handle is None or inspect.iscoroutinefunction(handle) or not callable(handle):
        SYNC_HANDLERS.discard(cls)
        return False
    SYNC_HANDLERS.add(cls)
    return True
