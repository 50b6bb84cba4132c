"""A request to cut a claim loop's idle wait short (runner.py): a flag with one callback, no task."""

from __future__ import annotations

from collections.abc import Callable


class Interrupt:
    """A request to cut a runner's idle wait short (shutdown; an ``until_idle`` run's last job).

    Set once. An idle wait in progress registers a callback (``on_set``) that
    the set runs at once: a plain call where an ``asyncio.Event`` would need a
    task waiting on it, cancelled after every wait that was not interrupted.
    """

    __slots__ = ("_callback", "_set")

    def __init__(self) -> None:
        self._set = False
        self._callback: Callable[[], None] | None = None

    def set(self) -> None:
        if not self._set:
            self._set = True
            callback, self._callback = self._callback, None
            if callback is not None:
                callback()

    def is_set(self) -> bool:
        return self._set

    def on_set(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` when set (now, if it is); None forgets the one registered."""
        if callback is not None and self._set:
            callback()
        else:
            self._callback = callback
