"""A run's ending, as a value: what ``execute`` decided, for the completer to write.

Every way a run can end is one of the small frozen records below (Oban's
executor result, River's ``JobCompleteResult``): the worker's ``execute``
returns one, and the completer (``_worker/completer.py``) hands it to the
queue's store, which turns it into the one script call that writes it
(``_store/store.py``, ``QueueStore.end_run``). Nothing else decides what a
run's ending is, and nothing after ``execute`` changes it, except an
operator's cancel that arrived while it ran (a pause, suspend, failure or
release then ends it ``Cancelled``; a completion or a death stands).

The run's own state (its carry and attachment, encoded) travels beside the
ending, not in it: every ending but a death of undecodable data saves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backoff import Backoff
from .enums import DeadReason


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler returned ``Outcome.completed``: ``result`` is the encoded result ('' for none)."""

    note: str = ""
    result: bytes = b""


@dataclass(frozen=True, slots=True)
class Paused:
    """``Outcome.pause_in``: pending again after ``delay_ms``, not charged a failure."""

    delay_ms: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class Suspended:
    """``Outcome.suspend``: waits for ``queue.resume``; ``output`` is the encoded output ('' for none)."""

    note: str = ""
    output: bytes = b""


@dataclass(frozen=True, slots=True)
class Failed:
    """A failed run: retried after the backoff, or dead at the backstop (``max_failures``).

    ``error_type`` and ``traceback`` are the raised exception's public name
    and traceback tail ('' for none); ``backoff`` the task's own policy (None:
    the worker's).
    """

    note: str
    error_type: str = ""
    traceback: str = ""
    backoff: Backoff | None = None


@dataclass(frozen=True, slots=True)
class Dead:
    """The job dies at once, for ``reason``."""

    reason: DeadReason
    note: str
    error_type: str = ""
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class Released:
    """Back to pending unstarted or interrupted, not charged (a shutdown)."""

    note: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The run ends cancelled: an operator cancelled the job while it ran."""

    note: str


Ending = Completed | Paused | Suspended | Failed | Dead | Released | Cancelled

# The usual ending, made once: a completion without a note or a result.
COMPLETED = Completed()
