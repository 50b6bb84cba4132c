"""SIGTERM and SIGINT, for the whole of one ``Worker.run()``: its start, its serving and its close.

A worker that handles signals (``Worker(handle_signals=True)``, the default,
in the main thread: ``venturi worker``) takes them from the first line of
``run()`` to its last, and what one does follows where the run is:

- **starting** (waiting for Redis, the start's checks and declarations,
  entering ``Worker(lifespan=...)``): what is under way is cancelled and
  ``run()`` returns, nothing claimed. A lifespan whose entry is cancelled
  closes as its own code says (``try``/``finally`` around its ``yield``);
- **serving**: a graceful shutdown (``Worker.shutdown()``); a second signal
  skips the grace;
- **closing** (the lifespan's exit, the registration's removal, the
  queues' connections): the close goes on; the signal is logged, not obeyed.

Before, each part had a watcher of its own, or none: a SIGTERM while a
lifespan opened its database pool, or while it closed it, met the signal's
default action (exit 143, nothing said, the pool left half open), and a
SIGINT there a ``KeyboardInterrupt``.

One handler per signal is installed with the event loop's
``add_signal_handler`` (what ``anyio.open_signal_receiver`` does on asyncio,
without a task to read it: a task would need a task group around ``run()``,
and its errors would come out wrapped in an ``ExceptionGroup``), and removed
when ``run()`` ends.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import anyio

log = logging.getLogger("venturi_redis.worker")

Phase = Literal["waiting for Redis", "opening the handlers' state", "serving", "closing"]
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalWatch:
    """One run's signals: its start cancelled, ``shutdown()`` while it serves, nothing as it closes."""

    def __init__(self, worker_id: str, shutdown: Callable[[], None]) -> None:
        self._worker_id = worker_id
        self._shutdown = shutdown
        self.phase: Phase = "waiting for Redis"
        self._scope: anyio.CancelScope | None = None
        self.stopped_starting = False  # a signal came before the run served

    @contextmanager
    def installed(self, wanted: bool) -> Iterator[None]:
        """The handlers, for the ``with`` block, when ``wanted`` and in the main thread."""
        if not wanted or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        try:
            for signum in _SIGNALS:
                try:
                    loop.add_signal_handler(signum, self._received, signum)
                except (NotImplementedError, ValueError, RuntimeError):  # pragma: no cover - platform
                    continue
                installed.append(signum)
            yield
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    @contextmanager
    def starting(self, phase: Phase) -> Iterator[None]:
        """A part of the start, cancelled by a signal meanwhile (or at once, after one)."""
        self.phase = phase
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.stopped_starting:
                scope.cancel()
            try:
                yield
            finally:
                self._scope = None

    def _received(self, signum: signal.Signals) -> None:
        name = signal.Signals(signum).name
        if self.phase == "serving":
            log.warning("worker %s: %s received, shutting down", self._worker_id, name)
            self._shutdown()
        elif self.phase == "closing":
            log.warning(
                "worker %s: %s received while closing; the close goes on (the handlers' state, "
                "the worker's registration, its connections)",
                self._worker_id,
                name,
            )
        else:
            log.warning(
                "worker %s: %s received while %s; stopping (nothing claimed)",
                self._worker_id,
                name,
                self.phase,
            )
            self.stopped_starting = True
            self._shutdown()
            if self._scope is not None:
                self._scope.cancel()
