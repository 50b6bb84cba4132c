"""``Queue``'s queue-wide reads and operator actions: counts, stats, retries, cancels, purges.

A mixin of ``Queue`` (``client.py``), split from it by concept: ``client.py``
keeps what a producer does with one job (enqueue, read it, resume it); this
is what an operator (the CLI, the dashboard) asks of the whole queue. Each
method is a thin delegation to the module that does the work (``reads.py``,
``ops.py``, ``update.py``), given the queue as a ``QueueLike``.

``reads.py`` is imported where a read is first called, not with ``Queue``
(issue 42: a worker's start-up).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Unpack

from .._model.enums import PRIORITIES_HIGH_FIRST, JobState, Priority
from .._model.records import JobInfo, WorkerInfo
from .._model.task import Task
from .._store.keys import QueueKeys
from .._store.store import QueueStore
from . import ops as _ops
from . import update as _update
from .base import ClientLike

if TYPE_CHECKING:
    from .bulk import BulkFilters
    from .reads import QueueStats


class QueueAdmin:
    """The counts, listings and operator actions of one queue (``Queue`` has them)."""

    client: ClientLike
    keys: QueueKeys
    store: QueueStore
    name: str

    # -- queue-wide reads ----------------------------------------------------------

    async def counts(self) -> dict[str, int]:
        """Jobs per state: ``pending:<level>`` for each priority, ``limited`` (pending jobs
        parked on a limit: docs/flow-control.md), the sum of those ``pending``, ``delayed``
        (pending, eligible later) and ``retrying`` (pending after a failed run, waiting for
        its retry), then ``waiting`` (workflows), ``running``, ``suspended``, ``completed``,
        ``dead`` and ``cancelled``. O(1) or O(log n) per index, whatever the queue's size."""
        from . import reads as _reads  # a reading: not imported at a worker's start (issue 42)

        return await _reads.counts(self.client, [self.keys])

    async def is_drained(self) -> bool:
        """Nothing pending (delayed, retry-waiting and parked on a limit included) and nothing running.

        A job waiting on its order key counts while its key will let it go
        by itself: behind a holder that is pending or running (counted as
        such), or behind one that a claim ended (cancelled, expired,
        quarantined), whose key the reclaim's next sweep lets go
        (``order:ended``). Jobs waiting on a paused key (``pause_key``) or
        behind a suspended holder do not count, as suspended jobs do not:
        none of them runs until someone resumes the key or the job.
        """
        pipe = self.client.redis.pipeline(transaction=False)
        for p in PRIORITIES_HIGH_FIRST:
            pipe.zcard(self.keys.pending(p))
        pipe.zcard(self.keys.running)
        pipe.zcard(self.keys.limits_parked)
        pipe.scard(self.keys.order_ended)
        counts: list[int] = await pipe.execute()
        return sum(counts) == 0

    async def stats(self) -> QueueStats:
        """Counts per state and priority, lag and completions in the last minute."""
        from . import reads as _reads  # a reading: not imported at a worker's start (issue 42)

        return await _reads.stats(self)

    async def workers(self) -> list[WorkerInfo]:
        """The workers consuming this queue now (each renews its registration every lease
        tick; a stopped or killed one is gone within about a lease)."""
        from . import reads as _reads  # a reading: not imported at a worker's start (issue 42)

        return await _reads.list_workers(self)

    async def list_jobs(
        self, *, state: JobState | str | None = None, kind: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """Jobs read from the index zsets, optionally of one state and KIND (see ``reads.list_jobs``).

        ``state`` is a ``JobState`` or a view of the pending jobs: ``"retrying"``
        (the last run failed), ``"delayed"`` (eligible later), ``"limited"``
        (parked on a limit)."""
        from . import reads as _reads  # a reading: not imported at a worker's start (issue 42)

        return await _reads.list_jobs(self, state=state, kind=kind, limit=limit)

    # -- operations: the CLI and the dashboard call these -----------------------------

    async def retry(self, job_id: str) -> bool:
        """Move a dead job back to pending with its failures reset; False if it is not dead.

        ``CorruptQueueError`` when the job's own data is corrupt (nothing written)."""
        return await _ops.retry(self, job_id)

    async def retry_dead(
        self,
        **filters: Unpack[BulkFilters],
    ) -> list[str]:
        """Move dead jobs back to pending, oldest death first; returns their ids.

        ``filters`` are ``vr.BulkFilters`` (``kind``, ``error_type``, ``since``
        and ``until`` on the time of death, ``note_contains``, ``limit``,
        ``on_progress``): each is described there.

        Runs in short batches (docs/operations.md, "Bulk actions"): safe to run
        again after an interruption. A dead job whose own data is corrupt
        stays dead, untouched, with a warning logged. ``ConfigurationError``
        for a bad filter (nothing written).
        """
        return await _ops.retry_dead(
            self,
            **filters,
        )

    async def cancel_jobs(
        self,
        state: str = "pending",
        **filters: Unpack[BulkFilters],
    ) -> list[str]:
        """Cancel the jobs of ``state`` (pending, suspended, waiting or running) that match;
        returns their ids. The filters are ``retry_dead``'s, ``since`` / ``until`` on when each
        job was enqueued; a running job is asked to stop (as ``cancel``)."""
        got = await _ops.cancel_jobs(
            self,
            state,
            **filters,
        )
        return got.moved

    async def update(
        self,
        job_id: str,
        *,
        task: Task[Any] | None = None,
        priority: Priority | int | str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Change a pending (or delayed) job in place, atomically (docs/operations.md).

        Args:
            job_id: The job.
            task: Its new task (payload and dedup key), of the job's own KIND.
                Its priority, timeout and limit key are not read: the job's stay.
            priority: Its new priority (it keeps its place by eligibility).
            delay: Eligible this long from now (Redis's clock) ...
            at: ... or at this timezone-aware time; not both.

        Returns:
            True when updated; False, with nothing written, when the job is not
            pending (unknown, running, finished, suspended, waiting).

        Raises:
            ConfigurationError: Nothing to update, a bad priority, delay or
                ``at``, an invalid task, a task of another KIND than the job's,
                or a new dedup key another job holds; nothing written.
            CorruptQueueError: The job's own data is corrupt; nothing written.
        """
        return await _update.update(self, job_id, task=task, priority=priority, delay=delay, at=at)

    async def cancel(self, job_id: str) -> str:
        """Cancel a job: ``"cancelled"`` (it was pending or suspended), ``"requested"``
        (it is running: its handler is asked to stop and the run ends cancelled),
        ``"not_found"`` or ``"finished"`` (nothing done). ``CorruptQueueError``
        when the job's own data is corrupt (nothing written)."""
        result, _ = await _ops.cancel(self, job_id)
        return result

    async def pause(self) -> None:
        """Pause claims on this queue (atomic; running jobs finish, enqueues still land)."""
        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        await _ops.pause(self)

    async def resume_queue(self) -> None:
        """Let workers claim from this queue again (and wake them)."""
        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        await _ops.resume_queue(self)

    async def pause_key(self, key: str) -> bool:
        """Stop the jobs of order key ``key`` from starting until ``resume_key`` (atomic).

        The key's next job, pending and not started yet (or waiting for its
        retry), is held back, first of its key; a running one goes on. Jobs
        of the key enqueued meanwhile wait behind it, in order
        (docs/semantics.md, "Ordered keys"). True when the key was not paused.
        A key that is not 1 to 1024 bytes of UTF-8 raises ``ConfigurationError``.
        """
        return await _ops.order_pause(self, key, True)

    async def resume_key(self, key: str) -> bool:
        """Let the jobs of order key ``key`` run again, in order, from its first waiting one.

        Also frees a key left held by a job that has finished (its order
        keys were damaged when it ended, then repaired). True when the key
        was paused.
        """
        return await _ops.order_pause(self, key, False)

    async def purge(
        self,
        state: str,
        *,
        older_than: float | timedelta = 0.0,
        **filters: Unpack[BulkFilters],
    ) -> int:
        """Remove finished jobs (``completed``, ``dead`` or ``cancelled``) and their journals;
        returns how many. The filters are ``retry_dead``'s, ``since`` / ``until`` on when each
        job finished."""
        return await _ops.purge(
            self,
            state,
            older_than=older_than,
            **filters,
        )
