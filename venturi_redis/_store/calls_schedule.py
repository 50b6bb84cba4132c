"""Every call of the schedule scripts (``lua/schedule_*.lua``): KEYS, ARGV, replies.

The sibling of ``calls.py`` (which would pass ~600 lines with these), with
the same conventions: ARGV[1] ``now``, ARGV[2] the queue's prefix, every key
in KEYS, one builder per script and one parser per reply. Nothing else
assembles these scripts' keys or reads their raw replies.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._model.codec import text
from .calls import Call, ScriptArg
from .keys import QueueKeys

# The definition fields schedule_upsert.lua writes, in this order.
DEFINITION_FIELDS = (
    "kind",
    "payload",
    "priority",
    "dedup",
    "limit_key",
    "cron",
    "every_ms",
    "tz",
    "start_at",
    "end_at",
)


def schedule_upsert(
    keys: QueueKeys,
    now: str,
    *,
    schedule_id: str,
    fingerprint: str,
    next_at: int | None,
    anchor: int | None,
    definition: dict[str, ScriptArg],
) -> Call:
    """schedule_upsert.lua: create ``schedule_id`` or replace its definition.

    ``definition``: the ``DEFINITION_FIELDS``, all of them.
    """
    args: list[ScriptArg] = [
        now,
        keys.prefix,
        schedule_id,
        fingerprint,
        "" if next_at is None else next_at,
        "" if anchor is None else anchor,
    ]
    for name in DEFINITION_FIELDS:
        args += [name, definition[name]]
    return Call(
        "schedule_upsert",
        [
            keys.schedule(schedule_id),
            keys.schedules,
            keys.schedules_due,
            keys.schedules_wake,
            keys.journal_compact,
        ],
        args,
    )


class Upserted(NamedTuple):
    created: bool
    changed: bool
    next_at: int | None
    repaired: str  # what of a corrupt schedule the declaration repaired ('' nothing)


def upserted(reply: Any) -> Upserted:
    nxt = text(reply[2])
    return Upserted(int(reply[0]) == 1, int(reply[1]) == 1, int(nxt) if nxt else None, text(reply[3]))


def schedule_due(keys: QueueKeys, now: str, *, limit: int) -> Call:
    """schedule_due.lua: the schedules due now (at most ``limit``), and the earliest fire time."""
    return Call("schedule_due", [keys.schedules_due, keys.journal_compact], [now, keys.prefix, limit])


class Due(NamedTuple):
    now: int
    earliest: int | None  # the lowest next fire time of any active schedule
    ids: list[str]


def due(reply: Any) -> Due:
    earliest = int(reply[1])
    return Due(int(reply[0]), None if earliest < 0 else earliest, [text(x) for x in reply[2:]])


def schedule_fire(
    keys: QueueKeys,
    now: str,
    *,
    schedule_id: str,
    job_id: str,
    version: str = "",
    fire_at: int | None = None,
    next_at: int | None = None,
    fires: int = 1,
    fault: str = "",
) -> Call:
    """schedule_fire.lua: fire the due ``fire_at`` of ``schedule_id`` (compare-and-advance
    to ``next_at``), or, with ``fire_at=None``, trigger one extra job now; with a
    ``fault`` (what the caller found wrong with its stored timing), pause it with
    that as its note, if it is still ``version``."""
    mode = "quarantine" if fault else "trigger" if fire_at is None else "fire"
    return Call(
        "schedule_fire",
        [
            keys.schedule(schedule_id),
            keys.schedules_due,
            keys.dedup,
            keys.wake,
            keys.job(job_id),
            keys.journal(job_id),
            *keys.pending_high_first,
            keys.meta,
            keys.events,
            keys.journal_compact,
        ],
        [
            now,
            keys.prefix,
            mode,
            schedule_id,
            version,
            "" if fire_at is None else fire_at,
            "" if next_at is None else next_at,
            fires,
            job_id,
            fault,
        ],
    )


class Fired(NamedTuple):
    """schedule_fire.lua's reply. ``status``: 'created', 'merged' (``id`` is the pending
    job holding the task's dedup key), 'existed', or 'refused' (``id`` says why)."""

    status: str
    id: str


_FIRE_STATUS = {0: "refused", 1: "created", 2: "merged", 3: "existed"}


def fired(reply: Any) -> Fired:
    return Fired(_FIRE_STATUS[int(reply[0])], text(reply[1]))


def schedule_pause(
    keys: QueueKeys,
    now: str,
    *,
    schedule_id: str,
    pause: bool,
    version: str = "",
    next_at: int | None = None,
) -> Call:
    """schedule_pause.lua: pause ``schedule_id``, or resume it at ``next_at`` (if still ``version``)."""
    return Call(
        "schedule_pause",
        [keys.schedule(schedule_id), keys.schedules_due, keys.schedules_wake, keys.journal_compact],
        [
            now,
            keys.prefix,
            schedule_id,
            "pause" if pause else "resume",
            version,
            "" if next_at is None else next_at,
        ],
    )
