"""What the dashboard shows, read through the Queue's read API (and plain reads beside it).

Everything here returns plain data (dicts and dataclasses) that both the HTML
pages and the JSON routes render; nothing here knows about HTTP.
"""

from __future__ import annotations

import base64
import enum
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._model import batch_note
from .._model.enums import JobState
from .._model.limits import LimitInfo
from .._model.records import JobInfo, JournalEntry, WorkerInfo
from .._model.redact import marked_fields, redact
from .._model.schedule import ScheduleInfo
from .._producer import bulk
from .._producer.reads import listing
from .._store.keys import dedup_field, validate_name

if TYPE_CHECKING:
    from .._model.task import Task
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.dashboard")
JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")

_DEDUP_SCAN_LIMIT = 100_000
# A search lists at most this many jobs, and reads the dedup field of at most
# this many of the newest jobs of each state but pending.
_FOUND_LIMIT = 20
_RECENT = 1_000


# The most dead jobs of one KIND the queue page counts for its "retry these N" (each
# counted job's kind is read: the count stops there and says "10,000+").
DEAD_COUNT_CAP = 10_000


async def dead_of_kind(queue: Queue, kind: str, at_ms: int) -> int:
    """How many jobs of ``kind`` were dead at ``at_ms`` (at most ``DEAD_COUNT_CAP``): the N of
    the queue page's "retry these N" (reads only, ``_producer/bulk.py``)."""
    return await bulk.count_matching(queue, "dead", bulk.Filter(kind=kind, limit=DEAD_COUNT_CAP), at_ms)


def valid_queue_name(name: str) -> bool:
    try:
        validate_name(name)
    except Exception:  # noqa: BLE001 - any refusal means "no such queue"
        return False
    return True


async def queue_exists(queue: Queue) -> bool:
    """Whether ``queue`` has any of its keys (``QueueKeys.presence``: what the registry's listing checks)."""
    return int(await queue.client.redis.exists(*queue.keys.presence)) > 0


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
    # The payload fields each known task declares, by KIND.
    declared: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # The fields each known task's carry model marks sensitive, and those it declares.
    carry_sensitive: Mapping[str, frozenset[str]] = field(default_factory=dict)
    carry_declared: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, show_values: bool, tasks: Sequence[type[Task[Any]]]) -> Redaction:
        return cls(
            show_values,
            {t.kind(): frozenset(t.sensitive_fields()) for t in tasks},
            {t.kind(): frozenset(t.model_fields) for t in tasks},
            {t.kind(): marked_fields(t.carry_type()) for t in tasks},
            {t.kind(): frozenset(t.carry_type().model_fields) for t in tasks},
        )

    def doc(self, kind: str, value: Any) -> Any:
        """``value`` (a carry, result, output or attachment) as it may be shown."""
        if not self.show_values:
            return redact(value)
        hidden = self.sensitive.get(kind)
        return redact(value, hidden) if hidden else value

    def payload(self, kind: str, value: Any) -> Any:
        """A job's payload as it may be shown: as ``doc``, and, for a known task, a key
        its model does not declare is masked too. The job was enqueued by an older
        model (a field since removed or renamed, docs/semantics.md): whether that
        field was sensitive, the reader cannot know."""
        declared = self.declared.get(kind)
        if not self.show_values or declared is None or not isinstance(value, Mapping):
            return self.doc(kind, value)
        hidden = self.sensitive.get(kind, frozenset()) | {k for k in value if k not in declared}
        return redact(value, hidden) if hidden else value

    def carry(self, kind: str, value: Any) -> Any:
        """A job's carry as it may be shown: as ``payload``, by the task's carry model.

        Its own sensitive fields are masked, and the task's (a carry that copies
        a secret from the payload often names it the same), and a key the
        carry model does not declare (a carry written by an older model)."""
        declared = self.carry_declared.get(kind)
        if not self.show_values or declared is None or not isinstance(value, Mapping):
            return self.doc(kind, value)
        hidden = (
            self.carry_sensitive.get(kind, frozenset())
            | self.sensitive.get(kind, frozenset())
            | {k for k in value if k not in declared}
        )
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
        "order_key": info.order_key,
        "order_waiting": info.order_waiting,
        "order_position": info.order_position,
        "corrupt": dict(info.corrupt),
        "waiting_on": list(info.waiting_on),
        "dependents": list(info.dependents),
        # Reported by the handler (ctx.report_progress): shown as it is, like the note.
        "progress": info.progress,
        "schedule_id": info.schedule_id,
        "fire_at": info.fire_at,
        "dedup_until": info.dedup_until,
    }
    out["payload"] = redaction.payload(info.kind, info.payload)
    out["carry"] = redaction.carry(info.kind, info.carry)
    for name in ("attachment", "result", "output"):
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
            "queue_count": info.queue_count,
            "concurrency": info.concurrency,
            "running": info.running,
            "started_at": info.started_at,
            "heartbeat_at": info.heartbeat_at,
            "version": info.version,
            "loop_blocked": info.loop_blocked,
            "longest_block": info.longest_block,
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


def parse_state(value: str | None) -> JobState | str | None:
    """``?state=`` as a JobState, or a view of the pending jobs (``retrying``,
    ``delayed``, ``limited``); empty means every state. Raises ValueError."""
    if not value:
        return None
    return listing(value)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def batch_of(queue: Queue, job_id: str, journal: Sequence[JournalEntry]) -> dict[str, Any] | None:
    """The batch a job's latest batched run was part of (``vr.BatchHandler``), or None.

    Read from the run's note (``_model/batch_note.py``): nothing is stored for
    it. A batch-mate's page reads the batch's first job's journal, which lists
    the batch's ids; ``mates`` is empty when that job is no longer kept.
    """
    found = next((m for e in reversed(journal) if (m := batch_note.parse(e.note)) is not None), None)
    if found is None:
        return None
    listed = found
    if found.lead != job_id:
        lead_journal = await queue.journal(found.lead) if JOB_ID_RE.fullmatch(found.lead) else []
        listed = next(
            (
                m
                for e in reversed(lead_journal)
                if (m := batch_note.parse(e.note)) is not None and m.lead == found.lead and m.ids
            ),
            found,
        )
    return {
        "lead": found.lead,
        "size": found.size,
        "mates": [i for i in listed.ids if i != job_id],
        "more": listed.more,
    }
