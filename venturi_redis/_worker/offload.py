"""The worker half of ``@vr.offload``: the Task+Handler class ``worker.register(fn)`` runs.

It lives on the worker side (it derives from ``Handler`` and gets a
``Context``), so that the decorator in ``_producer/offload.py`` never imports
the worker and a web process that only offloads stays light.

A plain ``def`` function gets a class whose ``handle`` is a plain ``def``
too: registration then finds it sync (``handler.sync_handle``), and its runs
take the handler threads, with a sync handler's bounds, timeout, abandonment
and log context (threads.py). Nothing here runs a thread of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, ClassVar

from .._model.outcome import Outcome
from .._producer.offload import OffloadFunction, SyncOffloadFunction
from .context import Context
from .handler import Handler


def offload_handler(entry: OffloadFunction[Any, Any]) -> type[Any]:
    """The Task+Handler class that runs ``entry``'s jobs, built once per function."""
    if entry._handler is None:
        entry._handler = _handler_class(entry)
    return entry._handler


def _handler_class(entry: OffloadFunction[Any, Any]) -> type[Any]:
    cls: type[Any]
    if isinstance(entry, SyncOffloadFunction):

        class SyncOffloadHandler(entry.task_type, Handler[Any]):  # type: ignore[misc,name-defined]
            __venturi_offload__: ClassVar[OffloadFunction[Any, Any]] = entry

            def handle(self, ctx: Context[Any], state: Any) -> Outcome | Awaitable[Outcome]:
                value = entry._call(self)
                if inspect.isawaitable(value):  # an async def under a decorator that hides it
                    return _completed(entry, value)  # awaited on the loop (threads._in_thread)
                return Outcome.completed(result=entry._stored(value))

        cls = SyncOffloadHandler
    else:

        class OffloadHandler(entry.task_type, Handler[Any]):  # type: ignore[misc,name-defined]
            __venturi_offload__: ClassVar[OffloadFunction[Any, Any]] = entry

            async def handle(self, ctx: Context[Any], state: Any) -> Outcome:
                return Outcome.completed(result=await entry._run(self))

        cls = OffloadHandler
    cls.__qualname__ = f"{entry.task_type.__qualname__[: -len('.Task')]}.Handler"
    cls.__module__ = entry.task_type.__module__
    return cls


async def _completed(entry: OffloadFunction[Any, Any], value: Awaitable[Any]) -> Outcome:
    return Outcome.completed(result=entry._stored(await value))
