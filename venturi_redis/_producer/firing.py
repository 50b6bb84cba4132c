"""A worker's fire round: the due schedules of one queue fired (``schedules.py`` defines them).

Split from ``schedules.py`` for a worker's start-up (issue 42): every worker
runs a first fire round when it starts (``_worker/scheduler.py``), and on a
queue with nothing due that round is one script call; the schedule model
(``_model/schedule.py``: fire times, cron, zones) is imported only when a
round has something due to fire.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

from .._model.codec import unpack_model
from .._model.enums import Priority
from .._model.ids import derived_job_id
from .._model.task import Task
from .._store.prepare import Prepared
from .._store.store import Fired
from .base import QueueLike
from .dedup import merge_into

log = logging.getLogger("venturi_redis.schedules")

# Due schedules one fire round reads (the next round takes the rest).
DUE_BATCH = 50
# The version a fire passes for a schedule it could not read (no stored one is it).
_UNREAD = "(unread)"


def schedule_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A schedule's hash as text, its payload left out."""
    return {
        k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items() if k != b"payload"
    }


class FireRound(NamedTuple):
    """What one ``fire_due`` round did: the scripts' clock, the earliest next fire
    time it knows of (None: no active schedule), and each schedule it fired."""

    now: int
    earliest: int | None
    fired: list[tuple[str, Fired]]


async def fire_due(
    queue: QueueLike, *, tasks: Mapping[str, type[Task[Any]]] | None = None, limit: int = DUE_BATCH
) -> FireRound:
    """Fire the schedules of ``queue`` that are due now (at most ``limit``).

    ``tasks``: KIND -> Task class, for the dedup merge of a fire whose task's
    dedup key a pending job holds (the worker passes its handlers). A KIND not
    in it leaves the pending job as it is (the work is held; the merge is
    skipped, docs/schedules.md).
    """
    client = queue.client
    keys = queue.keys
    due = await queue.store.schedule_due(limit=limit)
    out: list[tuple[str, Fired]] = []
    if not due.ids:
        return FireRound(due.now, due.earliest, out)
    from .._model.schedule import CORRUPT, ScheduleFault, fire_plan

    pipe = client.redis.pipeline(transaction=False)
    for sid in due.ids:
        pipe.hgetall(keys.schedule(sid))
    # One schedule's key of the wrong type is its own trouble: the others fire.
    raws = await pipe.execute(raise_on_error=False)
    for sid, raw in zip(due.ids, raws, strict=True):
        f: dict[str, str] = {}
        fire_at, fires, nxt, fault = 0, 1, None, ""
        if isinstance(raw, Exception) or not raw:
            # Gone (an entry of the index naming no schedule) or not a hash: the
            # script sees which, and takes it out of the due index. A version no
            # hash holds: one created since this read is left alone.
            f, fault = {"version": _UNREAD}, "its key could not be read"
        else:
            f = schedule_fields(raw)
            try:
                fire_at, fires, nxt = fire_plan(f, due.now)
            except ScheduleFault as exc:
                fault = str(exc)
            except Exception as exc:  # noqa: BLE001 - not the schedule's data (cronsim missing): skip it
                log.warning("queue %s: schedule %s cannot be fired here (%r)", queue.name, sid, exc)
                continue
        job_id = derived_job_id(fire_at, f"{queue.name}\0{sid}\0{fire_at}".encode())
        result = await queue.store.schedule_fire(
            schedule_id=sid,
            job_id=job_id,
            version=f.get("version", ""),
            fire_at=fire_at,
            next_at=nxt,
            fires=fires,
            fault=fault,
        )
        out.append((sid, result))
        if result.status == "merged":
            assert not isinstance(raw, Exception)
            await _merge(queue, tasks or {}, sid, f, raw.get(b"payload", b""), job_id, result.id)
        elif result.status == "refused" and result.id.startswith(CORRUPT):
            log.warning("queue %s: schedule %s paused: %s", queue.name, sid, result.id)
    # The earliest fire time now that these moved on (one ZRANGE; the due
    # script's was read before them).
    first = await client.redis.zrange(keys.schedules_due, 0, 0, withscores=True)
    return FireRound(due.now, int(first[0][1]) if first else None, out)


async def _merge(
    queue: QueueLike,
    tasks: Mapping[str, type[Task[Any]]],
    sid: str,
    f: dict[str, str],
    payload: bytes,
    job_id: str,
    holder: str,
) -> None:
    """A fire met a pending job holding its task's dedup key: the task's ``merge`` decides."""
    cls = tasks.get(f.get("kind", ""))
    if cls is None:
        return
    try:
        crypt = queue.client.encryption
        task = unpack_model(cls, payload if crypt is None else crypt.open(payload))
        prio = Priority.parse(f.get("priority") or "normal")
        job = Prepared(job_id, f["kind"], prio, 0, payload, b"", "", "", f.get("dedup", ""), True)
        await merge_into(queue, task, job, holder)
    except Exception as exc:  # noqa: BLE001 - the user's merge(); the fire itself is done
        log.warning(
            "queue %s: schedule %s: merging its fire into pending job %s failed (%r)",
            queue.name,
            sid,
            holder,
            exc,
        )
