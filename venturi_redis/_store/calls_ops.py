"""The calls of the operators' scripts (resume, dead retry, purge) and of flow control's
``limit.lua``, beside ``calls.py`` (which is near its size limit): the same conventions,
one owner per script (an operator's cancel is ``calls.cancel``: workers send it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .._model.codec import text
from .calls import Call, ScriptArg, corrupt_job
from .keys import QueueKeys

# -- operators ------------------------------------------------------------------


def resume(keys: QueueKeys, now: str, *, job_id: str, value: bytes) -> Call:
    """resume.lua: a SUSPENDED job goes to pending with ``value`` (msgpack) as its input.

    Its reply is a ``transition``: refused when the job is not suspended. A job
    whose own data is corrupt is refused with ``VR_CORRUPTJOB`` (script_error).
    """
    return Call(
        "resume",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.suspended,
            keys.dedup,
            keys.wake,
            *keys.pending_high_first,
            keys.meta,
            keys.events,
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, value],
    )


def retry_dead(keys: QueueKeys, now: str, *, ids: Sequence[str], note: str) -> Call:
    """retry_dead.lua: dead jobs back to pending, failures reset."""
    return Call(
        "retry_dead",
        [
            keys.dead,
            keys.dedup,
            keys.wake,
            *keys.pending_high_first,
            keys.meta,
            keys.events,
            keys.journal_compact,
        ],
        [now, keys.prefix, note, *ids],
    )


def cancel_pending(keys: QueueKeys, now: str, *, ids: Sequence[str], note: str) -> Call:
    """cancel_pending.lua: an operator's cancel of many pending jobs, one call."""
    return Call(
        "cancel_pending",
        [
            *keys.pending_high_first,
            keys.cancelled,
            keys.dedup,
            keys.meta,
            keys.events,
            keys.limits_parked,
            keys.journal_compact,
        ],
        [now, keys.prefix, note, *ids],
    )


class CancelledPending(NamedTuple):
    cancelled: list[str]  # the ids cancelled
    others: list[str]  # the ids for cancel.lua, one call each (another state, or a rare path)
    # id -> the error cancel.lua raises for it (CorruptQueueError: its own data is corrupt;
    # nothing written for it)
    refused: dict[str, str]


def cancelled_pending(reply: Any) -> CancelledPending:
    """cancel_pending.lua's reply: the ids cancelled, the ids left to cancel.lua, the refused ones."""
    n = int(reply[0])
    m = int(reply[1 + n])
    rest = [text(x) for x in reply[2 + n + m :]]
    return CancelledPending(
        [text(x) for x in reply[1 : 1 + n]],
        [text(x) for x in reply[2 + n : 2 + n + m]],
        {i: str(corrupt_job(f"job {i}: {why}")) for i, why in zip(rest[::2], rest[1::2], strict=True)},
    )


def order_pause(keys: QueueKeys, now: str, *, key: str, pause: bool) -> Call:
    """order_pause.lua: pause an order key (its pending holder held back), or resume it.

    Its reply is 1 when the key's pause changed, 0 when it already was so.
    """
    return Call(
        "order_pause",
        [
            keys.order_held,
            keys.order_queue,
            keys.order_paused,
            keys.order_seq,
            keys.wake,
            *keys.pending_high_first,
            keys.limits_parked,
            keys.journal_compact,
        ],
        [now, keys.prefix, key, "1" if pause else ""],
    )


class Retried(NamedTuple):
    moved: list[str]  # the ids moved to pending
    refused: dict[str, str]  # id -> what is wrong with its own data (nothing written for it)


def retried(reply: Any) -> Retried:
    """retry_dead.lua's reply: the ids moved to pending, then the refused ids with their reason."""
    n = int(reply[0])
    rest = [text(x) for x in reply[1 + n :]]
    return Retried([text(x) for x in reply[1 : 1 + n]], dict(zip(rest[::2], rest[1::2], strict=True)))


def update(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    kind: str,
    payload: bytes,
    dedup: str,
    priority: str,
    delay_ms: str,
) -> Call:
    """update.lua: change a PENDING job in place (``queue.update``).

    ``kind`` '' leaves the task as it is (then ``payload`` and ``dedup`` are
    ignored); ``priority`` and ``delay_ms`` '' leave theirs. Its reply is an
    ``updated``: refused when the job is not pending, or refused as bad input.
    """
    return Call(
        "update",
        [
            keys.job(job_id),
            keys.journal(job_id),
            *keys.pending_high_first,
            keys.dedup,
            keys.wake,
            keys.limits_parked,
            keys.retrying,
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, kind, payload, dedup, priority, delay_ms],
    )


class Updated(NamedTuple):
    applied: bool
    # Why not: the job is not pending ('refused'), the new task's KIND is not
    # the job's ('kind'), the new dedup key is held by another job ('held'),
    # the new task has a dedup key and the job an order key ('ordered').
    refusal: str = ""
    detail: str = ""  # the reason, the job's KIND, or the holder's id


def updated(reply: Any) -> Updated:
    """update.lua's reply: ``{1}``, ``{0, reason}``, ``{2, kind}``, ``{3, holder}`` or ``{4, order key}``."""
    code = int(reply[0])
    if code == 1:
        return Updated(True)
    return Updated(False, {0: "refused", 2: "kind", 3: "held", 4: "ordered"}[code], text(reply[1]))


# The finished states purge.lua takes, each held by its own zset.
FINISHED_STATES = ("completed", "dead", "cancelled")


def purge(
    keys: QueueKeys,
    now: str,
    *,
    state: str,
    keep_ms: int | None,
    batch: int,
    most: int | None = None,
    ids: Sequence[str] = (),
) -> Call:
    """purge.lua: remove up to ``batch`` of the oldest jobs of the finished ``state`` that
    finished more than ``keep_ms`` ago or are beyond the ``most`` newest (None: no such bound);
    or, ``ids`` given, exactly those the finished ``state``'s zset still holds (the bounds unused)."""
    finished = {"completed": keys.completed, "dead": keys.dead, "cancelled": keys.cancelled}[state]
    args: list[ScriptArg] = [
        now,
        keys.prefix,
        "" if keep_ms is None else keep_ms,
        state,
        batch,
        "" if most is None else most,
        *ids,
    ]
    return Call("purge", [finished, keys.dedup, keys.journal_compact], args)


class Purged(NamedTuple):
    removed: int
    more: bool  # older jobs remain past this batch


def purged(reply: Any) -> Purged:
    return Purged(int(reply[0]), int(reply[1]) == 1)


# -- flow control ------------------------------------------------------------------


def limit(
    keys: QueueKeys,
    now: str,
    *,
    action: str,
    kind: str,
    per_key: bool,
    concurrency: int = 0,
    rate_count: int = 0,
    rate_ms: int = 0,
) -> Call:
    """limit.lua: ``action`` 'set' or 'clear' the kind-wide or per-key limits of ``kind``.

    The caller has checked the values (``_model/limits.py``); 0 = no such cap.
    Its reply is 1 when a limit was set or cleared, 0 when clear found none.
    """
    return Call(
        "limit",
        [
            keys.limits,
            keys.limits_state,
            keys.limits_parked,
            keys.limits_ready,
            keys.meta,
            keys.wake,
            keys.journal_compact,
        ],
        [now, keys.prefix, action, kind, "1" if per_key else "0", concurrency, rate_count, rate_ms],
    )
