"""The mark a batch handler's run leaves in each job's note: which jobs ran together.

Every job of a batch (``vr.BatchHandler``, ``_worker/batch.py``) ends its
run with ``[batch LEAD of N]`` appended to its note, LEAD being the id of the
batch's first job; LEAD's own note lists the batch's ids as well (the first
``NOTE_IDS``): ``[batch LEAD of N: ID ID ... (+K more)]``. No field more for
any job, and nothing at all for a job that ran alone; the dashboard reads it
back (``parse``) to show a job's batch-mates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Job ids the batch's first job lists in its note.
NOTE_IDS = 100
_MARK = re.compile(r"\[batch (\S+) of (\d+)(?:: ([^\]\(]*?)(?: \(\+(\d+) more\))?)?\]$")


@dataclass(frozen=True, slots=True)
class BatchMark:
    """A batch as one job's note names it: its first job, its size, and (on the first job) its ids."""

    lead: str
    size: int
    ids: tuple[str, ...] = ()  # listed on the lead's note only
    more: int = 0  # ids past the listed ones


def mark(lead: str, size: int, ids: Sequence[str] | None = None) -> str:
    """The mark of a batch led by ``lead``; with ``ids`` (the lead's own), listing them."""
    if ids is None:
        return f"[batch {lead} of {size}]"
    listed = " ".join(ids[:NOTE_IDS])
    more = f" (+{len(ids) - NOTE_IDS} more)" if len(ids) > NOTE_IDS else ""
    return f"[batch {lead} of {size}: {listed}{more}]"


def parse(note: str | None) -> BatchMark | None:
    """The batch a run's note names, or None (a run that was not part of a batch)."""
    if not note or not note.endswith("]"):
        return None
    m = _MARK.search(note)
    if m is None:
        return None
    ids = tuple(m.group(3).split()) if m.group(3) else ()
    return BatchMark(m.group(1), int(m.group(2)), ids, int(m.group(4) or 0))
