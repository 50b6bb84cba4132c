"""The small enums every layer shares: job priority and job state."""

from __future__ import annotations

import enum

from .errors import ConfigurationError


class Priority(enum.IntEnum):
    """How urgently a job is claimed: a higher level is always claimed first.

    Each level is its own pending sorted set in Redis (``pending:high`` …), so a
    claim costs the same however many lower-priority jobs wait.
    """

    LOW = 0
    NORMAL = 1
    HIGH = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        """The lowercase name stored in the job hash and used in key names."""
        # From a table: ``self.name`` is itself a property, and this is read
        # once or twice per job enqueued or claimed.
        return _LABELS[self]

    @classmethod
    def parse(cls, value: Priority | int | str) -> Priority:
        """Accept a Priority, its integer value or its (case-insensitive) name.

        Raises:
            ConfigurationError: Anything else, a bool included (``True`` is
                not ``NORMAL``).
        """
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        raise ConfigurationError(
            f"unknown priority {value!r}: use a vr.Priority, one of {[p.label for p in cls]} "
            f"or an int from {min(cls).value} to {max(cls).value}"
        )


class JobState(enum.StrEnum):
    """Where a job is in its life; the value is what ``HGET job state`` shows.

    PENDING covers every job waiting in a pending set: new, delayed, paused and
    retry-waiting alike (their ``eligible_at`` tells them apart). WAITING is a
    job waiting for other jobs to finish (``queue.enqueue(task, after=...)``,
    ``queue.enqueue_flow``); it becomes PENDING when they have.
    """

    PENDING = "pending"
    WAITING = "waiting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


_LABELS: tuple[str, ...] = tuple(p.name.lower() for p in sorted(Priority))  # indexed by value
PRIORITIES_HIGH_FIRST: tuple[Priority, ...] = tuple(sorted(Priority, reverse=True))


class DeadReason(enum.StrEnum):
    """Why a job is dead; the value is what its ``dead`` journal entry (and ``HGET job dead_reason``) says.

    ``JobInfo.dead_reason`` reads it (None unless the job is dead).
    """

    PERMANENT = "permanent"  # its handler raised vr.TaskError.permanent(...), or returned no vr.Outcome
    MAX_FAILURES = "max_failures"  # the retry backstop: too many failed runs
    UNKNOWN_KIND = "unknown_kind"  # no worker that claimed it has a handler for its KIND
    INVALID_PAYLOAD = "invalid_payload"  # its payload, carry or resume input no longer decodes
    CORRUPT = "corrupt"  # its own data in Redis is corrupt: quarantined (docs/guarantees.md)
    DEPENDENCY_FAILED = "dependency_failed"  # a job it waited on failed (workflows)
    EXPIRED = "expired"  # not started before its deadline (``enqueue(expires=...)``)

    @classmethod
    def of(cls, stored: str | None) -> DeadReason | None:
        """The reason a stored value names; None for none (or one this release does not know).

        ``bad_payload`` is how releases before 0.2 wrote both INVALID_PAYLOAD and
        CORRUPT (a quarantined job); it reads as INVALID_PAYLOAD.
        """
        if not stored:
            return None
        if stored == "bad_payload":
            return cls.INVALID_PAYLOAD
        try:
            return cls(stored)
        except ValueError:
            return None
