"""A clock the test moves by hand: what ``drain()`` advances instead of sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError


class Clock:
    """Milliseconds since the epoch that only move when told to.

    Give it to a client (``vr.Client.from_url(url, clock=Clock())``; the
    ``venturi_client`` fixture does) and every script reads its ``now`` from
    here instead of Redis ``TIME``: a job delayed by an hour is due the moment
    the test (or ``drain()``) advances the clock by an hour, with nothing slept.

    Args:
        start: Where the clock starts (default: the real time now, so the
            datetimes in journals read as today).
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            self._ms = time.time_ns() // 1_000_000
        else:
            if start.tzinfo is None:
                raise ConfigurationError(f"Clock start must be timezone-aware, got {start!r}")
            self._ms = int(start.timestamp() * 1000)

    def __call__(self) -> int:
        return self._ms

    def __repr__(self) -> str:
        return f"<Clock {self.now.isoformat(timespec='milliseconds')}>"

    @property
    def now(self) -> datetime:
        """The clock's time as an aware UTC datetime."""
        return datetime.fromtimestamp(self._ms / 1000, UTC)

    def advance(self, delta: float | timedelta) -> None:
        """Move forward by ``delta`` (seconds or a timedelta); never backwards."""
        self._ms += to_ms(delta, "clock advance")

    def advance_to(self, ms: int) -> None:
        """Move forward to ``ms`` since the epoch; a time already passed changes nothing."""
        self._ms = max(self._ms, int(ms))
