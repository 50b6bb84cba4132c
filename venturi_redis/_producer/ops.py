"""Operating a queue: dead-letter retry, cancel, queue pause, purge, retention.

The CLI (``venturi``) calls these, through the ``Queue`` methods that
delegate here. Every write is one Lua script (``cancel``, ``retry_dead``,
``purge``) or, for the queue pause flag, one ``HSET`` that the claim script
reads atomically. Reading a queue (``stats``, ``list_jobs``) is
``reads.py``; finding queues and jobs in the registry of queues,
``discovery.py``; the server check a worker makes, ``server.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Literal, Unpack

from redis.exceptions import ResponseError

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError, CorruptQueueError
from .._store.checks import checked_order_key
from .._store.keys import WAKE_CAP
from .._store.store import FINISHED_STATES, Retried, corrupt_job
from .base import server_now_ms
from .retention import _PURGE_BATCH, Retention, retention_field

if TYPE_CHECKING:
    from .base import QueueLike
    from .bulk import BulkFilters

CancelResult = Literal["cancelled", "requested", "not_found", "finished"]


# One retention pass removes at most this many batches per state, so a worker
# that finds a large backlog (retention just lowered) spreads it over ticks.
_TRIM_MAX_BATCHES = 10

log = logging.getLogger("venturi_redis.ops")


async def retry(queue: QueueLike, job_id: str, *, note: str = "retried by an operator") -> bool:
    """Move one dead job back to pending (failures reset). False if it is not dead.

    Raises:
        CorruptQueueError: The job's own data is corrupt (its key not a hash,
            its journal not a stream, no state, a bad priority); nothing written.
    """
    got = await _retry_ids(queue, [job_id], note)
    if job_id in got.refused:
        raise corrupt_job(f"job {job_id}: {got.refused[job_id]}")
    return bool(got.moved)


async def _retry_ids(queue: QueueLike, ids: list[str], note: str) -> Retried:
    got = await queue.store.retry_dead(ids, note)
    for job_id, why in got.refused.items():
        log.warning("queue %s: job %s not retried: %s (repair it, then retry it)", queue.name, job_id, why)
    return got


async def retry_dead(
    queue: QueueLike, *, note: str = "retried by an operator", **filters: Unpack[BulkFilters]
) -> list[str]:
    """Move dead jobs matching the filters (oldest death first) back to pending.

    Returns the ids moved. ``limit`` bounds how many; ``None`` retries all.
    A dead job whose own data is corrupt is left as it is, with a warning
    logged naming it and what is wrong; the others are moved. The filters,
    batches and progress reports: ``bulk.py``.
    """
    got = await retry_dead_report(queue, note=note, **filters)
    return got.moved


async def retry_dead_report(
    queue: QueueLike, *, note: str = "retried by an operator", **filters: Unpack[BulkFilters]
) -> Retried:
    """``retry_dead`` with the refused jobs too (id -> what is wrong), for the CLI."""
    from . import bulk as _bulk  # an operator's command: not imported at a worker's start (issue 42)

    now = await server_now_ms(queue.client)
    flt = _bulk.make_filter(filters, now)
    got = await _bulk.retry_dead(queue, flt, now, note, filters.get("on_progress"))
    for job_id, why in got.refused.items():
        log.warning("queue %s: job %s not retried: %s (repair it, then retry it)", queue.name, job_id, why)
    return got


async def cancel_jobs(
    queue: QueueLike,
    state: str = "pending",
    *,
    note: str = "cancelled by an operator",
    **filters: Unpack[BulkFilters],
) -> Retried:
    """Cancel the jobs of ``state`` matching the filters; ``since`` / ``until`` on their enqueue
    time. The ids cancelled (a running job's: asked to stop), and those refused as corrupt."""
    from . import bulk as _bulk  # an operator's command: not imported at a worker's start (issue 42)

    if state not in _bulk.CANCELLABLE:
        raise ConfigurationError(
            f"cancel_jobs takes state one of {', '.join(_bulk.CANCELLABLE)}, got {state!r}"
        )
    now = await server_now_ms(queue.client)
    flt = _bulk.make_filter(filters, now)
    got = await _bulk.cancel_jobs(queue, state, flt, now, note, filters.get("on_progress"))
    for job_id, why in got.refused.items():
        log.warning("queue %s: job %s not cancelled: %s", queue.name, job_id, why)
    return got


async def cancel(
    queue: QueueLike, job_id: str, *, note: str = "cancelled by an operator"
) -> tuple[CancelResult, str]:
    """Cancel a job; returns ``(result, detail)``.

    ``cancelled``: it was pending or suspended and is now cancelled.
    ``requested``: it is running; its worker asks the handler to stop (through
    ``ctx.cancelled()`` / ``ctx.is_cancelled()``) at its next lease renewal and
    the run ends cancelled. ``not_found`` / ``finished``: nothing was done;
    ``detail`` says why.
    """
    got = await queue.store.cancel(job_id, note)
    detail = got.detail
    if got.applied:
        return ("cancelled" if detail == "cancelled" else "requested"), detail
    return ("not_found" if detail == "job does not exist" else "finished"), detail


async def pause(queue: QueueLike) -> None:
    """Stop every worker from claiming on this queue, from the moment this returns.

    The claim script reads the flag in the same atomic step as it claims, so
    no claim that starts after the HSET succeeds. Running jobs finish;
    enqueues still land (and wait).
    """
    now = await server_now_ms(queue.client)
    with _meta_checked(queue):
        await queue.client.redis.hset(queue.keys.meta, mapping={"paused": "1", "paused_at": str(now)})


async def order_pause(queue: QueueLike, key: object, pause: bool) -> bool:
    """``queue.pause_key`` / ``resume_key``: the key checked as ``Task.order_key()`` is, then
    order_pause.lua. True when the key's pause changed."""
    okey = checked_order_key("pause_key" if pause else "resume_key", key, "")
    await queue.client._recorded.ensure(queue.client.redis, queue.name)  # registry.py
    return await queue.store.order_pause(okey, pause)


@contextmanager
def _meta_checked(queue: QueueLike) -> Iterator[None]:
    """Redis's WRONGTYPE on the queue's meta hash as a ``CorruptQueueError`` naming the key."""
    try:
        yield
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):  # a pipeline's error names its command first
            raise
        raise CorruptQueueError(
            f"{queue.keys.meta} is not a hash (overwritten by hand?): the queue's pause flag "
            "lives there; delete or repair the key, then try again"
        ) from exc


async def resume_queue(queue: QueueLike) -> None:
    """Undo ``pause``: claims succeed again, and workers are woken at once."""
    # One HDEL: the flag is gone atomically; then a wake-up token per pending
    # job (up to the wake list's cap) for the idle workers. A claim made
    # while paused emptied the list, so these are the only tokens in it.
    redis = queue.client.redis
    pipe = redis.pipeline(transaction=False)
    for key in queue.keys.pending_high_first:
        pipe.zcard(key)
    tokens = min(max(sum(await pipe.execute()), 1), WAKE_CAP)
    pipe = redis.pipeline(transaction=True)
    pipe.hdel(queue.keys.meta, "paused", "paused_at")
    pipe.rpush(queue.keys.wake, *["1"] * tokens)
    pipe.ltrim(queue.keys.wake, -WAKE_CAP, -1)
    with _meta_checked(queue):
        await pipe.execute()


def _check_finished(state: str) -> None:
    if state not in FINISHED_STATES:
        allowed = sorted(FINISHED_STATES)
        raise ConfigurationError(
            f"can only purge finished jobs: state must be one of {allowed}, got {state!r}"
        )


async def _purge_batch(
    queue: QueueLike, state: str, keep_ms: int | None, batch: int, *, most: int | None = None
) -> tuple[int, bool]:
    _check_finished(state)
    return await queue.store.purge(state, keep_ms=keep_ms, batch=batch, most=most)


async def purge(
    queue: QueueLike,
    state: str,
    *,
    older_than: float | timedelta = 0.0,
    **filters: Unpack[BulkFilters],
) -> int:
    """Remove finished jobs of ``state`` (with journals) that finished ``older_than`` ago or more,
    and match the filters (``since`` / ``until`` on when they finished).

    Without filters, runs the purge script batch after batch, oldest first,
    until none is left; with any, reads them by pages (``bulk.py``). Returns
    how many jobs were removed.
    """
    from . import bulk as _bulk  # an operator's command: not imported at a worker's start (issue 42)

    _check_finished(state)
    keep_ms = to_ms(older_than, "older_than")
    now = await server_now_ms(queue.client)
    flt = _bulk.make_filter(filters, now)
    on_progress = filters.get("on_progress")
    if flt != _bulk.Filter() or on_progress is not None:
        return await _bulk.purge(queue, state, flt, now, keep_ms, on_progress)
    total = 0
    while True:
        removed, more = await _purge_batch(queue, state, keep_ms, _PURGE_BATCH)
        total += removed
        if not more:
            return total


async def record_retention(queue: QueueLike, retention: Retention | None) -> None:
    """Record in the queue's meta hash the retention a worker trims by (``retention``,
    docs/redis-layout.md): ``stats`` measures how far trimming is behind against it."""
    try:
        await queue.client.redis.hset(queue.keys.meta, "retention", retention_field(retention))
    except ResponseError as exc:  # a meta key of the wrong type: the claim reports it
        log.warning("queue %s: cannot record its retention (%s)", queue.name, exc)


async def trim(queue: QueueLike, retention: Retention, *, max_batches: int | None = None) -> int:
    """One retention sweep: remove finished jobs past their period or their count.

    Each script call removes at most ``retention.batch`` jobs (each call stays
    short), and the sweep calls on until nothing is left to remove, or
    ``max_batches`` calls per state: its capacity grows with the backlog, so
    a sweep keeps up whatever the rate jobs finish at.
    """
    total = 0
    for state, (keep_ms, most) in retention.bounds().items():
        if keep_ms is None and most is None:
            continue
        calls = 0
        while max_batches is None or calls < max_batches:
            calls += 1
            removed, more = await _purge_batch(queue, state, keep_ms, retention.batch, most=most)
            total += removed
            if not more:
                break
    return total


"""The oldest Redis a worker starts on.

The scripts need streams (the journals) and scripts replicated by their
effects, so that a script may read ``TIME`` and then write (default since
5.0); 6.2 is the oldest release we accept because older ones are end of life
and untested with these scripts.
"""
