"""A queue's metrics history: reading it (``queue.history``) and the operator's
switch (``queue.set_history``).

The transition scripts count, in the same atomic step as each transition,
the jobs enqueued, completed, failed runs, dead and the completed runs' time,
per KIND, in one hash per minute (kept 48 hours) and one per hour (kept 30
days): ``lua/include/history.lua``, ``_model/history.py`` (the read's plan),
docs/observability.md "Metrics history". Off unless the queue's meta hash
says ``history 1`` (``set_history``): it costs every transition.

A read is one pipeline of one command per period it covers (an hour by
minutes: 60; 30 days by hours: 720), every key in the queue's slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._model.history import COUNTERS, HOUR_MS, HistoryPlan, HistoryPoint, fold, plan
from .._store.store import HISTORY_DEFAULT
from .base import server_now_ms

if TYPE_CHECKING:
    from .base import QueueLike as Queue


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0  # a field written by hand: no count


def _period(raw: Any, kind: str | None) -> dict[str, int]:
    """One period's counters (kind None: every kind's summed)."""
    out: dict[str, int] = {}
    if kind is not None:
        if not isinstance(raw, list | tuple):
            return out  # a key of the wrong type (the pipeline's error, raise_on_error=False)
        for name, value in zip(COUNTERS, raw, strict=False):
            if value is not None:
                out[name] = _int(value)
        return out
    if not isinstance(raw, dict):
        return out  # a key of the wrong type (the pipeline's error, raise_on_error=False)
    for field, value in raw.items():
        text = field.decode() if isinstance(field, bytes) else str(field)
        _, tab, name = text.rpartition("\t")
        if tab and name in COUNTERS:
            out[name] = out.get(name, 0) + _int(value)
    return out


async def read(queue: Queue, the_plan: HistoryPlan, kind: str | None) -> list[HistoryPoint]:
    """The points ``the_plan`` covers, of one KIND or all."""
    k = queue.keys
    key = k.history_hour if the_plan.unit_ms == HOUR_MS else k.history_minute
    fields = [f"{kind}\t{name}" for name in COUNTERS] if kind is not None else None
    pipe = queue.client.redis.pipeline(transaction=False)
    for start in the_plan.periods():
        if fields is None:
            pipe.hgetall(key(start))
        else:
            pipe.hmget(key(start), *fields)
    replies: Sequence[Any] = await pipe.execute(raise_on_error=False)
    return fold(the_plan, [_period(r, kind) for r in replies])


def point_dict(p: HistoryPoint) -> dict[str, Any]:
    """A point as JSON: the same shape from ``venturi stats --history SPAN --json`` and
    the dashboard's ``/api/queues/{queue}/history``."""
    return {
        "at": p.at.isoformat(),
        "enqueued": p.enqueued,
        "completed": p.completed,
        "failed": p.failed,
        "dead": p.dead,
        "run_ms_mean": p.run_ms_mean,
    }


async def history(
    queue: Queue, *, since: timedelta, kind: str | None, step: timedelta | None
) -> list[HistoryPoint]:
    """``queue.history``: checked first (ConfigurationError), then one pipeline."""
    plan(0, since, step)  # the arguments checked before any command
    now = await server_now_ms(queue.client)
    return await read(queue, plan(now, since, step), kind)


async def set_history(queue: Queue, enabled: bool) -> None:
    """Switch the queue's metrics history on or off (the meta hash's ``history`` field)."""
    await queue.client.redis.hset(queue.keys.meta, "history", "1" if enabled else "0")


async def history_on(queue: Queue) -> bool:
    """Whether the queue counts its metrics history now."""
    raw = await queue.client.redis.hget(queue.keys.meta, "history")
    value = raw.decode() if isinstance(raw, bytes) else raw
    if value not in ("0", "1"):
        value = HISTORY_DEFAULT
    return value == "1"
