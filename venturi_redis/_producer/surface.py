"""The operations every queue face offers, defined once: ``QueueSurface``.

``Queue`` (one named queue), ``ShardedQueue`` (one logical queue over
partitions) and ``SyncQueue`` (the blocking twin of ``Queue``) offer the same
operations with the same parameters; ``SyncQueue`` returns the value where
the others return an awaitable of it. This Protocol is the one definition of
those signatures: ``tests/test_surface.py`` compares every face's methods
with it (``inspect.signature``), and mypy checks the two async faces against
it structurally, so a parameter added to one face and not the others fails
the suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from .._model.enums import JobState, Priority
from .._model.history import HistoryPoint
from .._model.records import JobInfo, JournalEntry
from .._model.task import Task
from .._store.prepare import EnqueueManyOptions, EnqueueOptions
from .bulk import BulkFilters
from .reads import QueueStats


class QueueSurface(Protocol):
    """What ``Queue``, ``ShardedQueue`` and (blocking) ``SyncQueue`` all offer."""

    @property
    def name(self) -> str: ...

    # -- enqueue ---------------------------------------------------------------

    async def enqueue(self, task: Task[Any], **options: Unpack[EnqueueOptions]) -> str: ...

    async def enqueue_many(
        self, tasks: Sequence[Task[Any]], **options: Unpack[EnqueueManyOptions]
    ) -> list[str]: ...

    # -- reading ---------------------------------------------------------------

    async def get(self, job_id: str) -> JobInfo | None: ...

    async def journal(self, job_id: str) -> list[JournalEntry]: ...

    async def counts(self) -> dict[str, int]: ...

    async def is_drained(self) -> bool: ...

    async def stats(self) -> QueueStats: ...

    async def list_jobs(
        self, *, state: JobState | str | None = None, kind: str | None = None, limit: int = 50
    ) -> list[JobInfo]: ...

    # -- continuations and operations --------------------------------------------

    async def resume(self, job_id: str, value: Any = None) -> int: ...

    async def update(
        self,
        job_id: str,
        *,
        task: Task[Any] | None = None,
        priority: Priority | int | str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool: ...

    async def cancel(self, job_id: str) -> str: ...

    async def retry(self, job_id: str) -> bool: ...

    async def retry_dead(
        self,
        **filters: Unpack[BulkFilters],
    ) -> list[str]: ...

    async def cancel_jobs(
        self,
        state: str = "pending",
        **filters: Unpack[BulkFilters],
    ) -> list[str]: ...

    async def pause(self) -> None: ...

    async def resume_queue(self) -> None: ...

    async def pause_key(self, key: str) -> bool: ...

    async def resume_key(self, key: str) -> bool: ...

    async def purge(
        self,
        state: str,
        *,
        older_than: float | timedelta = 0.0,
        **filters: Unpack[BulkFilters],
    ) -> int: ...

    # -- observability -----------------------------------------------------------

    async def history(
        self, *, since: timedelta = timedelta(hours=1), kind: str | None = None, step: timedelta | None = None
    ) -> list[HistoryPoint]: ...


if TYPE_CHECKING:
    from .client import Queue
    from .sharded import ShardedQueue

    def _async_faces(queue: Queue, sharded: ShardedQueue) -> tuple[QueueSurface, QueueSurface]:
        """mypy's structural check of the two async faces (never called)."""
        return queue, sharded
