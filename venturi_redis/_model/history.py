"""The metrics history's values and arithmetic, no I/O: ``HistoryPoint``, and the
plan of a read (which periods, which buckets) that ``queue.history`` makes.

The scripts count, per queue, KIND and minute (and the same per hour), the
jobs enqueued, completed, failed runs, dead, and the completed runs' time
(``lua/include/history.lua``; docs/observability.md "Metrics history"). A
minute is kept 48 hours, an hour 30 days: a read over at most 48 hours may
step by any whole number of minutes, a longer one by whole hours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .errors import ConfigurationError

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
# How far back each period is kept (the keys' expiry, history.lua).
MINUTES_KEPT = timedelta(hours=48)
HOURS_KEPT = timedelta(days=30)
# A period's counters, in a hash field after the kind and a tab.
COUNTERS = ("enqueued", "completed", "failed", "dead", "run_ms")


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One step of a queue's metrics history (``queue.history``).

    Attributes:
        at: The step's start (UTC).
        enqueued: Jobs created in the step.
        completed: Runs that completed.
        failed: Runs that failed (retried or not: a run that ends dead by a
            permanent error, or at the retry backstop, is a failed run too).
        dead: Jobs that went dead.
        run_ms_mean: The completed runs' mean time in ms, from each run's claim
            to its completion (None: nothing completed).
    """

    at: datetime
    enqueued: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0
    run_ms_mean: float | None = None

    @property
    def run_ms_total(self) -> float:
        """The completed runs' time summed (ms): what sums across points and partitions."""
        return (self.run_ms_mean or 0.0) * self.completed


@dataclass(frozen=True, slots=True)
class HistoryPlan:
    """What a read covers: ``count`` steps of ``step_ms`` from ``first_ms``, read from
    periods of ``unit_ms`` (a minute or an hour), ``per_step`` of them a step."""

    first_ms: int
    step_ms: int
    count: int
    unit_ms: int

    @property
    def per_step(self) -> int:
        return self.step_ms // self.unit_ms

    def periods(self) -> list[int]:
        """The start (epoch seconds) of every period read, oldest first."""
        return [(self.first_ms + i * self.unit_ms) // 1000 for i in range(self.count * self.per_step)]

    def at(self, i: int) -> datetime:
        return datetime.fromtimestamp((self.first_ms + i * self.step_ms) / 1000, UTC)


def _span_ms(value: object, what: str) -> int:
    if not isinstance(value, timedelta):
        raise ConfigurationError(f"history {what} must be a datetime.timedelta, got {value!r}")
    return int(value.total_seconds() * 1000)


def plan(now_ms: int, since: timedelta, step: timedelta | None) -> HistoryPlan:
    """The read ``queue.history(since=, step=)`` makes at ``now_ms``, or ConfigurationError.

    ``step`` None: a minute for ``since`` up to 48 hours, else an hour. Steps are
    aligned on the epoch (a 5-minute step starts at :00, :05...); the last one is
    the step now is in (still filling).
    """
    since_ms = _span_ms(since, "since")
    if since_ms <= 0 or since > HOURS_KEPT:
        raise ConfigurationError(
            f"history since must be positive and at most {HOURS_KEPT.days} days (what is kept), got {since}"
        )
    long = since > MINUTES_KEPT
    if step is None:
        step_ms = HOUR_MS if long else MINUTE_MS
    else:
        step_ms = _span_ms(step, "step")
        grain = HOUR_MS if long else MINUTE_MS
        if step_ms <= 0 or step_ms % grain or step > HOURS_KEPT:
            unit = "an hour (since is over 48 hours: minutes are kept 48 hours)" if long else "a minute"
            raise ConfigurationError(f"history step must be a whole multiple of {unit}, got {step}")
    unit_ms = HOUR_MS if step_ms % HOUR_MS == 0 else MINUTE_MS
    count = max(1, -(-since_ms // step_ms))
    last = now_ms - now_ms % step_ms
    return HistoryPlan(first_ms=last - (count - 1) * step_ms, step_ms=step_ms, count=count, unit_ms=unit_ms)


def fold(plan_: HistoryPlan, periods: Sequence[dict[str, int]]) -> list[HistoryPoint]:
    """Sum each step's periods (counter -> amount, as ``plan.periods()`` orders them) into points."""
    out: list[HistoryPoint] = []
    per = plan_.per_step
    for i in range(plan_.count):
        total = dict.fromkeys(COUNTERS, 0)
        for one in periods[i * per : (i + 1) * per]:
            for name, n in one.items():
                total[name] += n
        done = total["completed"]
        out.append(
            HistoryPoint(
                at=plan_.at(i),
                enqueued=total["enqueued"],
                completed=done,
                failed=total["failed"],
                dead=total["dead"],
                run_ms_mean=total["run_ms"] / done if done else None,
            )
        )
    return out


def merge(parts: Sequence[Sequence[HistoryPoint]]) -> list[HistoryPoint]:
    """Sum the same steps of several queues (a sharded queue's partitions): the means
    weighted by each one's completions."""
    if not parts:
        return []
    out: list[HistoryPoint] = []
    for same in zip(*parts, strict=True):
        done = sum(p.completed for p in same)
        out.append(
            HistoryPoint(
                at=same[0].at,
                enqueued=sum(p.enqueued for p in same),
                completed=done,
                failed=sum(p.failed for p in same),
                dead=sum(p.dead for p in same),
                run_ms_mean=sum(p.run_ms_total for p in same) / done if done else None,
            )
        )
    return out
