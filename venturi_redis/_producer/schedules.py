"""Schedules of one queue: define, read, pause, trigger, and fire the due ones.

``Queue.schedule()`` and its siblings delegate here; the worker's scheduler
(``_worker/scheduler.py``) calls ``firing.fire_due`` on its wake-ups. The storage
(docs/redis-layout.md): one hash per schedule, a set of the queue's schedule
ids, and the due index, a zset of the active ones scored by next fire time.

Firing is compare-and-advance (docs/design.md, "Schedules"): a worker reads
the due schedules, computes each one's next fire time here (cron in its time
zone, ``_model/schedule.py``), and ``lua/schedule_fire.lua`` creates the job
and advances the schedule in one step, only if the schedule's version and
next fire time are still those it read. Any number of workers may fire; one
job comes of each fire time. The job's id is derived from the schedule and
the fire time, a second guard (the script creates no job whose hash exists).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import ResponseError

from .._model.codec import pack_model, text
from .._model.enums import Priority
from .._model.errors import ConfigurationError, CorruptQueueError, TaskDefinitionError
from .._model.ids import new_job_id
from .._model.schedule import (
    CORRUPT,
    ScheduleFault,
    ScheduleInfo,
    checked_priority,
    next_fire,
    timing,
    validate_schedule_id,
)
from .._model.task import Task, task_kind
from .._store.checks import checked_dedup_field, checked_limit_key, not_a_task, payload_too_large
from .._store.store import ScriptArg
from .base import QueueLike, server_now_ms
from .firing import schedule_fields as _fields

log = logging.getLogger("venturi_redis.schedules")


def _corrupt(queue: QueueLike, schedule_id: str, note: str) -> CorruptQueueError:
    """The error of an operator's action on a corrupt schedule (nothing was written)."""
    return CorruptQueueError(
        f"schedule {schedule_id} of queue {queue.name}: {note}; nothing was written: repair its hash, "
        "or declare it again (queue.schedule, or the worker that declares it), or unschedule it"
    )


async def _read(queue: QueueLike, schedule_id: str) -> dict[bytes, bytes] | str:
    """The schedule's hash ({} when there is none), or why it cannot be read (a note)."""
    try:
        raw: dict[bytes, bytes] = await queue.client.redis.hgetall(queue.keys.schedule(schedule_id))
    except ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        kind = text(await queue.client.redis.type(queue.keys.schedule(schedule_id)))
        return f"its key is a {kind}, not a hash"
    return raw


async def schedule(
    queue: QueueLike,
    schedule_id: str,
    task: Task[Any],
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str = "UTC",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    priority: Priority | int | str | None = None,
) -> ScheduleInfo:
    """Create or replace ``schedule_id`` (``Queue.schedule``); everything is checked before a write."""
    validate_schedule_id(schedule_id)
    if not isinstance(task, Task):
        raise TaskDefinitionError(not_a_task(task, "schedule()"))
    kind = task_kind(type(task))
    payload = pack_model(task)
    cap = queue.client.max_payload_bytes
    if len(payload) > cap:
        raise payload_too_large(kind, len(payload), cap)
    if queue.client.encryption is not None:  # each fire's job is made from these bytes (schedule_fire.lua)
        payload = queue.client.encryption.seal(payload)
    prio = checked_priority(priority) or Priority.parse(task.priority())
    key = task.dedup_key()
    dedup = "" if key is None else checked_dedup_field(kind, key)
    # Flow control's per-key limits count scheduled jobs too (docs/flow-control.md).
    limit = checked_limit_key(kind, task.limit_key())
    if task.order_key() is not None:
        # A fire's job is written by schedule_fire.lua, which keeps no order
        # of keys (docs/semantics.md, "Ordered keys"): refused, not ignored.
        raise ConfigurationError(
            f"{kind} has an order key: a scheduled task cannot have one (its fires would run "
            "out of their key's order); return None from order_key() for scheduled tasks"
        )
    now = await server_now_ms(queue.client)
    when = timing(cron=cron, every=every, tz=tz, start_at=start_at, end_at=end_at, now_ms=now)
    anchor = when.first_anchor(now) if when.every_ms is not None else None
    definition: dict[str, ScriptArg] = {
        "kind": kind,
        "payload": payload,
        "priority": prio.label,
        "dedup": dedup,
        "limit_key": limit,
        "cron": when.cron or "",
        "every_ms": "" if when.every_ms is None else when.every_ms,
        "tz": when.tz,
        "start_at": "" if when.start_ms is None else when.start_ms,
        "end_at": "" if when.end_ms is None else when.end_ms,
    }
    done = await queue.store.schedule_upsert(
        schedule_id=schedule_id,
        fingerprint=when.fingerprint(),
        next_at=when.next_after(now, anchor or 0),
        anchor=anchor,
        definition=definition,
    )
    if done.repaired:
        log.warning(
            "queue %s: schedule %s was corrupt (%s); declaring it again repaired it",
            queue.name,
            schedule_id,
            done.repaired,
        )
    info = await get_schedule(queue, schedule_id)
    assert info is not None  # just written; only an unschedule() racing this call removes it
    return info


async def unschedule(queue: QueueLike, schedule_id: str) -> bool:
    """Remove ``schedule_id``; True if it existed. Its jobs already enqueued stay."""
    validate_schedule_id(schedule_id)
    k = queue.keys
    pipe = queue.client.redis.pipeline(transaction=True)
    pipe.delete(k.schedule(schedule_id))
    pipe.srem(k.schedules, schedule_id)
    pipe.zrem(k.schedules_due, schedule_id)
    existed, _, _ = await pipe.execute()
    return int(existed) == 1


async def get_schedule(queue: QueueLike, schedule_id: str) -> ScheduleInfo | None:
    """The schedule as stored; one whose key is not a hash is returned marked (``corrupt``)."""
    validate_schedule_id(schedule_id)
    raw = await _read(queue, schedule_id)
    if isinstance(raw, str):
        return ScheduleInfo.unreadable(queue.name, schedule_id, raw)
    return ScheduleInfo.from_hash(queue.name, schedule_id, raw) if raw else None


async def list_schedules(queue: QueueLike) -> list[ScheduleInfo]:
    """Every schedule of the queue, by id; a corrupt one is listed marked (``corrupt``), never raises.

    Raises:
        CorruptQueueError: The queue's set of schedule ids is not a set.
    """
    redis = queue.client.redis
    try:
        members = await redis.smembers(queue.keys.schedules)
    except ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        raise CorruptQueueError(
            f"{queue.keys.schedules} is not a set: the queue's schedules cannot be listed; "
            "repair or delete that key"
        ) from None
    ids = sorted(text(x) for x in members)
    if not ids:
        return []
    pipe = redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hgetall(queue.keys.schedule(sid))
    raws = await pipe.execute(raise_on_error=False)
    out: list[ScheduleInfo] = []
    for sid, raw in zip(ids, raws, strict=True):
        if isinstance(raw, Exception):  # WRONGTYPE: one schedule's key, not the listing's
            found = await _read(queue, sid)
            if isinstance(found, str):
                out.append(ScheduleInfo.unreadable(queue.name, sid, found))
            elif found:
                out.append(ScheduleInfo.from_hash(queue.name, sid, found))
        elif raw:
            out.append(ScheduleInfo.from_hash(queue.name, sid, raw))
    return out


def _refused(queue: QueueLike, schedule_id: str, detail: str) -> None:
    """Raise for a script's refusal that names a corrupt schedule."""
    if detail.startswith(CORRUPT):
        raise _corrupt(queue, schedule_id, detail)


async def pause_schedule(queue: QueueLike, schedule_id: str) -> bool:
    """Stop firing ``schedule_id`` until resumed; False if there is no such schedule."""
    validate_schedule_id(schedule_id)
    result = await queue.store.schedule_pause(schedule_id=schedule_id, pause=True)
    _refused(queue, schedule_id, result.detail)
    return result.applied


async def resume_schedule(queue: QueueLike, schedule_id: str) -> bool:
    """Fire ``schedule_id`` again from its next fire time after now (skipped ones are not
    caught up); False if there is no such schedule."""
    validate_schedule_id(schedule_id)
    client = queue.client
    for _ in range(8):  # the schedule changed between our read and the script: read again
        raw = await _read(queue, schedule_id)
        if isinstance(raw, str):
            raise _corrupt(queue, schedule_id, CORRUPT + raw)
        if not raw:
            return False
        f = _fields(raw)
        now = await server_now_ms(client)
        try:
            nxt = next_fire(f, now)
        except ScheduleFault as exc:
            raise _corrupt(queue, schedule_id, CORRUPT + str(exc)) from None
        result = await queue.store.schedule_pause(
            schedule_id=schedule_id, pause=False, version=f.get("version", ""), next_at=nxt
        )
        if result.applied:
            return True
        _refused(queue, schedule_id, result.detail)
        if result.detail == "schedule does not exist":
            return False
    return False


async def trigger_schedule(queue: QueueLike, schedule_id: str) -> str | None:
    """Enqueue one extra job of ``schedule_id`` now (its next fire time is unchanged).

    Returns the job id (or the pending job holding the task's dedup key), None
    if there is no such schedule.

    Raises:
        CorruptQueueError: The schedule's own data is corrupt (its key not a
            hash, a field the fire cannot use): nothing is written, and the
            error says what is wrong.
    """
    validate_schedule_id(schedule_id)
    result = await queue.store.schedule_fire(schedule_id=schedule_id, job_id=new_job_id())
    if result.status == "refused":
        _refused(queue, schedule_id, result.id)
        return None
    return result.id
