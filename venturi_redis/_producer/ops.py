"""Operating a queue: stats, listing, dead-letter retry, cancel, queue pause, purge, retention.

The CLI (``venturi``) only calls these, through the ``Queue`` methods that
delegate here. Every write is one Lua script (``cancel``, ``retry_dead``,
``purge``) or, for the queue pause flag, one ``HSET`` that the claim script
reads atomically; reads are pipelines of plain commands anyone can repeat
with ``redis-cli`` (docs/redis-layout.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from .._model.backoff import to_ms
from .._model.enums import PRIORITIES_HIGH_FIRST, JobState
from .._model.errors import ConfigurationError
from .._model.records import JobInfo, ms_to_dt
from .._store.keys import WAKE_CAP

if TYPE_CHECKING:
    from .client import Client, Queue

FinishedState = Literal["completed", "dead", "cancelled"]
CancelResult = Literal["cancelled", "requested", "not_found", "finished"]

_PAGE = 200
_RETRY_BATCH = 100
_PURGE_BATCH = 100
# One retention pass removes at most this many batches per state, so a worker
# that finds a large backlog (retention just lowered) spreads it over ticks.
_TRIM_MAX_BATCHES = 10
_JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")

DAY = 86_400.0


def _atomic_pipeline(client: Client) -> Any:
    """A MULTI pipeline; on Redis Cluster a plain one (every key of a queue is
    in one slot, but a cluster client pipelines without MULTI)."""
    clustered = hasattr(client.redis, "nodes_manager")
    return client.redis.pipeline(transaction=not clustered)


def _text(value: Any) -> str:
    if value is None or value is False:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs stay in Redis before the workers remove them.

    Each period is seconds or a ``timedelta``; ``None`` keeps such jobs forever.
    A removed job loses its hash, its journal and any index entry. Workers
    trim on their reclaim tick, in batches of ``batch`` jobs per script call.

    Args:
        completed: Completed jobs (default one day).
        dead: Dead jobs, kept longer so someone can look at them (default 7 days).
        cancelled: Cancelled jobs (default one day).
        batch: Jobs removed per script call (each call stays short).
    """

    completed: float | timedelta | None = DAY
    dead: float | timedelta | None = 7 * DAY
    cancelled: float | timedelta | None = DAY
    batch: int = _PURGE_BATCH

    def __post_init__(self) -> None:
        for name in ("completed", "dead", "cancelled"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                to_ms(value, f"retention of {name} jobs")
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{exc}; use None to keep {name} jobs forever") from None
        if self.batch < 1:
            raise ConfigurationError(f"retention batch must be >= 1, got {self.batch}")

    def periods_ms(self) -> dict[FinishedState, int]:
        """The finished states that are trimmed, with their period in ms."""
        out: dict[FinishedState, int] = {}
        if self.completed is not None:
            out["completed"] = to_ms(self.completed, "retention")
        if self.dead is not None:
            out["dead"] = to_ms(self.dead, "retention")
        if self.cancelled is not None:
            out["cancelled"] = to_ms(self.cancelled, "retention")
        return out


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
            "at": self.at.isoformat(),
        }


async def server_now_ms(client: Client) -> int:
    """The clock the scripts use: the client's own, else Redis TIME."""
    if client.clock is not None:
        return int(client.clock())
    sec, usec = await client.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def stats(queue: Queue) -> QueueStats:
    """Counts, lag and throughput of ``queue`` (see ``QueueStats``)."""
    k = queue.keys
    now = await server_now_ms(queue.client)
    pipe = _atomic_pipeline(queue.client)
    for p in PRIORITIES_HIGH_FIRST:
        pipe.zcount(k.pending(p), "-inf", now)
        pipe.zcount(k.pending(p), f"({now}", "+inf")
        pipe.zrangebyscore(k.pending(p), "-inf", now, start=0, num=1, withscores=True)
    for key in (k.running, k.suspended, k.completed, k.dead, k.cancelled):
        pipe.zcard(key)
    pipe.zcount(k.completed, now - 60_000, "+inf")
    pipe.hget(k.meta, "paused")
    res = await pipe.execute()
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
    running, suspended, completed, dead, cancelled, last_minute, paused = res[12:]
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
    )


def _state_keys(queue: Queue, state: JobState) -> list[tuple[str, bool]]:
    """The index zsets of ``state``, each with whether to list newest first."""
    k = queue.keys
    if state is JobState.PENDING:
        return [(key, False) for key in k.pending_high_first]
    return {
        JobState.RUNNING: [(k.running, False)],
        JobState.SUSPENDED: [(k.suspended, False)],
        JobState.COMPLETED: [(k.completed, True)],
        JobState.DEAD: [(k.dead, True)],
        JobState.CANCELLED: [(k.cancelled, True)],
    }[state]


async def list_jobs(
    queue: Queue,
    *,
    state: JobState | str | None = None,
    kind: str | None = None,
    limit: int = 50,
) -> list[JobInfo]:
    """Jobs of ``queue`` read from its index zsets, at most ``limit``.

    Order: pending by priority then eligibility; running by lease expiry;
    suspended by suspension time; finished states newest first. Without
    ``state`` every state is listed in that order (pending first). ``kind``
    filters on the job's KIND (read from each hash, page by page).
    """
    if limit < 1:
        raise ConfigurationError(f"limit must be >= 1, got {limit}")
    states = [JobState(state)] if state is not None else list(JobState)
    redis = queue.client.redis
    out: list[JobInfo] = []
    for st in states:
        for key, newest_first in _state_keys(queue, st):
            start = 0
            while len(out) < limit:
                stop = start + _PAGE - 1
                page = await (
                    redis.zrevrange(key, start, stop) if newest_first else redis.zrange(key, start, stop)
                )
                if not page:
                    break
                pipe = redis.pipeline(transaction=False)
                ids = [_text(raw_id) for raw_id in page]
                for job_id in ids:
                    pipe.hgetall(queue.keys.job(job_id))
                # One unreadable job key (wrong type) must not fail the listing.
                for job_id, raw in zip(ids, await pipe.execute(raise_on_error=False), strict=True):
                    if isinstance(raw, Exception):
                        if kind is None:
                            out.append(JobInfo.unreadable(queue.name, job_id, st, str(raw)))
                    # A hash may be gone (purged between the two reads): skip it.
                    elif raw and (kind is None or _text(raw.get(b"kind")) == kind):
                        out.append(JobInfo.from_hash(queue.name, job_id, raw, indexed_as=st))
                    if len(out) >= limit:
                        break
                if len(page) < _PAGE:
                    break
                start += _PAGE
            if len(out) >= limit:
                return out
    return out


async def retry(queue: Queue, job_id: str, *, note: str = "retried by an operator") -> bool:
    """Move one dead job back to pending (failures reset). False if it is not dead."""
    return bool(await _retry_ids(queue, [job_id], note))


async def _retry_ids(queue: Queue, ids: list[str], note: str) -> list[str]:
    k = queue.keys
    res = await queue.client.scripts.call(
        queue.client.redis,
        "retry_dead",
        [k.dead, k.dedup],
        [k.prefix, queue.client.now_arg(), k.wake, note, *ids],
    )
    return [_text(x) for x in res[1:]]


async def retry_dead(
    queue: Queue, *, kind: str | None = None, limit: int | None = None, note: str = "retried by an operator"
) -> list[str]:
    """Move dead jobs (oldest death first, optionally of one KIND) back to pending.

    Returns the ids moved. ``limit`` bounds how many; ``None`` retries all.
    """
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
            kinds = await pipe.execute()
            ids += [jid for jid, kd in zip(page, kinds, strict=True) if _text(kd) == kind]
        if limit is not None and len(ids) >= limit:
            ids = ids[:limit]
            break
        if len(page) < 1000:
            break
        start += 1000
    moved: list[str] = []
    for i in range(0, len(ids), _RETRY_BATCH):
        moved += await _retry_ids(queue, ids[i : i + _RETRY_BATCH], note)
    return moved


async def cancel(
    queue: Queue, job_id: str, *, note: str = "cancelled by an operator"
) -> tuple[CancelResult, str]:
    """Cancel a job; returns ``(result, detail)``.

    ``cancelled``: it was pending or suspended and is now cancelled.
    ``requested``: it is running; its worker asks the handler to stop (through
    ``ctx.cancelled()`` / ``ctx.is_cancelled()``) at its next lease renewal and
    the run ends cancelled. ``not_found`` / ``finished``: nothing was done;
    ``detail`` says why.
    """
    k = queue.keys
    res = await queue.client.scripts.call(
        queue.client.redis,
        "cancel",
        [k.job(job_id), k.journal(job_id), k.suspended, k.running, k.cancelled, k.dedup],
        [job_id, queue.client.now_arg(), k.prefix, note, ""],
    )
    detail = _text(res[1])
    if int(res[0]) == 1:
        return ("cancelled" if detail == "cancelled" else "requested"), detail
    return ("not_found" if detail == "job does not exist" else "finished"), detail


async def pause(queue: Queue) -> None:
    """Stop every worker from claiming on this queue, from the moment this returns.

    The claim script reads the flag in the same atomic step as it claims, so
    no claim that starts after the HSET succeeds. Running jobs finish;
    enqueues still land (and wait).
    """
    now = await server_now_ms(queue.client)
    await queue.client.redis.hset(queue.keys.meta, mapping={"paused": "1", "paused_at": str(now)})


async def resume_queue(queue: Queue) -> None:
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
    await pipe.execute()


def _finished_key(queue: Queue, state: str) -> str:
    k = queue.keys
    keys = {"completed": k.completed, "dead": k.dead, "cancelled": k.cancelled}
    if state not in keys:
        raise ConfigurationError(
            f"can only purge finished jobs: state must be one of {sorted(keys)}, got {state!r}"
        )
    return keys[state]


async def _purge_batch(queue: Queue, state: str, keep_ms: int, batch: int) -> tuple[int, bool]:
    k = queue.keys
    res = await queue.client.scripts.call(
        queue.client.redis,
        "purge",
        [_finished_key(queue, state), k.dedup],
        [k.prefix, queue.client.now_arg(), keep_ms, state, batch],
    )
    return int(res[0]), int(res[1]) == 1


async def purge(queue: Queue, state: str, *, older_than: float | timedelta = 0.0) -> int:
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


async def trim(queue: Queue, retention: Retention, *, max_batches: int = _TRIM_MAX_BATCHES) -> int:
    """One retention pass: remove finished jobs older than their period.

    At most ``max_batches`` script calls per state, so one pass stays short;
    a backlog is finished by the following passes.
    """
    total = 0
    for state, keep_ms in retention.periods_ms().items():
        for _ in range(max_batches):
            removed, more = await _purge_batch(queue, state, keep_ms, retention.batch)
            total += removed
            if not more:
                break
    return total


# -- finding things without a queue name (CLI conveniences) -----------------------


async def find_job_queue(client: Client, job_id: str) -> str | None:
    """The queue holding job ``job_id``, by SCAN (walks the keyspace; give ``--queue`` when known)."""
    if not _JOB_ID_RE.fullmatch(job_id):
        raise ConfigurationError(f"{job_id!r} is not a job id (a ULID such as 01J9ZQ4K8V3M0S5B2N7XWYQ1RT)")
    pattern = f"{client.namespace}:{{*}}:job:{job_id}"
    async for key in client.redis.scan_iter(match=pattern, count=1000):
        return _queue_of(_text(key), client.namespace)
    return None


_SUFFIXES = ("pending:", "running", "suspended", "completed", "dead", "cancelled", "meta")


def _queue_of(key: str, namespace: str) -> str | None:
    head = f"{namespace}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}:", len(head))
    return key[len(head) : end] if end > 0 else None


async def discover_queues(client: Client) -> list[str]:
    """Names of the queues with any index zset or a meta hash.

    Two SCANs of the keyspace, filtered by the server (``TYPE zset`` skips the
    job hashes and journals), so only index keys cross the wire.
    """
    names: set[str] = set()
    pattern = f"{client.namespace}:{{*}}:*"
    scans = [
        client.redis.scan_iter(match=pattern, count=1000, _type="zset"),
        client.redis.scan_iter(match=f"{client.namespace}:{{*}}:meta", count=1000),
    ]
    for scan in scans:
        async for raw in scan:
            key = _text(raw)
            name = _queue_of(key, client.namespace)
            if name is None:
                continue
            rest = key[len(client.namespace) + len(name) + 4 :]
            if rest.startswith(_SUFFIXES):
                names.add(name)
    return sorted(names)


# -- start-up checks (Worker.run) ---------------------------------------------------

MIN_REDIS_VERSION = (6, 2, 0)
"""The oldest Redis a worker starts on.

The scripts need streams (the journals) and scripts replicated by their
effects, so that a script may read ``TIME`` and then write (default since
5.0); 6.2 is the oldest release we accept because older ones are end of life
and untested with these scripts.
"""


def _is_embedded(client: Client) -> bool:
    return client.url.startswith("memory://") or type(client.redis).__module__.startswith("fakeredis")


def _per_node(reply: Any) -> list[dict[Any, Any]]:
    """INFO / CONFIG GET replies: one dict, or (Redis Cluster) one dict per node."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return list(reply.values())
    return [reply] if isinstance(reply, dict) else []


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        parts.append(int(digits.group()) if digits else 0)
    return tuple(parts)


async def check_server(client: Client, *, eviction_policy: bool = True) -> None:
    """Refuse (ConfigurationError) a Redis too old for the scripts, or one that may evict jobs.

    The embedded ``memory://`` server always passes (it never evicts).
    ``eviction_policy=False`` skips the ``maxmemory-policy`` check (for a
    server whose CONFIG command is disabled, after checking the policy yourself).
    """
    from redis.exceptions import ResponseError

    if _is_embedded(client):
        return
    where = client.url or "the Redis server"
    minimum = ".".join(map(str, MIN_REDIS_VERSION))
    for info in _per_node(await client.redis.info("server")):
        version = _text(info.get("redis_version"))
        if version and _version(version) < MIN_REDIS_VERSION:
            raise ConfigurationError(
                f"{where} runs Redis {version}; venturi_redis needs Redis {minimum} or newer "
                "(its Lua scripts use streams and effect replication): upgrade the server"
            )
    if not eviction_policy:
        return
    try:
        reply = await client.redis.config_get("maxmemory-policy")
    except ResponseError as exc:
        raise ConfigurationError(
            f"cannot read maxmemory-policy on {where} ({exc}); make sure it is noeviction, "
            "then start the worker with Worker(..., check_eviction_policy=False) "
            "(venturi worker --no-eviction-check)"
        ) from None
    for cfg in _per_node(reply):
        policy = next((_text(v) for k, v in cfg.items() if _text(k) == "maxmemory-policy"), "")
        if policy and policy != "noeviction":
            raise ConfigurationError(
                f"{where} has maxmemory-policy {policy}: under memory pressure Redis would "
                "silently delete jobs. Set it with CONFIG SET maxmemory-policy noeviction (and in "
                "redis.conf), or override with Worker(..., check_eviction_policy=False) "
                "(venturi worker --no-eviction-check)"
            )
