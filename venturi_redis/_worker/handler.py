"""The execution side of a task: worker code only.

A producer imports its Task classes and never this module's subclasses, so it
never imports what a handler needs (HTTP clients, database pools...).
"""

from __future__ import annotations

from typing import Any, Generic

from typing_extensions import TypeVar

from .._model.outcome import Outcome
from .context import Context

StateT = TypeVar("StateT", default=None)


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
    """

    async def handle(self, ctx: Context[Any], state: StateT) -> Outcome:
        raise NotImplementedError(f"{type(self).__qualname__} must define async handle(ctx, state)")
