"""The worker's garbage-collector settings while it runs (``Worker(freeze_gc=..., gc_threshold=...)``).

docs/design.md, "The worker runtime", has the measurements behind them.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

# The objects CPython itself keeps in the permanent generation from start-up,
# read when this module is imported: 3.12 has some there before any code runs
# (375 tuples on 3.12.1: gc.get_freeze_count() in a bare `python -I -S`),
# 3.11 and 3.13 none. Only more than that means the process froze objects
# itself (a worker then leaves its collector alone).
INTERPRETER_FROZEN = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) else 0


@contextlib.contextmanager
def young_threshold_raised(threshold: int | None) -> Iterator[None]:
    """The collector's young-generation threshold at least ``threshold``, for the duration.

    See ``Worker(gc_threshold=...)``. Never lowered; put back at the end
    unless someone changed it meanwhile.
    """
    before = gc.get_threshold()
    if threshold is None or not gc.isenabled() or before[0] >= threshold:
        yield
        return
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == threshold:
            gc.set_threshold(*before)


class FrozenStart:
    """``gc.freeze()`` what exists when the worker starts, for as long as it runs.

    See ``Worker(freeze_gc=...)``. At the start only the young generations
    are collected before the freeze (well under a millisecond); the full
    collection, which walks every object the process holds (10-15 ms in the
    benchmark's worker), waits for ``idle()``: the first moment the worker
    has nothing to run. It unfreezes, collects and freezes again then, so
    old garbage from before the start is reclaimed, not kept until the stop,
    without delaying the first jobs of a worker that starts on a backlog.
    """

    __slots__ = ("_frozen", "_full_collection_due")

    def __init__(self, enabled: bool) -> None:
        # Off, or the process runs its collector its own way (it froze objects).
        self._frozen = enabled and gc.isenabled() and gc.get_freeze_count() <= INTERPRETER_FROZEN
        self._full_collection_due = self._frozen

    def __enter__(self) -> FrozenStart:
        if self._frozen:
            gc.collect(1)  # young garbage is collected, not frozen
            gc.freeze()
        return self

    @property
    def pending(self) -> bool:
        """Whether ``idle`` still has its full collection to run."""
        return self._full_collection_due

    def idle(self) -> None:
        """The worker has nothing to run: the full collection the start skipped, once."""
        if self._full_collection_due:
            self._full_collection_due = False
            gc.unfreeze()
            gc.collect()
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self._frozen:
            gc.unfreeze()
