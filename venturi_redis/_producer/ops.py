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
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from redis.exceptions import ResponseError

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError, CorruptQueueError
from .._store.keys import WAKE_CAP
from .._store.store import FINISHED_STATES, Retained, Retried, corrupt_job
from .reads import _text, server_now_ms

if TYPE_CHECKING:
    from .base import QueueLike

FinishedState = Literal["completed", "dead", "cancelled"]

CancelResult = Literal["cancelled", "requested", "not_found", "finished"]

_RETRY_BATCH = 100

_PURGE_BATCH = 100
# A retention batch is one script call, which holds Redis while it runs: a
# larger one would stall every client (and 10**20 was no count Redis takes).
_PURGE_BATCH_MAX = 10_000

# One retention pass removes at most this many batches per state, so a worker
# that finds a large backlog (retention just lowered) spreads it over ticks.
_TRIM_MAX_BATCHES = 10

DAY = 86_400.0

log = logging.getLogger("venturi_redis.ops")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long, and how many, finished jobs stay in Redis before the workers remove them.

    Each period is seconds or a ``timedelta``, each count a whole number;
    ``None`` sets no such bound. Whichever bound a finished job passes first
    removes it, oldest first. Completed jobs are trimmed by the very script
    call that completes others (up to twice as many as it completes: trimming
    keeps pace at any rate); dead and cancelled ones on the workers' reclaim
    tick, as many batches as it takes. A removed job loses its hash, its
    journal and any index entry (docs/operations.md, "Sizing").

    Args:
        completed: Completed jobs' period (default one day).
        dead: Dead jobs', kept longer so someone can look at them (default 7 days).
        cancelled: Cancelled jobs' (default one day).
        max_completed: Most completed jobs kept (default 10,000).
        max_dead: Most dead jobs kept (default 10,000: Sidekiq's dead set).
        max_cancelled: Most cancelled jobs kept (default 10,000).
        batch: Jobs removed per script call of the tick's sweep (each call stays short).

    Raises:
        ConfigurationError: A period that is not a duration, a count that is
            not a whole number >= 0 (a bool included), a batch < 1.
    """

    completed: float | timedelta | None = DAY
    dead: float | timedelta | None = 7 * DAY
    cancelled: float | timedelta | None = DAY
    batch: int = _PURGE_BATCH
    max_completed: int | None = 10_000
    max_dead: int | None = 10_000
    max_cancelled: int | None = 10_000

    def __post_init__(self) -> None:
        for name in ("completed", "dead", "cancelled"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                to_ms(value, f"retention of {name} jobs")
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{exc}; use None to keep {name} jobs forever") from None
        for name in ("max_completed", "max_dead", "max_cancelled"):
            count = getattr(self, name)
            if count is not None and (type(count) is not int or not 0 <= count < 2**53):
                raise ConfigurationError(
                    f"retention {name} must be a whole number of jobs >= 0, or None for no bound, "
                    f"got {count!r}"
                )
        batch = self.batch
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= _PURGE_BATCH_MAX:
            raise ConfigurationError(
                f"retention batch must be a whole number from 1 to {_PURGE_BATCH_MAX:,}, got {batch!r}"
            )

    def periods_ms(self) -> dict[FinishedState, int]:
        """The finished states that are trimmed by age, with their period in ms."""
        out: dict[FinishedState, int] = {}
        if self.completed is not None:
            out["completed"] = to_ms(self.completed, "retention")
        if self.dead is not None:
            out["dead"] = to_ms(self.dead, "retention")
        if self.cancelled is not None:
            out["cancelled"] = to_ms(self.cancelled, "retention")
        return out

    def bounds(self) -> dict[FinishedState, tuple[int | None, int | None]]:
        """Each finished state's (period in ms, most kept), None for no such bound."""
        periods = self.periods_ms()
        counts: dict[FinishedState, int | None] = {
            "completed": self.max_completed,
            "dead": self.max_dead,
            "cancelled": self.max_cancelled,
        }
        states: tuple[FinishedState, ...] = ("completed", "dead", "cancelled")
        return {state: (periods.get(state), counts[state]) for state in states}

    def retained(self) -> Retained:
        """The bounds as the finishing scripts take them ('' for none)."""
        b = self.bounds()

        def arg(value: int | None) -> str:
            return "" if value is None else str(value)

        return Retained(
            arg(b["completed"][0]),
            arg(b["completed"][1]),
            arg(b["dead"][0]),
            arg(b["dead"][1]),
            arg(b["cancelled"][0]),
            arg(b["cancelled"][1]),
        )


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
    queue: QueueLike,
    *,
    kind: str | None = None,
    limit: int | None = None,
    note: str = "retried by an operator",
) -> list[str]:
    """Move dead jobs (oldest death first, optionally of one KIND) back to pending.

    Returns the ids moved. ``limit`` bounds how many; ``None`` retries all.
    A dead job whose own data is corrupt is left as it is, with a warning
    logged naming it and what is wrong; the others are moved.
    """
    return (await retry_dead_report(queue, kind=kind, limit=limit, note=note)).moved


async def retry_dead_report(
    queue: QueueLike,
    *,
    kind: str | None = None,
    limit: int | None = None,
    note: str = "retried by an operator",
) -> Retried:
    """``retry_dead`` with the refused jobs too (id -> what is wrong), for the CLI."""
    redis = queue.client.redis
    # Read the ids first (a snapshot), then move them in batches: the script
    # re-checks each one, so a job retried or purged meanwhile is skipped.
    ids: list[str] = []
    start = 0
    while True:
        page = [_text(x) for x in await redis.zrange(queue.keys.dead, start, start + 999)]
        if not page:
            break
        if kind is None:
            ids += page
        else:
            pipe = redis.pipeline(transaction=False)
            for jid in page:
                pipe.hget(queue.keys.job(jid), "kind")
            # A job key of the wrong type is an error in its own slot, not the
            # whole read's: that job is not of the kind, the others still are.
            kinds = await pipe.execute(raise_on_error=False)
            ids += [
                jid
                for jid, kd in zip(page, kinds, strict=True)
                if not isinstance(kd, Exception) and _text(kd) == kind
            ]
        if limit is not None and len(ids) >= limit:
            ids = ids[:limit]
            break
        if len(page) < 1000:
            break
        start += 1000
    out = Retried([], {})
    for i in range(0, len(ids), _RETRY_BATCH):
        got = await _retry_ids(queue, ids[i : i + _RETRY_BATCH], note)
        out.moved.extend(got.moved)
        out.refused.update(got.refused)
    return out


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
    applied, detail = await queue.store.cancel(job_id, note)
    if applied:
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


async def purge(queue: QueueLike, state: str, *, older_than: float | timedelta = 0.0) -> int:
    """Remove finished jobs of ``state`` (with journals) that finished ``older_than`` ago or more.

    Runs the purge script batch after batch until none is left; returns how
    many jobs were removed.
    """
    keep_ms = to_ms(older_than, "older_than")
    total = 0
    while True:
        removed, more = await _purge_batch(queue, state, keep_ms, _PURGE_BATCH)
        total += removed
        if not more:
            return total


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
