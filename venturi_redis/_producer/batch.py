"""``enqueue_many``'s bookkeeping: one transaction of script calls, then who holds what.

A batch goes out as chunks of ``ENQUEUE_CHUNK`` jobs (one script call each,
in one MULTI/EXEC when there are several); this module sorts the replies
into the jobs created, the dedup collisions to merge (``dedup.py``), and,
when a call failed, which tasks were written, which were not and which
nobody can tell (``PartialEnqueueError``). ``Queue.enqueue_many`` and
``ShardedQueue.enqueue_many`` (one batch per partition) both end here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.errors import PartialEnqueueError
from .._model.task import Task
from .._store.prepare import ENQUEUE_CHUNK, Prepared
from .._transport.durable import NotDurableError
from .dedup import merge_into

if TYPE_CHECKING:
    from .base import QueueLike


async def enqueue_prepared(queue: QueueLike, tasks: Sequence[Task[Any]], jobs: list[Prepared]) -> list[str]:
    """The writing half of ``enqueue_many``: ``jobs`` are ``tasks`` prepared (see ``Queue.enqueue_many``)."""
    if not jobs:
        return []
    await queue.client._recorded.ensure(queue.client.redis, queue.name)  # registry.py
    chunks = [jobs[i : i + ENQUEUE_CHUNK] for i in range(0, len(jobs), ENQUEUE_CHUNK)]
    replies = await queue.store.enqueue_chunks(chunks)
    ids: list[str | None] = [None] * len(jobs)
    holders = [""] * len(jobs)
    unknown: list[int] = []
    failure: Exception | None = None
    to_probe: list[int] = []
    for c, reply in enumerate(replies):
        base = c * ENQUEUE_CHUNK
        if isinstance(reply, Exception):
            failure = failure or reply
            if lost_in_flight(reply):
                unknown += range(base, base + len(chunks[c]))
            else:
                to_probe += range(base, base + len(chunks[c]))
            continue
        for k, holder in enumerate(reply):
            if holder:
                holders[base + k] = holder
            else:
                ids[base + k] = jobs[base + k].id
    if failure is not None:
        # A script that failed may have created some of its jobs before the
        # error (scripts do not roll back): ids are fresh, so a job hash
        # that exists is one this call wrote.
        unknown += await _probe_created(queue, jobs, to_probe, ids)
        _raise_partial(queue, ids, unknown, failure)
    collided = [i for i, h in enumerate(holders) if h]
    if collided:
        for i in collided:
            try:
                ids[i] = await merge_into(queue, tasks[i], jobs[i], holders[i])
            except Exception as exc:  # noqa: BLE001 - re-raised, with what was written
                _raise_partial(queue, ids, [], exc)
    return [job_id for job_id in ids if job_id is not None]


async def _probe_created(
    queue: QueueLike, jobs: Sequence[Prepared], positions: list[int], ids: list[str | None]
) -> list[int]:
    """Fill ``ids`` for the jobs at ``positions`` that exist; returns the positions left unknown."""
    if not positions:
        return []
    pipe = queue.client.redis.pipeline(transaction=False)
    for i in positions:
        pipe.exists(queue.keys.job(jobs[i].id))
    try:
        found = await pipe.execute()
    except Exception:  # noqa: BLE001 - Redis gone too: nobody can tell
        return positions
    for i, exists in zip(positions, found, strict=True):
        if exists:
            ids[i] = jobs[i].id
    return []


def _raise_partial(queue: QueueLike, ids: list[str | None], unknown: list[int], cause: Exception) -> NoReturn:
    """Raise ``cause`` when the outcome is uniform (nothing written, or all unknown), else
    a ``PartialEnqueueError`` that says which tasks were enqueued."""
    if not unknown and all(job_id is None for job_id in ids):
        raise cause  # nothing written: exactly what a single enqueue would raise
    if len(unknown) == len(ids):
        raise cause  # one call lost in flight: all or nothing, like a single enqueue
    raise PartialEnqueueError(queue.name, ids, unknown, cause) from cause


def lost_in_flight(exc: BaseException) -> bool:
    """A call that failed with no reply from Redis: it may or may not have run."""
    if isinstance(exc, NotDurableError):
        return False  # applied: only the replicas' acknowledgement is missing
    return isinstance(exc, (RedisConnectionError, RedisTimeoutError))
