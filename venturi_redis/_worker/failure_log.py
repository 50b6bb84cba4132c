"""The WARNING a failed run logs: its job, kind, exception type and note, a few per kind a minute.

A failed run is retried quietly by design, but it is also the first sign of a
broken deploy or a provider that is down, and an operator reading the log
must see it (Celery, RQ and BullMQ all report it). A deploy that breaks a
handler fails every run of its kind, though, thousands a minute: each kind
gets at most ``BURST`` lines per ``WINDOW`` seconds, and the first line of
the next window says how many were held back, so the log shows that it
fails, what it raises and how often, without drowning everything else. The
full story of each run stays in its journal (the `failed` entry keeps the
exception type and the traceback's tail).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("venturi_redis.worker")

BURST = 5
WINDOW = 60.0
# Kinds tracked at once: only registered kinds run, but a worker serving
# very many is bounded anyway (forgetting a kind only lets a line through).
_MAX_KINDS = 1024


class FailureLog:
    """Logs failed runs at WARNING, at most ``burst`` lines per kind per ``window`` seconds."""

    def __init__(
        self, burst: int = BURST, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        # kind -> [window start, lines logged in it, runs held back]
        self._kinds: dict[str, list[float]] = {}

    def failed(self, job_id: str, kind: str, error: str, note: str, traceback: str = "") -> bool:
        """Log one failed run of ``kind`` (``error``: its exception type); False when held back.

        ``traceback`` is the journal's, scrubbed of the task's secrets as the note is: never
        the exception itself, whose message and frames may quote them (``exc_info`` would
        format it afresh)."""
        now = self.clock()
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.window:
            if state is None and len(self._kinds) >= _MAX_KINDS:
                self._kinds.clear()
            state = self._kinds[kind] = [now, 0, state[2] if state else 0]
        if state[1] >= self.burst:
            state[2] += 1
            return False
        state[1] += 1
        held, state[2] = int(state[2]), 0
        more = f" ({held} more failed runs of {kind} were not logged)" if held else ""
        tail = f"\n{traceback}" if traceback else ""
        log.warning("job %s (%s) failed: %s: %s%s%s", job_id, kind, error, note, more, tail)
        return True


FAILURES = FailureLog()


def failed_run(job_id: str, kind: str, error: str, note: str, traceback: str = "") -> None:
    """The worker's failed-run WARNING (``execute.py`` calls it where a run fails)."""
    FAILURES.failed(job_id, kind, error, note, traceback)
