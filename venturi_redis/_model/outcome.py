"""What a handler run decided: complete, pause, or suspend.

A failure is not an Outcome: raise. Any exception is a retryable failure whose
message is the note; ``raise TaskError.permanent(...)`` sends the job to dead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from .backoff import MAX_SECONDS, to_ms
from .errors import ConfigurationError


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()

_KINDS = frozenset({"completed", "pause", "suspend"})
_MAX_DELAY_MS = MAX_SECONDS * 1000


@dataclass(frozen=True, slots=True)
class Outcome:
    """The conclusion of one run. Build it with the class methods."""

    kind: Literal["completed", "pause", "suspend"]
    note: str | None = None
    delay_ms: int = 0
    result: Any = UNSET
    output: Any = UNSET

    def __post_init__(self) -> None:
        # Built directly (``vr.Outcome("bogus")``) as well as by the class
        # methods: a kind the worker does not know would suspend the job, and
        # a delay that is not a whole number of milliseconds would reach the
        # scripts (NaN left a job in no set).
        if self.kind not in _KINDS:
            raise ConfigurationError(
                f"Outcome kind {self.kind!r} is not one of {sorted(_KINDS)}: build outcomes with "
                "Outcome.completed(), Outcome.pause_in(...) or Outcome.suspend(...)"
            )
        delay = self.delay_ms
        if type(delay) is not int or not 0 <= delay <= _MAX_DELAY_MS:
            raise ConfigurationError(
                f"Outcome delay_ms must be an int from 0 to {_MAX_DELAY_MS} (100 years), got {delay!r}"
            )
        if self.note is not None and not isinstance(self.note, str):
            raise ConfigurationError(f"Outcome note must be a str or None, got {type(self.note).__name__}")

    @classmethod
    def completed(cls, *, result: Any = UNSET) -> Outcome:
        """The job is done; ``result`` (any pydantic-serializable value) is stored with it."""
        if result is UNSET and cls is Outcome:
            return _COMPLETED  # immutable, so one is enough: the most common outcome costs nothing
        return cls("completed", result=result)

    @classmethod
    def completed_with(cls, note: str, *, result: Any = UNSET) -> Outcome:
        """The job is done, with a note saying what the run concluded."""
        return cls("completed", note=note, result=result)

    @classmethod
    def pause_in(cls, delay: float | timedelta) -> Outcome:
        """A cooperative pause, not a failure: run again after ``delay`` (0 = yield now).

        The carry is saved; the failure count and the retry backstop are untouched.
        """
        return cls("pause", delay_ms=to_ms(delay, "pause delay"))

    @classmethod
    def pause_in_with(cls, delay: float | timedelta, note: str) -> Outcome:
        """A cooperative pause with a note."""
        return cls("pause", note=note, delay_ms=to_ms(delay, "pause delay"))

    @classmethod
    def suspend(cls, output: Any = None, note: str | None = None) -> Outcome:
        """Wait for ``queue.resume(job_id, value)``: no worker slot is held meanwhile.

        ``output`` (optional, pydantic-serializable) is visible through
        ``queue.get(job_id).output`` while the job waits.
        """
        return cls("suspend", note=note, output=output)


_COMPLETED = Outcome("completed")
