"""The worker half of ``@vr.offload``: the Task+Handler class ``worker.register(fn)`` runs.

It lives on the worker side (it derives from ``Handler`` and gets a
``Context``), so that the decorator in ``_producer/offload.py`` never imports
the worker and a web process that only offloads stays light.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._model.outcome import Outcome
from .._producer.offload import OffloadFunction
from .context import Context
from .handler import Handler


def offload_handler(entry: OffloadFunction[Any, Any]) -> type[Any]:
    """The Task+Handler class that runs ``entry``'s jobs, built once per function."""
    if entry._handler is None:
        entry._handler = _handler_class(entry)
    return entry._handler


def _handler_class(entry: OffloadFunction[Any, Any]) -> type[Any]:
    class OffloadHandler(entry.task_type, Handler[Any]):  # type: ignore[misc,name-defined]
        __venturi_offload__: ClassVar[OffloadFunction[Any, Any]] = entry

        async def handle(self, ctx: Context[Any], state: Any) -> Outcome:
            return Outcome.completed(result=await entry._run(self))

    OffloadHandler.__qualname__ = f"{entry.task_type.__qualname__[: -len('.Task')]}.Handler"
    OffloadHandler.__module__ = entry.task_type.__module__
    return OffloadHandler
