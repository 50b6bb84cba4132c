"""What the dashboard shows, read through the Queue's read API (and plain reads beside it).

Everything here returns plain data (dicts and dataclasses) that both the HTML
pages and the JSON routes render; nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._model.enums import JobState
from .._model.limits import LimitInfo
from .._model.records import JobInfo, JournalEntry, WorkerInfo, ms_to_dt
from .._model.redact import redact
from .._model.schedule import ScheduleInfo
from .._producer.discovery import discover_queues
from .._producer.reads import QueueStats
from .._store.keys import dedup_field, validate_name

if TYPE_CHECKING:
    from .._model.task import Task
    from .._producer.client import Client, Queue

log = logging.getLogger("venturi_redis.dashboard")
JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")

# The throughput chart: one bar per minute over the last hour.
CHART_MINUTES = 60
# Workers are seen through the jobs they hold or held: the lease owner of
# every running job (up to this many) and of the most recently finished ones.
_WORKER_SAMPLE = 100
_DEDUP_SCAN_LIMIT = 100_000
# A search lists at most this many jobs, and reads the dedup field of at most
# this many of the newest jobs of each state but pending.
_FOUND_LIMIT = 20
_RECENT = 1_000


def valid_queue_name(name: str) -> bool:
    try:
        validate_name(name)
    except Exception:  # noqa: BLE001 - any refusal means "no such queue"
        return False
    return True


@dataclass(frozen=True, slots=True)
class Throughput:
    """Completions and deaths per minute, oldest minute first."""

    completed: list[int]
    dead: list[int]
    since: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since.isoformat(), "completed": self.completed, "dead": self.dead}


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One row of the overview: the queue's stats, its last hour, its workers."""

    stats: QueueStats
    throughput: Throughput
    workers: dict[str, datetime] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.stats.to_dict(),
            "throughput_per_minute": self.throughput.to_dict(),
            "workers": {w: at.isoformat() for w, at in sorted(self.workers.items())},
        }


async def queue_exists(queue: Queue) -> bool:
    """Whether ``queue`` has any index zset, a meta hash, a schedule or a worker (what discovery finds)."""
    from .._store.keys import QueueKeys

    k: QueueKeys = queue.keys
    keys = [
        *k.pending_high_first,
        k.waiting,
        k.limits_parked,
        k.running,
        k.suspended,
        k.completed,
        k.dead,
        k.cancelled,
        k.meta,
        k.schedules,
        k.workers,
    ]
    return int(await queue.client.redis.exists(*keys)) > 0


async def overview(queue: Queue) -> QueueOverview:
    """Stats (``queue.stats()``), the last hour per minute, and the workers seen."""
    stats = await queue.stats()
    now = int(stats.at.timestamp() * 1000)
    # Whole minutes, the current one last: bar i covers [t_i, t_i + 60 s).
    end = now - now % 60_000 + 60_000
    begin = end - CHART_MINUTES * 60_000
    redis = queue.client.redis
    pipe = redis.pipeline(transaction=False)
    for key in (queue.keys.completed, queue.keys.dead):
        for i in range(CHART_MINUTES):
            lo = begin + i * 60_000
            pipe.zcount(key, lo, f"({lo + 60_000}")
    pipe.zrange(queue.keys.running, 0, _WORKER_SAMPLE - 1)
    pipe.zrevrange(queue.keys.completed, 0, _WORKER_SAMPLE - 1, withscores=True)
    pipe.zrevrange(queue.keys.dead, 0, _WORKER_SAMPLE - 1, withscores=True)
    res = await pipe.execute()
    counts = [int(n) for n in res[: 2 * CHART_MINUTES]]
    running_ids, completed, dead = res[2 * CHART_MINUTES :]
    seen: dict[str, datetime] = {}
    ids = [_text(j) for j in running_ids]
    finished = sorted(((float(s), _text(j)) for j, s in [*completed, *dead]), reverse=True)
    finished = finished[:_WORKER_SAMPLE]
    if ids or finished:
        pipe = redis.pipeline(transaction=False)
        for job_id in [*ids, *(j for _, j in finished)]:
            pipe.hget(queue.keys.job(job_id), "lease_owner")
        owners = await pipe.execute(raise_on_error=False)
        for i, owner in enumerate(owners):
            if not owner or isinstance(owner, Exception):
                continue
            at = stats.at if i < len(ids) else ms_to_dt(finished[i - len(ids)][0])
            name = _text(owner)
            if name not in seen or seen[name] < at:
                seen[name] = at
    return QueueOverview(
        stats=stats,
        throughput=Throughput(
            completed=counts[:CHART_MINUTES], dead=counts[CHART_MINUTES:], since=ms_to_dt(begin)
        ),
        workers=seen,
    )


class Discovery:
    """The queue names, found by SCAN (as ``venturi stats`` finds them), kept ``interval`` seconds.

    SCAN walks the whole keyspace: with a million jobs that is a thousand
    round trips, too much to repeat on every 5-second refresh of every open
    overview. Names are found again once ``interval`` has passed, in the
    background (the refresh that notices shows the names it has); the counts
    of the known queues are read fresh every time.
    """

    def __init__(self, client: Client, interval: float) -> None:
        self.client = client
        self.interval = interval
        self._names: list[str] = []
        self._at: float | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def names(self) -> list[str]:
        """The names found last; the first call waits for the SCAN, later ones
        never do: once stale, the names are found again in the background."""
        if self._at is None or self.interval <= 0:
            await self._scan()
        elif time.monotonic() - self._at >= self.interval and self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._scan_in_background())
        return self._names

    async def _scan(self) -> None:
        self._at = time.monotonic()
        self._names = await discover_queues(self.client)

    async def _scan_in_background(self) -> None:
        try:
            await self._scan()
        except Exception as exc:  # noqa: BLE001 - logged; the next refresh tries again
            log.warning("dashboard: finding the queues failed: %s", exc)
        finally:
            self._refresh = None


async def all_queues(client: Client, discovery: Discovery) -> tuple[list[QueueOverview], dict[str, str]]:
    """Every queue found (``discovery``), with its overview, and the queues that cannot be read.

    A queue with a key of the wrong type (written by hand) answers WRONGTYPE;
    it is returned by name with Redis's error, and the other queues are still
    shown (as ``venturi stats`` does).
    """
    rows: list[QueueOverview] = []
    broken: dict[str, str] = {}
    for name in await discovery.names():
        try:
            rows.append(await overview(client.queue(name)))
        except ResponseError as exc:
            broken[name] = str(exc)[:300]
    return rows, broken


async def find_by_dedup(queue: Queue, key: str, kind: str | None) -> list[str]:
    """Ids of the jobs holding dedup key ``key`` (of ``kind``, when given): the
    pending one first, then recent jobs in the other states.

    The dedup hash holds one field per *pending* deduplicated job: with a kind
    that is one ``HGET``; without, an ``HSCAN`` of it, bounded. A job that has
    left pending (running, suspended, waiting, finished) keeps its dedup field
    only in its own hash, with no index over it: the newest ``_RECENT`` ids of
    each other state's index are read and their ``dedup`` field compared, so a
    search costs a bounded number of reads however large the queue.
    """
    redis = queue.client.redis
    out: list[str] = []
    if kind:
        job_id = await redis.hget(queue.keys.dedup, dedup_field(kind, key))
        out += [_text(job_id)] if job_id else []
    else:
        suffix = ":" + key
        seen = 0
        async for name, value in redis.hscan_iter(
            queue.keys.dedup, match="*" + _glob_escape(suffix), count=1000
        ):
            seen += 1
            if _dedup_matches(_text(name), key, None):
                out.append(_text(value))
            if seen >= _DEDUP_SCAN_LIMIT or len(out) >= _FOUND_LIMIT:
                break
    return out + await _recent_by_dedup(queue, key, kind, _FOUND_LIMIT - len(out))


async def _recent_by_dedup(queue: Queue, key: str, kind: str | None, room: int) -> list[str]:
    if room <= 0:
        return []
    k = queue.keys
    redis = queue.client.redis
    pipe = redis.pipeline(transaction=False)
    for index in (k.running, k.suspended, k.waiting, k.dead, k.completed, k.cancelled):
        pipe.zrevrange(index, 0, _RECENT - 1)
    ids = [_text(j) for got in await pipe.execute() for j in got]
    if not ids:
        return []
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(k.job(job_id), "dedup")
    fields = await pipe.execute(raise_on_error=False)
    out: list[str] = []
    for job_id, value in zip(ids, fields, strict=True):
        if value and not isinstance(value, Exception) and _dedup_matches(_text(value), key, kind):
            out.append(job_id)
            if len(out) >= room:
                break
    return out


def _dedup_matches(field_name: str, key: str, kind: str | None) -> bool:
    """Whether a dedup field, ``"<len(kind)>:<kind>:<key>"``, holds ``key`` (and ``kind``)."""
    head, _, rest = field_name.partition(":")
    if not head.isdigit():
        return False
    n = int(head)
    return rest[n + 1 :] == key and rest[n : n + 1] == ":" and (kind is None or rest[:n] == kind)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


@dataclass(frozen=True, slots=True)
class Redaction:
    """How stored documents are shown: every value masked (the default), or shown
    with the sensitive fields of the known task classes masked."""

    show_values: bool = False
    sensitive: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, show_values: bool, tasks: Sequence[type[Task[Any]]]) -> Redaction:
        return cls(show_values, {t.kind(): frozenset(t.sensitive_fields()) for t in tasks})

    def doc(self, kind: str, value: Any) -> Any:
        """``value`` (a payload, carry, result, output or attachment) as it may be shown."""
        if not self.show_values:
            return redact(value)
        hidden = self.sensitive.get(kind)
        return redact(value, hidden) if hidden else value


def job_dict(info: JobInfo, redaction: Redaction) -> dict[str, Any]:
    """A job as JSON-ready data, documents redacted."""
    out: dict[str, Any] = {
        "id": info.id,
        "queue": info.queue,
        "kind": info.kind,
        "state": info.state.value,
        "priority": info.priority.label,
        "run_count": info.run_count,
        "failures": info.failures,
        "eligible_at": info.eligible_at,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "finished_at": info.finished_at,
        "note": info.note,
        "lease_owner": info.lease_owner,
        "lease_expires_at": info.lease_expires_at,
        "dedup": info.dedup,
        "corrupt": dict(info.corrupt),
        "waiting_on": list(info.waiting_on),
        "dependents": list(info.dependents),
        # Reported by the handler (ctx.report_progress): shown as it is, like the note.
        "progress": info.progress,
        "schedule_id": info.schedule_id,
        "fire_at": info.fire_at,
    }
    for name in ("payload", "carry", "attachment", "result", "output"):
        out[name] = redaction.doc(info.kind, getattr(info, name))
    doc: dict[str, Any] = jsonable(out)
    return doc


def schedule_dict(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as JSON-ready data (its task's payload is never read)."""
    doc: dict[str, Any] = jsonable(
        {
            "id": info.id,
            "kind": info.kind,
            "cron": info.cron,
            "every": info.every,
            "tz": info.tz,
            "next_at": info.next_at,
            "last_at": info.last_at,
            "last_job_id": info.last_job_id,
            "paused": info.paused,
            "task_kind": info.task_kind,
            "priority": info.priority.label,
            "start_at": info.start_at,
            "end_at": info.end_at,
            "fires": info.fires,
            "note": info.note,
            "corrupt": info.corrupt,
        }
    )
    return doc


def worker_dict(info: WorkerInfo) -> dict[str, Any]:
    """A registered worker (``queue.workers()``) as JSON-ready data."""
    doc: dict[str, Any] = jsonable(
        {
            "name": info.name,
            "host": info.host,
            "pid": info.pid,
            "queues": list(info.queues),
            "concurrency": info.concurrency,
            "running": info.running,
            "started_at": info.started_at,
            "heartbeat_at": info.heartbeat_at,
            "version": info.version,
        }
    )
    return doc


def limit_dict(info: LimitInfo) -> dict[str, Any]:
    """A limit as JSON-ready data; ``rate`` as ``{"count", "per_seconds"}`` (or null).

    A per-key limit's ``keys`` are its busiest keys (``key`` null: the jobs
    without a key) and ``keys_total`` how many keys are busy (null: too many
    to count cheaply).
    """
    rate = None if info.rate is None else {"count": info.rate.count, "per_seconds": info.rate.seconds}
    return {
        "kind": info.kind,
        "per_key": info.per_key,
        "concurrency": info.concurrency,
        "rate": rate,
        "running": info.running,
        "waiting": info.waiting,
        "keys": [{"key": x.key, "running": x.running, "waiting": x.waiting} for x in info.keys],
        "keys_total": info.keys_total,
    }


def entry_dict(entry: JournalEntry, kind: str, redaction: Redaction) -> dict[str, Any]:
    doc: dict[str, Any] = jsonable(
        {
            "id": entry.id,
            "at": entry.at,
            "event": entry.event,
            "run": entry.run,
            "note": entry.note,
            "attachment": redaction.doc(kind, entry.attachment),
            "details": dict(entry.details),
            "corrupt": dict(entry.corrupt),
        }
    )
    return doc


def jsonable(value: Any) -> Any:
    """``value`` with datetimes, enums and bytes made JSON types (bytes as base64)."""
    if isinstance(value, Mapping):
        return {str(k if not isinstance(k, bytes) else _text(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def parse_state(value: str | None) -> JobState | None:
    """``?state=`` as a JobState; empty means every state. Raises ValueError."""
    if not value:
        return None
    return JobState(value)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
