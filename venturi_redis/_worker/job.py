"""A claimed job, as the worker holds it from its claim to its written ending."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._model.enums import Priority
from .._model.records import JournalEntry, LazyJournal

if TYPE_CHECKING:
    from .._producer.client import Queue
    from .._store.store import ClaimReply, Completion
    from .context import Context


class SlotOwner(Protocol):
    """The claim loop that took a job (``runner.py``): its slot goes back once the run is over."""

    def release_slot(self, job: Job) -> None:
        """The job's handler is done: its slot can take another job."""


@dataclass(eq=False, slots=True)
class Job:
    """A claimed job, as the claim script returned it."""

    queue: Queue
    id: str
    kind: str
    payload: bytes
    carry: bytes
    run_count: int
    failures: int
    token: str
    lease_ms: int
    priority: Priority
    max_failures: str
    resume_input: bytes
    history: Sequence[JournalEntry]
    timeout_ms: int = 0  # the job's own run timeout (0: the worker's)
    started: float = field(default_factory=time.monotonic)
    # When it became eligible (ms; 0: unknown), for an observer's pickup latency.
    eligible_at: int = 0
    ctx: Context[Any] | None = None
    lost: bool = False
    cancel_requested: bool = False  # an operator's cancel, seen through `extend`
    # Set once the run's ending is on its way: a renewal that then finds the
    # job finished is our own write landing first, not a lost lease.
    committing: bool = False
    # The claim loop that took it; its slot is given back once the run's
    # ending is on its way (writing it no longer needs the slot).
    runner: SlotOwner | None = None
    holds_slot: bool = False
    # A completion handed to its connection's batch (completer.py): the slot
    # task no longer waits for it, and the completer settles it from there.
    deferred: bool = False
    completion: Completion | None = None


# Each priority's label (Priority.label is a property: a call per read).
_LABELS = {p: p.label for p in Priority}


def jobs_of(queue: Queue, claimed: ClaimReply) -> list[Job]:
    """The jobs of a claim's reply, in claim order."""
    jobs: list[Job] = []
    started = time.monotonic()
    # Positional, in Job's field order (keywords cost more): once per claimed job.
    append = jobs.append
    crypt = queue.client.encryption  # opens the attachments of its history, if read
    for (
        job_id,
        kind,
        payload,
        carry,
        runs,
        failures,
        token,
        lease,
        prio,
        maxf,
        resume,
        history,
        timeout_ms,
        created,
        eligible,
    ) in claimed.jobs():
        append(
            Job(
                queue,
                job_id,
                kind,
                payload,
                carry,
                runs,
                failures,
                token,
                lease,
                prio,
                maxf,
                resume,
                # Parsed only if the handler reads it; what the hash implies
                # (the `enqueued` entry, past runs' claims) put back then.
                LazyJournal(history, (created, _LABELS[prio], eligible), crypt),
                timeout_ms,
                started,
                int(eligible or created or 0),
            )
        )
    return jobs
