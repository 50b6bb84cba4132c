"""Sharded queues: one logical queue split over N partitions, each its own slot.

A queue lives in one Redis Cluster slot (its keys share the hash tag
``{queue}``), so one hot queue uses one master however many the cluster has.
``ShardedQueue("orders", partitions=6)`` is six ordinary queues whose names are
derived from ``orders``; producers spread jobs over them and a worker given
the sharded queue consumes all six.

Partition names
---------------
Partition ``i`` of ``N`` is called ``<name>.p<i>-<salt>``: ``salt`` is the
smallest number that puts the partition's hash slot into the ``i``-th of ``N``
equal ranges of the 16384 slots. Names are a pure function of (name, N, i),
so every producer and worker process agrees on them without coordination, and
on a cluster whose masters own equal contiguous slot ranges (what
``redis-cli --cluster create`` builds) ``N`` a multiple of the number of masters
gives every master the same number of partitions. ``.`` and ``-`` are the only
separators a queue name allows besides ``_``; queue names matching
``<anything>.p<digits>-<digits>`` are reserved for partitions. Changing ``N``
changes every name: drain the old layout (a worker on
``ShardedQueue(name, old_n)``) before switching.

Routing and ordering
--------------------
* A task with a dedup key goes to the partition chosen by a stable hash
  (CRC32) of its dedup field (KIND and key), so two enqueues of the same key
  always meet in the same partition, and dedup and merge work as on one queue.
* Other tasks go round-robin from a random start, so many producers spread
  evenly and none of them piles onto partition 0.
* Priority order (critical > high > normal > low, then eligibility, then
  creation) holds *within* a partition. Across partitions each partition is
  claimed on its own: a LOW job of one partition can start before a CRITICAL
  job of another partition whose worker slots are busy. Use a separate
  (unsharded) queue for work that must overtake everything.

Workers
-------
``Worker(sharded_queue)`` consumes every partition, each with its own claim
loop, its own reclaimer and its own ``concurrency`` slots (a partition is a
queue to the worker). No partition can starve another: they never compete for
a claim loop or for slots. Size ``concurrency`` per partition.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Unpack

import anyio
from redis.crc import key_slot

from .._model.enums import JobState, Priority
from .._model.errors import ConfigurationError, PartialEnqueueError, TaskDefinitionError
from .._model.records import JobInfo, JournalEntry
from .._model.task import Task
from .._store.checks import check_batch_count, checked_dedup_field, checked_order_key, not_a_task
from .._store.keys import QueueKeys, validate_name
from .._store.prepare import (
    ENQUEUE_MANY_OPTIONS,
    EnqueueManyOptions,
    EnqueueOptions,
    prepare_many,
    unknown_option,
)
from .._transport.urls import redact_url
from .base import server_now_ms
from .batch import enqueue_prepared, lost_in_flight
from .client import Client, Queue

if TYPE_CHECKING:
    from .._model.history import HistoryPoint
    from .bulk import BulkFilters
    from .reads import QueueStats

SLOTS = 16384
MAX_PARTITIONS = 1024
_PARTITION_RE = re.compile(r"(?P<base>.+)\.p(?P<index>\d+)-(?P<salt>\d+)")


def partition_names(name: str, partitions: int, namespace: str = "venturi") -> list[str]:
    """The queue names of the ``partitions`` partitions of sharded queue ``name``.

    Partition ``i``'s hash slot lies in ``[i * 16384 // N, (i + 1) * 16384 // N)``.
    """
    validate_name(name)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigurationError(f"partitions must be 1 to {MAX_PARTITIONS}, got {partitions}")
    names: list[str] = []
    for i in range(partitions):
        lo, hi = i * SLOTS // partitions, (i + 1) * SLOTS // partitions
        salt = 0
        while True:
            candidate = f"{name}.p{i}-{salt}"
            # The slot of every key of the partition: the hash tag is the name.
            if lo <= key_slot(candidate.encode()) < hi:
                break
            salt += 1
        validate_name(candidate, f"partition name (of sharded queue {name!r}, too long?)")
        QueueKeys.for_queue(candidate, namespace)
        names.append(candidate)
    return names


def parse_partition(queue_name: str) -> tuple[str, int] | None:
    """``(sharded queue name, index)`` if ``queue_name`` looks like a partition, else None.

    Only the shape is checked (the partition count is not known from one name);
    ``group_partitions`` checks whole layouts.
    """
    m = _PARTITION_RE.fullmatch(queue_name)
    if m is None:
        return None
    return m.group("base"), int(m.group("index"))


def group_partitions(queue_names: Sequence[str]) -> dict[str, list[str]]:
    """Group queue names (as ``discover_queues`` lists them) into logical queues.

    Returns ``{logical name: [queue names]}``: a plain queue maps to itself; the
    partitions of a sharded queue map to its name when they are exactly the
    layout ``partition_names(name, N)`` for some N (empty partitions that left
    no keys are allowed for). Anything else stays a plain queue. For the CLI and
    stats, which show a sharded queue as one queue.
    """
    by_base: dict[str, set[str]] = {}
    out: dict[str, list[str]] = {}
    for q in queue_names:
        parsed = parse_partition(q)
        if parsed is None:
            out.setdefault(q, []).append(q)
        else:
            by_base.setdefault(parsed[0], set()).add(q)
    for base, found in by_base.items():
        top = max(int(_PARTITION_RE.fullmatch(q).group("index")) for q in found)  # type: ignore[union-attr]
        layout: list[str] | None = None
        for n in range(top + 1, MAX_PARTITIONS + 1):
            names = partition_names(base, n)
            if found <= set(names):
                layout = names
                break
            if n > top + 64:  # found names cannot belong to a much larger layout
                break
        if layout is None:
            for q in found:
                out.setdefault(q, []).append(q)
        else:
            out.setdefault(base, []).extend(q for q in layout if q in found)
    return out


class ShardedQueue:
    """One logical queue spread over ``partitions`` queues (see the module docs).

    Get one from ``ShardedQueue(client, name, partitions=N)``. Enqueue, read
    and count as with a ``Queue``; give it to a ``Worker`` like a queue.

    Args:
        client: The client (a Redis Cluster client to use several masters;
            any client works, a single Redis just gains nothing).
        name: The logical name; partitions are named from it.
        partitions: How many partitions (a multiple of the cluster's masters).
    """

    def __init__(self, client: Client, name: str, *, partitions: int) -> None:
        self.client = client
        self.name = name
        self.partition_names = partition_names(name, partitions, client.namespace)
        self.partitions: list[Queue] = [client.queue(n) for n in self.partition_names]
        # Round-robin from a random start: many producers do not all begin at p0.
        self._next = random.randrange(partitions)

    def __repr__(self) -> str:
        at = redact_url(self.client.url) if self.client.url else "redis"
        return f"<ShardedQueue {self.name!r} x{len(self.partitions)} at {at}>"

    # -- routing -----------------------------------------------------------------

    def partition_for(self, task: Task[Any]) -> Queue:
        """The partition a task goes to: by dedup key or order key if it has one, else round-robin."""
        if not isinstance(task, Task):
            raise TaskDefinitionError(not_a_task(task))
        key = task.dedup_key()
        if key is not None:
            field = checked_dedup_field(type(task).kind(), key)
            return self.partitions[zlib.crc32(field.encode()) % len(self.partitions)]
        okey = task.order_key()
        if okey is not None:
            # Every job of an order key in one partition: its order is kept there.
            checked_order_key(type(task).kind(), okey, "")
            return self._order_partition(okey)
        q = self.partitions[self._next]
        self._next = (self._next + 1) % len(self.partitions)
        return q

    async def partition_of(self, job_id: str) -> Queue | None:
        """The partition holding ``job_id`` (one round trip over all partitions), or None."""
        pipe = self.client.redis.pipeline(transaction=False)
        for p in self.partitions:
            pipe.exists(p.keys.job(job_id))
        found = await pipe.execute()
        for p, n in zip(self.partitions, found, strict=True):
            if int(n):
                return p
        return None

    # -- enqueue -------------------------------------------------------------------

    async def enqueue(self, task: Task[Any], **options: Unpack[EnqueueOptions]) -> str:
        """Enqueue one task on its partition (see ``Queue.enqueue``); returns the job id.

        ``after=`` is refused (``ConfigurationError``): a job waits only on
        jobs of its own queue, and a partition is chosen by the task.
        """
        if options.get("after") is not None:
            raise ConfigurationError(
                "a ShardedQueue cannot enqueue with after=: a job waits only on jobs of its own "
                "queue; use one of its partitions (sharded.partitions) for a workflow"
            )
        return await self.partition_for(task).enqueue(task, **options)

    async def enqueue_many(
        self, tasks: Sequence[Task[Any]], **options: Unpack[EnqueueManyOptions]
    ) -> list[str]:
        """Enqueue many tasks: one ``enqueue_many`` per partition, all at once.

        Returns the ids in the order of ``tasks``. Every task of every
        partition is validated and encoded before anything is sent, so a bad
        task raises with nothing written. Each partition's batch is then all
        or nothing, as ``Queue.enqueue_many`` says, but partitions live on
        different slots (masters) and cannot share a transaction: when some
        partitions fail and others do not, ``PartialEnqueueError`` says which
        tasks were enqueued, over the whole of ``tasks``.
        """
        bad = unknown_option(options, ENQUEUE_MANY_OPTIONS, "enqueue_many")
        if bad is not None:
            raise bad
        check_batch_count(len(tasks), self.partitions[0].client.max_batch_jobs)  # before any routing
        groups: dict[int, list[int]] = {}
        index = {id(p): i for i, p in enumerate(self.partitions)}
        for pos, task in enumerate(tasks):
            groups.setdefault(index[id(self.partition_for(task))], []).append(pos)
        batches = {
            part: prepare_many(
                [tasks[i] for i in positions],
                self.partitions[part].client.max_payload_bytes,
                self.partitions[part].client.encryption,
                **options,
                max_jobs=self.partitions[part].client.max_batch_jobs,
                max_bytes=self.partitions[part].client.max_batch_bytes,
            )
            for part, positions in groups.items()
        }
        results: dict[int, list[str] | Exception] = {}

        async def one(part: int, positions: list[int]) -> None:
            try:
                results[part] = await enqueue_prepared(
                    self.partitions[part], [tasks[i] for i in positions], batches[part]
                )
            except Exception as exc:  # noqa: BLE001 - gathered below, with what the others wrote
                results[part] = exc

        async with anyio.create_task_group() as tg:
            for part, positions in groups.items():
                tg.start_soon(one, part, positions)
        failed = [r for r in results.values() if isinstance(r, Exception)]
        if failed and len(groups) == 1:
            raise failed[0]
        ids: list[str | None] = [None] * len(tasks)
        unknown: list[int] = []
        for part, positions in groups.items():
            r = results[part]
            if isinstance(r, PartialEnqueueError):
                unknown += [positions[i] for i in r.unknown]
                r_ids = r.ids
            elif isinstance(r, Exception):
                if lost_in_flight(r):
                    unknown += positions
                continue
            else:
                r_ids = list(r)
            for i, job_id in zip(positions, r_ids, strict=True):
                ids[i] = job_id
        if not failed:
            return [job_id or "" for job_id in ids]
        first = failed[0]
        cause = first.__cause__ if isinstance(first, PartialEnqueueError) else first
        if len(unknown) == len(tasks) or (not unknown and all(job_id is None for job_id in ids)):
            raise first  # nothing written anywhere, or nobody can tell: the error itself
        raise PartialEnqueueError(self.name, ids, sorted(unknown), cause or first) from cause

    # -- reading -------------------------------------------------------------------

    async def get(self, job_id: str) -> JobInfo | None:
        """A snapshot of the job (from whichever partition holds it), or None."""
        p = await self.partition_of(job_id)
        return None if p is None else await p.get(job_id)

    async def journal(self, job_id: str) -> list[JournalEntry]:
        """The job's journal, oldest first (empty if the job is unknown)."""
        p = await self.partition_of(job_id)
        return [] if p is None else await p.journal(job_id)

    async def counts(self) -> dict[str, int]:
        """Jobs per state summed over the partitions (same keys as ``Queue.counts``)."""
        from .reads import counts

        return await counts(self.client, [q.keys for q in self.partitions])

    async def stats(self) -> QueueStats:
        """``Queue.stats()`` of the whole sharded queue (see ``merge_stats``)."""
        return merge_stats(self.name, [await p.stats() for p in self.partitions])

    async def history(
        self, *, since: timedelta = timedelta(hours=1), kind: str | None = None, step: timedelta | None = None
    ) -> list[HistoryPoint]:
        """``Queue.history`` summed over the partitions, step by step (one clock for all)."""
        from .._model.history import merge, plan  # not imported at a worker's start (issue 42)
        from .history import read as read_history

        plan(0, since, step)  # the arguments checked before any command
        the_plan = plan(await server_now_ms(self.client), since, step)
        return merge([await read_history(p, the_plan, kind) for p in self.partitions])

    async def set_history(self, enabled: bool) -> None:
        """Switch the metrics history of every partition on or off (``Queue.set_history``)."""
        for p in self.partitions:
            await p.set_history(enabled)

    async def partition_counts(self) -> dict[str, dict[str, int]]:
        """``Queue.counts()`` of every partition, by partition name (to see skew)."""
        return {q.name: await q.counts() for q in self.partitions}

    async def is_drained(self) -> bool:
        """Nothing pending and nothing running in any partition (``Queue.is_drained``)."""
        pipe = self.client.redis.pipeline(transaction=False)
        for q in self.partitions:
            for key in [*q.keys.pending_high_first, q.keys.running, q.keys.limits_parked]:
                pipe.zcard(key)
            pipe.scard(q.keys.order_ended)
        return sum(int(n) for n in await pipe.execute()) == 0

    async def resume(self, job_id: str, value: Any = None) -> int:
        """Resume a suspended job (see ``Queue.resume``); 0 if no partition holds it suspended."""
        p = await self.partition_of(job_id)
        return 0 if p is None else await p.resume(job_id, value)

    async def update(
        self,
        job_id: str,
        *,
        task: Task[Any] | None = None,
        priority: Priority | int | str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Change a pending job in place (see ``Queue.update``); False if no partition holds it."""
        p = await self.partition_of(job_id)
        return (
            False if p is None else await p.update(job_id, task=task, priority=priority, delay=delay, at=at)
        )

    async def cancel(self, job_id: str) -> str:
        """Cancel a job (see ``Queue.cancel``); ``"not_found"`` if no partition holds it."""
        p = await self.partition_of(job_id)
        return "not_found" if p is None else await p.cancel(job_id)

    async def pause(self) -> None:
        """Pause claims on every partition."""
        for p in self.partitions:
            await p.pause()

    async def resume_queue(self) -> None:
        """Let workers claim from every partition again."""
        for p in self.partitions:
            await p.resume_queue()

    async def pause_key(self, key: str) -> bool:
        """Pause an order key (see ``Queue.pause_key``) in the partition its jobs go to."""
        return await self._order_partition(key).pause_key(key)

    async def resume_key(self, key: str) -> bool:
        """Resume an order key (see ``Queue.resume_key``) in the partition its jobs go to."""
        return await self._order_partition(key).resume_key(key)

    def _order_partition(self, key: object) -> Queue:
        order = checked_order_key("pause_key", key, "")
        return self.partitions[zlib.crc32(order.encode()) % len(self.partitions)]

    async def list_jobs(
        self, *, state: JobState | str | None = None, kind: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """Jobs of every partition (see ``Queue.list_jobs``), at most ``limit`` in all.

        Partition after partition, each in ``Queue.list_jobs``'s order; each
        job's ``queue`` is the partition that holds it.
        """
        out: list[JobInfo] = []
        for p in self.partitions:
            out += await p.list_jobs(state=state, kind=kind, limit=limit - len(out))
            if len(out) >= limit:
                break
        return out

    async def retry(self, job_id: str) -> bool:
        """Move a dead job back to pending (see ``Queue.retry``); False if no partition holds it dead."""
        p = await self.partition_of(job_id)
        return False if p is None else await p.retry(job_id)

    async def retry_dead(self, **filters: Unpack[BulkFilters]) -> list[str]:
        """Move dead jobs of every partition back to pending (see ``Queue.retry_dead``), partition
        after partition, at most ``limit`` in all; returns their ids."""
        limit = filters.get("limit")
        moved: list[str] = []
        for p in self.partitions:
            left = None if limit is None else limit - len(moved)
            if left is not None and left <= 0 and moved:
                break
            moved += await p.retry_dead(**_with_limit(filters, left))
        return moved

    async def cancel_jobs(
        self,
        state: str = "pending",
        **filters: Unpack[BulkFilters],
    ) -> list[str]:
        """Cancel the matching jobs of every partition (see ``Queue.cancel_jobs``), at most
        ``limit`` in all; returns their ids."""
        limit = filters.get("limit")
        done: list[str] = []
        for p in self.partitions:
            left = None if limit is None else limit - len(done)
            if left is not None and left <= 0 and done:
                break
            done += await p.cancel_jobs(state, **_with_limit(filters, left))
        return done

    async def purge(
        self,
        state: str,
        *,
        older_than: float | timedelta = 0.0,
        **filters: Unpack[BulkFilters],
    ) -> int:
        """Remove finished jobs of ``state`` from every partition (see ``Queue.purge``), at most
        ``limit`` in all; returns how many."""
        limit = filters.get("limit")
        removed = 0
        for p in self.partitions:
            left = None if limit is None else limit - removed
            if left is not None and left <= 0 and removed:
                break
            removed += await p.purge(state, older_than=older_than, **_with_limit(filters, left))
        return removed


def _with_limit(filters: BulkFilters, limit: int | None) -> BulkFilters:
    """``filters`` with a partition's share of the limit (what the earlier ones left)."""
    out = filters.copy()
    out["limit"] = limit
    return out


def merge_stats(name: str, parts: Sequence[QueueStats]) -> QueueStats:
    """One ``QueueStats`` for the partitions of sharded queue ``name``.

    Counts and throughput add up; ``lag_seconds`` and ``trim_lag_seconds`` are the worst partition's;
    ``paused`` is true when any partition is paused (claims stop there).
    """
    from .reads import QueueStats

    if not parts:
        raise ValueError(f"sharded queue {name}: no partition stats to merge")
    labels = list(parts[0].pending)
    return QueueStats(
        queue=name,
        paused=any(p.paused for p in parts),
        pending={label: sum(p.pending[label] for p in parts) for label in labels},
        delayed=sum(p.delayed for p in parts),
        running=sum(p.running for p in parts),
        suspended=sum(p.suspended for p in parts),
        completed=sum(p.completed for p in parts),
        dead=sum(p.dead for p in parts),
        cancelled=sum(p.cancelled for p in parts),
        lag_seconds=max(p.lag_seconds for p in parts),
        completed_last_minute=sum(p.completed_last_minute for p in parts),
        at=max(p.at for p in parts),
        waiting=sum(p.waiting for p in parts),
        limited=sum(p.limited for p in parts),
        retrying=sum(p.retrying for p in parts),
        trim_lag_seconds=max(p.trim_lag_seconds for p in parts),
        over_retention=sum(p.over_retention for p in parts),
        ordered=sum(p.ordered for p in parts),
    )


async def grouped_stats(client: Client, queue_names: Sequence[str]) -> list[QueueStats]:
    """Stats of ``queue_names`` with every sharded queue's partitions as one row (the CLI's)."""
    out: list[QueueStats] = []
    for name, members in group_partitions(queue_names).items():
        rows = [await client.queue(m).stats() for m in members]
        out.append(rows[0] if members == [name] else merge_stats(name, rows))
    return out


def expand_queues(queues: Any) -> list[Any]:
    """A worker's queue argument as a flat list of queues (sharded queues expanded)."""
    items = [queues] if isinstance(queues, (Queue, ShardedQueue)) else list(queues)
    out: list[Any] = []
    for q in items:
        out.extend(q.partitions if isinstance(q, ShardedQueue) else [q])
    return out


__all__ = [
    "ShardedQueue",
    "expand_queues",
    "group_partitions",
    "grouped_stats",
    "merge_stats",
    "parse_partition",
    "partition_names",
]
