"""How long, and how many, finished jobs stay: ``vr.Retention``, and the lag of its trimming.

A worker records the retention it trims by in its queue's meta hash
(``retention``, JSON: docs/redis-layout.md) when it starts, so that
``queue.stats()`` (``venturi stats``, the Prometheus gauges) can say how far
trimming is behind: the finished jobs past a count bound, and how long the
oldest has been past its period (``trim_lag``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError
from .._store.store import Retained

FinishedState = Literal["completed", "dead", "cancelled"]
FINISHED: tuple[FinishedState, ...] = ("completed", "dead", "cancelled")

_PURGE_BATCH = 100
# A retention batch is one script call, which holds Redis while it runs: a
# larger one would stall every client (and 10**20 was no count Redis takes).
_PURGE_BATCH_MAX = 10_000

DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Retention:
    """How long, and how many, finished jobs stay in Redis before the workers remove them.

    Each period is seconds or a ``timedelta``, each count a whole number;
    ``None`` sets no such bound. Whichever bound a finished job passes first
    removes it, oldest first. Completed jobs are trimmed by the very script
    call that completes others (up to twice as many as it completes: trimming
    keeps pace at any rate); dead and cancelled ones on the workers' reclaim
    tick, as many batches as it takes. A removed job loses its hash, its
    journal and any index entry (docs/operations.md, "Sizing").

    Args:
        completed: Completed jobs' period (default one day).
        dead: Dead jobs', kept longer so someone can look at them (default 7 days).
        cancelled: Cancelled jobs' (default one day).
        max_completed: Most completed jobs kept (default 10,000).
        max_dead: Most dead jobs kept (default 10,000: Sidekiq's dead set).
        max_cancelled: Most cancelled jobs kept (default 10,000).
        batch: Jobs removed per script call of the tick's sweep (each call stays short).

    Raises:
        ConfigurationError: A period that is not a duration, a count that is
            not a whole number >= 0 (a bool included), a batch < 1.
    """

    completed: float | timedelta | None = DAY
    dead: float | timedelta | None = 7 * DAY
    cancelled: float | timedelta | None = DAY
    batch: int = _PURGE_BATCH
    max_completed: int | None = 10_000
    max_dead: int | None = 10_000
    max_cancelled: int | None = 10_000

    def __post_init__(self) -> None:
        for name in ("completed", "dead", "cancelled"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                to_ms(value, f"retention of {name} jobs")
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{exc}; use None to keep {name} jobs forever") from None
        for name in ("max_completed", "max_dead", "max_cancelled"):
            count = getattr(self, name)
            if count is not None and (type(count) is not int or not 0 <= count < 2**53):
                raise ConfigurationError(
                    f"retention {name} must be a whole number of jobs >= 0, or None for no bound, "
                    f"got {count!r}"
                )
        batch = self.batch
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= _PURGE_BATCH_MAX:
            raise ConfigurationError(
                f"retention batch must be a whole number from 1 to {_PURGE_BATCH_MAX:,}, got {batch!r}"
            )

    def periods_ms(self) -> dict[FinishedState, int]:
        """The finished states that are trimmed by age, with their period in ms."""
        out: dict[FinishedState, int] = {}
        if self.completed is not None:
            out["completed"] = to_ms(self.completed, "retention")
        if self.dead is not None:
            out["dead"] = to_ms(self.dead, "retention")
        if self.cancelled is not None:
            out["cancelled"] = to_ms(self.cancelled, "retention")
        return out

    def bounds(self) -> dict[FinishedState, tuple[int | None, int | None]]:
        """Each finished state's (period in ms, most kept), None for no such bound."""
        periods = self.periods_ms()
        counts: dict[FinishedState, int | None] = {
            "completed": self.max_completed,
            "dead": self.max_dead,
            "cancelled": self.max_cancelled,
        }
        states: tuple[FinishedState, ...] = ("completed", "dead", "cancelled")
        return {state: (periods.get(state), counts[state]) for state in states}

    def retained(self) -> Retained:
        """The bounds as the finishing scripts take them ('' for none)."""
        b = self.bounds()

        def arg(value: int | None) -> str:
            return "" if value is None else str(value)

        return Retained(
            arg(b["completed"][0]),
            arg(b["completed"][1]),
            arg(b["dead"][0]),
            arg(b["dead"][1]),
            arg(b["cancelled"][0]),
            arg(b["cancelled"][1]),
        )

    def to_field(self) -> str:
        """The bounds as the meta hash's ``retention`` field: JSON, ``state: [ms, most]`` (null: none)."""
        return json.dumps({state: list(bound) for state, bound in self.bounds().items()}, sort_keys=True)


def retention_field(retention: Retention | None) -> str:
    """What a worker records: its bounds, or ``"none"`` for a worker that keeps every finished job."""
    return "none" if retention is None else retention.to_field()


Bounds = dict[FinishedState, tuple[int | None, int | None]]


def bounds_of_field(raw: Any) -> Bounds:
    """The bounds a ``retention`` field records; the defaults' when it is absent or unreadable."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text == "none":
        return {state: (None, None) for state in FINISHED}
    if text:
        try:
            doc = json.loads(text)
            out: Bounds = {}
            for state in FINISHED:
                period, most = doc[state]
                out[state] = (_whole(period), _whole(most))
            return out
        except (ValueError, KeyError, TypeError):
            pass  # written by hand, or by another version: the defaults say more than nothing
    return Retention().bounds()


def _whole(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError(value)
    return value


def trim_behind(
    bounds: Bounds, now: int, held: dict[FinishedState, int], oldest: dict[FinishedState, float | None]
) -> tuple[float, int]:
    """(seconds the oldest finished job is past its period, jobs past their state's count bound).

    Both are 0 when trimming keeps up: the finishing scripts and the workers'
    tick remove what is past either bound.
    """
    lag_ms = 0.0
    over = 0
    for state in FINISHED:
        period, most = bounds[state]
        first = oldest[state]
        if period is not None and first is not None:
            lag_ms = max(lag_ms, now - first - period)
        if most is not None:
            over += max(0, held[state] - most)
    return lag_ms / 1000, over


__all__ = [
    "DAY",
    "FINISHED",
    "FinishedState",
    "Retention",
    "bounds_of_field",
    "retention_field",
    "trim_behind",
]
