"""Flow control's value types (docs/flow-control.md).

``vr.Rate``, ``vr.Limit``, ``vr.LimitInfo``, ``vr.LimitKeyLoad``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from .backoff import to_ms
from .errors import ConfigurationError, TaskDefinitionError
from .task import validate_kind

# The largest count the API takes (a concurrency, a rate's count, an event
# stream's cap): far above any real cap, and exact where it is stored and
# read, as text through Lua (whose `..` writes a number with "%.14g": 2**53+1
# read back rounded) and as a Redis integer (10**20 and 2**64 overflow
# XADD MAXLEN; a cap Lua could not read meant no cap at all).
MAX_COUNT = 1_000_000_000


def whole_count(value: object) -> bool:
    """Whether ``value`` is a whole number from 1 to ``MAX_COUNT`` (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` runs start in any window of ``per`` seconds (or a ``timedelta``).

    ``vr.Rate(100, 1)``: 100 a second; ``vr.Rate(5, timedelta(minutes=1))``: 5 a minute.
    """

    count: int
    per: float | timedelta

    def __post_init__(self) -> None:
        if not whole_count(self.count):
            raise ConfigurationError(
                f"Rate count must be a whole number from 1 to {MAX_COUNT:,}, got {self.count!r}"
            )
        self.per_ms()  # checked here, where it is given

    def per_ms(self) -> int:
        """The window in whole milliseconds (at least 1)."""
        value = self.per
        ok = isinstance(value, timedelta) or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
        ms = to_ms(value, "Rate per") if ok else 0
        if ms < 1:
            raise ConfigurationError(f"Rate per must be a positive number of seconds, got {value!r}")
        return ms

    @property
    def seconds(self) -> float:
        return self.per_ms() / 1000

    def __str__(self) -> str:
        return f"{self.count}/{self.seconds:g}s"


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit declared in code, beside the handlers: ``vr.Worker(..., limits=[vr.Limit(...)])``.

    The worker sets it when it starts, on every queue it consumes (each
    partition of a sharded queue), as ``queue.set_limit(kind, concurrency=...,
    rate=..., per_key=...)`` would; a limit already stored as declared is left
    as it is. Checked here, where it is declared (``vr.ConfigurationError``).

    ``vr.Limit("send-mail", concurrency=20, rate=vr.Rate(100, 1))``: at most 20
    at once and 100 started a second; ``vr.Limit("send-mail", concurrency=5,
    per_key=True)``: at most 5 at once per ``limit_key()``.
    """

    kind: str
    concurrency: int | None = None
    rate: Rate | None = None
    per_key: bool = False

    def __post_init__(self) -> None:
        limit_args(self.kind, self.concurrency, self.rate, self.per_key, "vr.Limit")


@dataclass(frozen=True, slots=True)
class LimitKeyLoad:
    """The load of one limit key of a per-key limit, as ``queue.limits()`` reads it.

    Attributes:
        key: The ``limit_key()`` of the jobs, or None for the jobs without a
            key (which per-key caps do not count: they never hold a slot).
        running: Runs of the key holding a per-key slot now (0 when the
            per-key limit has no concurrency cap).
        waiting: Jobs of the key parked until a limit lets them run.
    """

    key: str | None
    running: int
    waiting: int


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """One limit of a queue, as ``queue.limits()`` reads it.

    Attributes:
        kind: The task kind it limits.
        per_key: ``True``: the caps apply to each ``limit_key()`` separately.
        concurrency: Most runs at once (of the kind, or of each key), or None.
        rate: Most run starts per window, or None.
        running: Runs holding a slot now: of the kind (kind-wide), or of all
            its keys together (per key). Runs claimed while the kind had no
            concurrency cap hold none.
        waiting: Jobs of the kind parked until a limit lets them run (the
            same figure on the kind's two rows).
        keys: On a per-key row, the busiest keys (most running plus waiting
            first, at most ``limits(keys=N)`` of them), each with its own
            running and waiting; () on a kind-wide row.
        keys_total: On a per-key row, how many keys of the kind have runs
            holding a slot or jobs waiting (``keys`` holds the busiest of
            them). None when there are too many to count cheaply (the
            bounded read stopped before the end; ``keys`` are then the
            busiest of those it read), or with ``limits(keys=0)``. 0 on a
            kind-wide row.
    """

    kind: str
    per_key: bool
    concurrency: int | None
    rate: Rate | None
    running: int
    waiting: int = 0
    keys: tuple[LimitKeyLoad, ...] = ()
    keys_total: int | None = 0


def limit_args(
    kind: object, concurrency: object, rate: object, per_key: object, call: str = "set_limit"
) -> tuple[str, int, int, int]:
    """The checked arguments of ``set_limit`` (``call``, in errors): kind, concurrency,
    rate count, rate ms (0 = none)."""
    checked_kind = checked_limit_kind(kind)
    if not isinstance(per_key, bool):
        raise ConfigurationError(f"per_key must be True or False, got {per_key!r}")
    if concurrency is not None and not whole_count(concurrency):
        raise ConfigurationError(
            f"concurrency must be a whole number from 1 to {MAX_COUNT:,}, or None; got {concurrency!r}"
        )
    if rate is not None and not isinstance(rate, Rate):
        raise ConfigurationError(f"rate must be a vr.Rate(count, per) or None, got {rate!r}")
    if concurrency is None and rate is None:
        raise ConfigurationError(f"{call} needs a concurrency or a rate (clear_limit removes a limit)")
    count, per = (rate.count, rate.per_ms()) if rate is not None else (0, 0)
    return checked_kind, concurrency if isinstance(concurrency, int) else 0, count, per


def checked_limit_kind(kind: object) -> str:
    try:
        return validate_kind(kind, "limit")
    except TaskDefinitionError as exc:
        raise ConfigurationError(f"kind {kind!r} is not a task kind: {exc}") from None


def parse_rate(text: str) -> Rate:
    """``N/PERIOD`` as the CLI takes it: ``100/s``, ``5/1m``, ``10/2.5s``, ``60/h``, ``3/500ms``."""
    count, sep, period = text.strip().partition("/")
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    try:
        if not sep:
            raise ValueError
        for unit in ("ms", "s", "m", "h", "d"):
            if period.endswith(unit):
                number = period[: -len(unit)] or "1"
                return Rate(int(count), float(number) * units[unit])
        return Rate(int(count), float(period))
    except ValueError:
        raise ConfigurationError(
            f"rate must be N/PERIOD (100/s, 5/1m, 3/500ms, 10/2.5), got {text!r}"
        ) from None
