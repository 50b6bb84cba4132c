"""The checks on ``vr.Worker(...)``'s arguments, each where it is given.

A wrong value is refused by the constructor with a ``ConfigurationError`` that
names the argument and what it accepts, instead of being stored and crashing
``run()`` later (``reclaim_interval=-1``, ``poll_interval=float("nan")``). A
bool is never a number here: ``max_failures=True`` is a mistake, not 1.
"""

from __future__ import annotations

import math
from typing import Any

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError


def seconds(value: Any, what: str, *, zero: bool = False) -> float:
    """A finite number of seconds, above zero (or at least zero with ``zero``), as a float.

    Bounded like every other duration of the API (``to_ms``).
    """
    lowest = "0 or more" if zero else "more than 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a number of seconds ({lowest}), got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ConfigurationError(f"{what} must be a finite number of seconds ({lowest}), got {value!r}")
    try:
        to_ms(value, what)
    except ValueError as exc:  # ConfigurationError is one too
        raise ConfigurationError(str(exc)) from None
    return float(value)


def optional_seconds(value: Any, what: str) -> float | None:
    """``seconds`` or None (the default is then worked out by the caller)."""
    return None if value is None else seconds(value, what)


def count(value: Any, what: str) -> int:
    """A whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be >= 1 (a whole number), got {value!r}")
    return value


def optional_count(value: Any, what: str) -> int | None:
    """``count`` or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be >= 1 (a whole number) or None, got {value!r}")
    return value


def fraction(value: Any, what: str) -> float:
    """A number within [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"{what} must be a number within [0, 1], got {value!r}")
    return float(value)


def flag(value: Any, what: str) -> bool:
    """True or False, nothing that merely looks like one (``"false"`` is truthy)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, got {value!r}")
    return value


def worker_name(value: Any) -> str | None:
    """None (``host:pid:random``) or 1 to 200 printable characters, no spaces.

    The name is the lease owner shown by the CLI and part of the key the
    worker pushes onto to interrupt its own idle wait.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 200 or not value.isprintable() or " " in value:
        raise ConfigurationError(
            f"name must be 1 to 200 printable characters without spaces, or None, got {value!r}"
        )
    return value
