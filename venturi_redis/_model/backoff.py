"""The retry schedule: Fibonacci backoff with deterministic jitter.

The same arithmetic lives in ``lua/include/backoff.lua``; the retry script
computes the delay inside Redis so that a retry is one atomic step. Both sides
work in integer milliseconds and use only operations that are exact, or
correctly rounded in the same way, on IEEE doubles: Lua 5.1's only number type.
``tests/test_backoff.py`` checks the two agree on thousands of ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from .errors import ConfigurationError

# A Lehmer (MINSTD) hash of the job id: every intermediate value stays below
# 2**53, so Lua doubles and Python ints agree exactly.
_MODULUS = 2147483647
_MULTIPLIER = 48271

# The longest duration venturi accepts anywhere (a delay, a lease, a pause, a
# retention, a backoff): 100 years. Scripts add durations to the clock in Lua
# doubles and Redis turns numbers into 64-bit integers: 1e16 seconds wrapped to
# an eligible_at of -9.2e18 (run at once, ahead of everything) and a lease
# that had expired before it began. Under this bound ``now + duration`` stays
# an exact integer far below 2**53.
MAX_SECONDS = 100 * 365 * 86400


def _seconds(value: float | timedelta, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (bool, str, bytes)):  # True is not one second here
        raise ConfigurationError(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigurationError(
                f"{what} must be a number of seconds or a timedelta, got {value!r}"
            ) from None
    # One chained comparison: False for NaN as for a negative or a huge value.
    if not 0 <= seconds <= MAX_SECONDS:
        raise ConfigurationError(
            f"{what} must be a finite number of seconds from 0 to {MAX_SECONDS} (100 years), got {value!r}"
        )
    return seconds


def to_ms(value: float | timedelta, what: str = "delay") -> int:
    """Seconds (or a timedelta) to whole milliseconds.

    Raises:
        ConfigurationError: ``value`` is not a number of seconds or a
            timedelta (a bool is not), or is negative, NaN, infinite or over
            ``MAX_SECONDS`` (100 years).
    """
    return round(_seconds(value, what) * 1000)


def fib_multiplier(attempt: int) -> int:
    """``fib(attempt) - 1``: 0, 0, 1, 2, 4, 7, 12, … for attempts 1, 2, 3, …"""
    a, b = 1, 1
    for _ in range(attempt - 1):
        a, b = b, a + b
    return a - 1


def jitter_fraction(job_id: str, attempt: int) -> float:
    """A number in [0, 1) derived from the job id and attempt alone."""
    h = attempt % _MODULUS
    for byte in job_id.encode():
        h = (h * _MULTIPLIER + byte) % _MODULUS
    # Ids made in one millisecond differ only in their last characters; three
    # more rounds spread a difference in the last byte over the whole range.
    for _ in range(3):
        h = (h * _MULTIPLIER + attempt) % _MODULUS
    return h / _MODULUS


def delay_ms(job_id: str, attempt: int, base_ms: int, cap_ms: int, jitter: float) -> int:
    """The retry delay in milliseconds; mirrors ``backoff_delay_ms`` in Lua."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # Walk the sequence only until it passes the cap, so a huge attempt is cheap
    # and never overflows (Lua mirrors this loop exactly).
    if base_ms <= 0 or cap_ms <= 0:
        return 0
    a, b = 1, 1
    for _ in range(attempt - 1):
        a, b = b, a + b
        if base_ms * (a - 1) >= cap_ms:
            break
    d = min(base_ms * (a - 1), cap_ms)
    if d <= 0 or jitter <= 0:
        return d
    return d - math.floor(d * jitter * jitter_fraction(job_id, attempt))


def backoff_delay(job_id: str, attempt: int, *, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = after the first failure).

    ``d = min(base * (fib(attempt) - 1), cap)``; jitter then lands the delay in
    ``[d * (1 - jitter), d]``, at a point derived from the job's id and the
    attempt, so the schedule is reproducible and needs no random numbers.
    """
    if isinstance(jitter, bool) or not 0.0 <= jitter <= 1.0:
        raise ConfigurationError(f"jitter must be a number within [0, 1], got {jitter!r}")
    return delay_ms(job_id, attempt, to_ms(base, "base"), to_ms(cap, "cap"), jitter) / 1000


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry backoff policy; build one with :meth:`Backoff.fibonacci`."""

    base: float
    cap: float

    def __post_init__(self) -> None:
        # ``Backoff(base=..., cap=...)`` built directly is checked as ``fibonacci`` checks.
        _seconds(self.base, "backoff base")
        _seconds(self.cap, "backoff cap")

    @classmethod
    def fibonacci(cls, base: float | timedelta = 1.0, cap: float | timedelta = 600.0) -> Backoff:
        """``min(base * (fib(n) - 1), cap)`` seconds before retry ``n``."""
        b, c = _seconds(base, "base"), _seconds(cap, "cap")
        return cls(base=b, cap=c)

    @property
    def base_ms(self) -> int:
        return to_ms(self.base, "base")

    @property
    def cap_ms(self) -> int:
        return to_ms(self.cap, "cap")

    def delay(self, job_id: str, attempt: int, jitter: float = 0.0) -> float:
        """The delay in seconds before retry ``attempt`` of ``job_id``."""
        return backoff_delay(job_id, attempt, base=self.base, cap=self.cap, jitter=jitter)
