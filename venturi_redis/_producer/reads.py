"""Reading a queue: ``QueueStats`` and ``stats``, ``counts``, ``list_jobs``, the server's clock.

The ``Queue`` methods of the same names (and the CLI's ``stats`` and ``jobs``)
call these. Reads only, pipelines of plain commands anyone can repeat with
``redis-cli`` (docs/redis-layout.md); writes are ``ops.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._model.enums import PRIORITIES_HIGH_FIRST, DeadReason, JobState
from .._model.errors import ConfigurationError
from .._model.records import JobInfo, WorkerInfo, ms_to_dt
from .base import _text, server_now_ms
from .retention import FINISHED, FinishedState, bounds_of_field, trim_behind

if TYPE_CHECKING:
    from .._store.keys import QueueKeys
    from .base import ClientLike, QueueLike


_PAGE = 200

# What ``list_jobs(state=...)`` lists besides the job states: views of the
# pending jobs, each read from an index of its own (docs/redis-layout.md).
# ``retrying``: pending because the last run failed (the ``retrying`` index);
# ``delayed``: eligible later (a delay, a retry's backoff, a pause); ``limited``:
# eligible but parked on a limit (flow control).
VIEWS = ("retrying", "delayed", "limited")
LISTINGS = (*(s.value for s in JobState), *VIEWS)


def listing(state: JobState | str | None) -> JobState | str | None:
    """``state`` as ``list_jobs`` takes it: a ``JobState``, one of ``VIEWS``, or None (all)."""
    if state is None or isinstance(state, JobState) or state in VIEWS:
        return state
    try:
        return JobState(state)
    except ValueError:
        raise ConfigurationError(f"unknown state {state!r}: use one of {', '.join(LISTINGS)}") from None


def _atomic_pipeline(client: ClientLike) -> Any:
    """A MULTI pipeline; on Redis Cluster a plain one (every key of a queue is
    in one slot, but a cluster client pipelines without MULTI)."""
    clustered = hasattr(client.redis, "nodes_manager")
    return client.redis.pipeline(transaction=not clustered)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue at one instant (read in a single MULTI, so the numbers agree).

    Attributes:
        queue: The queue name.
        paused: Whether claims are paused (``queue.pause()``).
        pending: Jobs eligible now, per priority label, highest first.
        delayed: Pending jobs eligible later (delayed, retry backoff, paused runs).
        running: Jobs holding a lease.
        suspended: Jobs waiting for ``queue.resume``.
        completed: Completed jobs still retained.
        dead: Dead jobs still retained.
        cancelled: Cancelled jobs still retained.
        lag_seconds: Age of the oldest eligible job (0 when none is waiting).
        completed_last_minute: Completions within the last 60 seconds.
        at: The server time the numbers were read at.
        waiting: Jobs waiting for other jobs to finish (workflows).
        limited: Jobs eligible but waiting on a limit (flow control:
            ``queue.set_limit``), not counted in ``pending``.
        retrying: Pending jobs whose last run failed, waiting for their
            retry (counted in ``pending`` or ``delayed`` as well).
        trim_lag_seconds: How long the oldest finished job has been past its
            state's retention period (0 while trimming keeps up), against the
            ``vr.Retention`` the workers record (the defaults before one has).
        over_retention: Finished jobs past their state's count bound
            (``max_completed``...), not yet trimmed.
        ordered: Pending jobs waiting on their order key (behind an earlier
            job of the key, or on a paused key), not counted in ``pending``
            (``queue.counts()["ordered"]``).
    """

    queue: str
    paused: bool
    pending: dict[str, int]
    delayed: int
    running: int
    suspended: int
    completed: int
    dead: int
    cancelled: int
    lag_seconds: float
    completed_last_minute: int
    at: datetime = field(compare=False)
    waiting: int = 0
    limited: int = 0
    retrying: int = 0
    trim_lag_seconds: float = 0.0
    over_retention: int = 0
    ordered: int = 0

    @property
    def eligible(self) -> int:
        """Jobs eligible now, all priorities."""
        return sum(self.pending.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``venturi stats --json``)."""
        return {
            "queue": self.queue,
            "paused": self.paused,
            "pending": dict(self.pending),
            "eligible": self.eligible,
            "delayed": self.delayed,
            "running": self.running,
            "suspended": self.suspended,
            "completed": self.completed,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "lag_seconds": self.lag_seconds,
            "completed_last_minute": self.completed_last_minute,
            "limited": self.limited,
            "ordered": self.ordered,
            "retrying": self.retrying,
            "at": self.at.isoformat(),
            "waiting": self.waiting,
            "trim_lag_seconds": self.trim_lag_seconds,
            "over_retention": self.over_retention,
        }


async def get_job(queue: QueueLike, job_id: str) -> JobInfo | None:
    """``queue.get``: the job's hash, and (workflows) the jobs it waits on and that wait
    on it, in one transaction. A damaged graph set (not a set) is shown in ``corrupt``
    instead of failing the read (issue 38: reads never fail on corrupt data)."""
    k = queue.keys
    pipe = queue.client.redis.pipeline(transaction=True)
    pipe.hgetall(k.job(job_id))
    pipe.smembers(k.deps(job_id))
    pipe.smembers(k.dependents(job_id))
    raw, waiting_on, dependents = await pipe.execute(raise_on_error=False)
    if isinstance(raw, Exception):
        raise raw
    if not raw:
        return None
    info = JobInfo.from_hash(queue.name, job_id, raw, encryption=queue.client.encryption)
    if info.state is JobState.DEAD and info.dead_reason is None and b"dead_reason" not in raw:
        # Dead under a release before 0.2: the reason is in its journal's `dead` entry.
        info = replace(info, dead_reason=await _legacy_dead_reason(queue, job_id))
    corrupt = dict(info.corrupt)
    sets: dict[str, tuple[str, ...]] = {}
    for name, key, members in (
        ("waiting_on", k.deps(job_id), waiting_on),
        ("dependents", k.dependents(job_id), dependents),
    ):
        if isinstance(members, Exception):
            corrupt[name] = f"{key} is not a set"
        elif members:
            sets[name] = tuple(sorted(_text(x) for x in members))
    if sets or corrupt != info.corrupt:
        info = replace(info, corrupt=corrupt, **sets)  # type: ignore[arg-type]
    if info.order_key is not None and info.state not in _FINISHED:
        info = replace(info, order_position=await _order_position(queue, job_id, info.order_key, raw))
    return info


_FINISHED = frozenset({JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED})
_ORDER_SEP = b"\xff"  # between an order key and its sequence in order:queue (lua/include/order.lua)


async def _order_position(queue: QueueLike, job_id: str, key: str, raw: dict[bytes, bytes]) -> int | None:
    """Where the job stands in its order key's line: 0 holding it, N with N jobs ahead.

    One read, only for a job with an order key: ``ZLEXCOUNT`` of its key's
    members before its own in ``order:queue`` (the waiting ones, in enqueue
    order), plus the holder; or, for a job not waiting, whether it holds the
    key. None when the keys say neither (damaged, or changed meanwhile).
    """
    r = queue.client.redis
    member = raw.get(b"ordered")
    try:
        if member:
            ahead = await r.zlexcount(queue.keys.order_queue, b"[" + key.encode() + _ORDER_SEP, b"(" + member)
            return int(ahead) + 1
        holder = await r.hget(queue.keys.order_held, key)
    except ResponseError:  # a damaged order key (WRONGTYPE): the job's page still shows
        return None
    return 0 if holder is not None and _text(holder) == job_id else None


async def _legacy_dead_reason(queue: QueueLike, job_id: str) -> DeadReason | None:
    for _, fields in await queue.client.redis.xrevrange(queue.keys.journal(job_id), count=20):
        if fields.get(b"event") == b"dead":
            return DeadReason.of(_text(fields.get(b"reason")))
    return None


async def stats(queue: QueueLike) -> QueueStats:
    """Counts, lag and throughput of ``queue`` (see ``QueueStats``)."""
    now = await server_now_ms(queue.client)
    pipe = _atomic_pipeline(queue.client)
    stats_commands(pipe, queue, now)
    return stats_from(queue, now, await pipe.execute())


# What stats_commands queues on a pipeline: stats_from reads that many replies
# (COUNT_COMMANDS without the trim lag's reads: the dashboard's refresh).
STATS_COMMANDS = 27
COUNT_COMMANDS = 23


def stats_commands(pipe: Any, queue: QueueLike, now: int, *, trim_lag: bool = True) -> None:
    """Queue the ``STATS_COMMANDS`` reads of ``stats`` on ``pipe`` (the dashboard's
    overview adds them to a pipeline of its own); ``stats_from`` reads their replies."""
    k = queue.keys
    for p in PRIORITIES_HIGH_FIRST:
        pipe.zcount(k.pending(p), "-inf", now)
        pipe.zcount(k.pending(p), f"({now}", "+inf")
        pipe.zrangebyscore(k.pending(p), "-inf", now, start=0, num=1, withscores=True)
    for key in (k.running, k.suspended, k.completed, k.dead, k.cancelled):
        pipe.zcard(key)
    pipe.zcount(k.completed, now - 60_000, "+inf")
    pipe.hget(k.meta, "paused")
    pipe.zcard(k.waiting)
    pipe.zcard(k.limits_parked)
    pipe.zcard(k.retrying)
    pipe.zcard(k.order_queue)
    if trim_lag:
        # Trimming's progress: each finished set's oldest, and the retention the workers record.
        for key in (k.completed, k.dead, k.cancelled):
            pipe.zrange(key, 0, 0, withscores=True)
        pipe.hget(k.meta, "retention")


def stats_from(queue: QueueLike, now: int, res: list[Any], *, trim_lag: bool = True) -> QueueStats:
    """The ``QueueStats`` of the replies to ``stats_commands`` (read at ``now``, with
    the trim lag's reads or without them: then ``trim_lag_seconds`` and ``over_retention`` are 0)."""
    pending: dict[str, int] = {}
    delayed = 0
    oldest: float | None = None
    for i, p in enumerate(PRIORITIES_HIGH_FIRST):
        eligible, later, head = res[3 * i : 3 * i + 3]
        pending[p.label] = int(eligible)
        delayed += int(later)
        if head:
            score = float(head[0][1])
            oldest = score if oldest is None else min(oldest, score)
    counts = res[12:COUNT_COMMANDS]
    (
        running,
        suspended,
        completed,
        dead,
        cancelled,
        last_minute,
        paused,
        waiting,
        limited,
        retrying,
        ordered,
    ) = counts
    held: dict[FinishedState, int] = {
        "completed": int(completed),
        "dead": int(dead),
        "cancelled": int(cancelled),
    }
    lag, over = 0.0, 0
    if trim_lag:
        heads = zip(FINISHED, res[COUNT_COMMANDS : COUNT_COMMANDS + 3], strict=True)
        oldest_finished: dict[FinishedState, float | None] = {
            state: float(head[0][1]) if head else None for state, head in heads
        }
        lag, over = trim_behind(bounds_of_field(res[COUNT_COMMANDS + 3]), now, held, oldest_finished)
    return QueueStats(
        queue=queue.name,
        paused=_text(paused) == "1",
        pending=pending,
        delayed=delayed,
        running=int(running),
        suspended=int(suspended),
        completed=int(completed),
        dead=int(dead),
        cancelled=int(cancelled),
        lag_seconds=max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0,
        completed_last_minute=int(last_minute),
        at=ms_to_dt(now),
        waiting=int(waiting),
        limited=int(limited),
        retrying=int(retrying),
        trim_lag_seconds=max(0.0, lag),
        over_retention=over,
        ordered=int(ordered),
    )


async def counts(client: ClientLike, queues: Sequence[QueueKeys]) -> dict[str, int]:
    """Jobs per state of ``queues`` (one queue, or a sharded queue's partitions), summed.

    ``pending:<level>`` for each priority, ``limited`` (pending jobs parked on
    a limit), ``ordered`` (pending jobs waiting on their order key, behind an
    earlier job of it or on a paused key), ``pending`` (the sum of those), ``delayed`` (pending, eligible
    later), ``retrying`` (pending after a failed run), then ``waiting``,
    ``running``, ``suspended``, ``completed``, ``dead`` and ``cancelled``.
    One ZCARD or ZCOUNT per index (O(1), O(log n)), in one round trip after
    the clock is read: nothing walks a set.
    """
    now = await server_now_ms(client)
    pipe = client.redis.pipeline(transaction=False)
    for k in queues:
        for key in k.pending_high_first:
            pipe.zcard(key)
        for key in k.pending_high_first:
            pipe.zcount(key, f"({now}", "+inf")
        for key in (
            k.limits_parked,
            k.order_queue,
            k.retrying,
            k.waiting,
            k.running,
            k.suspended,
            k.completed,
        ):
            pipe.zcard(key)
        pipe.zcard(k.dead)
        pipe.zcard(k.cancelled)
    res = [int(n) for n in await pipe.execute()]
    names = [f"pending:{p.label}" for p in PRIORITIES_HIGH_FIRST] + ["delayed"] * 4
    names += [
        "limited",
        "ordered",
        "retrying",
        "waiting",
        "running",
        "suspended",
        "completed",
        "dead",
        "cancelled",
    ]
    total = dict.fromkeys(names, 0)
    for i, n in enumerate(res):
        total[names[i % len(names)]] += n
    out = {f"pending:{p.label}": total[f"pending:{p.label}"] for p in PRIORITIES_HIGH_FIRST}
    out["limited"] = total["limited"]
    out["ordered"] = total["ordered"]
    out["pending"] = sum(out.values())
    for name in ("delayed", "retrying", "waiting", "running", "suspended", "completed", "dead", "cancelled"):
        out[name] = total[name]
    return out


@dataclass(frozen=True, slots=True)
class _Source:
    """One index ``list_jobs`` reads: its key, its order, and how to read it."""

    key: str
    state: JobState
    newest_first: bool = False
    # Only the members scored above this (``delayed``: eligible after now).
    above: int | None = None
    # The members are ``<kind>\t<key>\t<level><id>`` (limits:parked).
    parked: bool = False
    # An entry whose job is no longer pending is skipped (``retrying``: the
    # claim cancelled or quarantined it, purge has not removed it yet).
    pending_only: bool = False


async def _sources(queue: QueueLike, state: JobState | str) -> list[_Source]:
    """The indexes of ``state`` (a JobState or one of ``VIEWS``), in listing order."""
    k = queue.keys
    pending = JobState.PENDING
    if state == "retrying":
        return [_Source(k.retrying, pending, pending_only=True)]
    if state == "delayed":
        now = await server_now_ms(queue.client)
        return [_Source(key, pending, above=now) for key in k.pending_high_first]
    if state == "limited":
        return [_Source(k.limits_parked, pending, parked=True)]
    if state is pending:
        # Then the jobs parked on a limit (flow control), by kind, key, priority.
        return [
            *(_Source(key, pending) for key in k.pending_high_first),
            _Source(k.limits_parked, pending, parked=True),
        ]
    key, newest_first = index_of(k, JobState(state))
    return [_Source(key, JobState(state), newest_first)]


def index_of(k: QueueKeys, state: JobState) -> tuple[str, bool]:
    """The index zset of ``state`` (any but pending: its jobs are in one set per priority),
    and whether a listing reads it newest first (the finished states do); ``list_jobs``
    and the dashboard's pages list from it."""
    return {
        JobState.WAITING: (k.waiting, False),
        JobState.RUNNING: (k.running, False),
        JobState.SUSPENDED: (k.suspended, False),
        JobState.COMPLETED: (k.completed, True),
        JobState.DEAD: (k.dead, True),
        JobState.CANCELLED: (k.cancelled, True),
    }[state]


async def _page(queue: QueueLike, src: _Source, start: int) -> list[Any]:
    redis = queue.client.redis
    if src.above is not None:
        return list(await redis.zrangebyscore(src.key, f"({src.above}", "+inf", start=start, num=_PAGE))
    read = redis.zrevrange if src.newest_first else redis.zrange
    return list(await read(src.key, start, start + _PAGE - 1))


async def list_jobs(
    queue: QueueLike,
    *,
    state: JobState | str | None = None,
    kind: str | None = None,
    limit: int = 50,
) -> list[JobInfo]:
    """Jobs of ``queue`` read from its index zsets, at most ``limit``.

    Order: pending by priority then eligibility (then those parked on a
    limit, by kind, key and priority); running by lease expiry;
    suspended by suspension time; finished states newest first. Without
    ``state`` every state is listed in that order (pending first). ``kind``
    filters on the job's KIND (read from each hash, page by page).

    ``state`` may also be one of ``VIEWS``, each a part of the pending jobs:
    ``"retrying"`` (the last run failed; next retry first), ``"delayed"``
    (eligible later; by priority, then eligibility) or ``"limited"``
    (parked on a limit; by kind, key and priority).

    Raises:
        ConfigurationError: ``state`` is none of those, or ``limit`` < 1.
    """
    if limit < 1:
        raise ConfigurationError(f"limit must be >= 1, got {limit}")
    wanted = listing(state)
    states: list[JobState | str] = [wanted] if wanted is not None else list(JobState)
    redis = queue.client.redis
    out: list[JobInfo] = []
    for st in states:
        for src in await _sources(queue, st):
            start = 0
            while len(out) < limit:
                page = await _page(queue, src, start)
                if not page:
                    break
                pipe = redis.pipeline(transaction=False)
                ids = [_text(raw_id) for raw_id in page]
                if src.parked:  # members <kind>\t<key>\t<level><id>
                    ids = [member.rsplit("\t", 1)[-1][1:] for member in ids]
                for job_id in ids:
                    pipe.hgetall(queue.keys.job(job_id))
                # One unreadable job key (wrong type) must not fail the listing.
                for job_id, raw in zip(ids, await pipe.execute(raise_on_error=False), strict=True):
                    if isinstance(raw, Exception):
                        if kind is None:
                            out.append(JobInfo.unreadable(queue.name, job_id, src.state, str(raw)))
                    # A hash may be gone (purged between the two reads): skip it.
                    elif (
                        raw
                        and (kind is None or _text(raw.get(b"kind")) == kind)
                        and (not src.pending_only or raw.get(b"state") == b"pending")
                    ):
                        out.append(
                            JobInfo.from_hash(
                                queue.name,
                                job_id,
                                raw,
                                indexed_as=src.state,
                                encryption=queue.client.encryption,
                            )
                        )
                    if len(out) >= limit:
                        break
                if len(page) < _PAGE:
                    break
                start += _PAGE
            if len(out) >= limit:
                return out
    return out


async def list_workers(queue: QueueLike) -> list[WorkerInfo]:
    """The workers registered on ``queue`` and not expired, by name (``_worker/registry.py``).

    Two commands: the names, then their records (one MGET, one slot). A name
    whose record expired (its worker stopped heartbeating) is not listed.
    """
    redis = queue.client.redis
    names = [_text(n) for n in await redis.zrange(queue.keys.workers, 0, -1)]
    if not names:
        return []
    raws = await redis.mget([queue.keys.worker(n) for n in names])
    found = [WorkerInfo.from_json(raw) for raw in raws if raw is not None]
    return sorted((w for w in found if w is not None), key=lambda w: w.name)
