"""Flow control's operations: ``queue.set_limit``, ``clear_limit`` and ``limits`` (docs/flow-control.md).

The limits live in Redis (the queue's ``limits`` hash), so every worker
agrees at once and an operator can change them without a deploy; the claim
script enforces them (``lua/include/limits.lua``). Writes are one script
call each (``limit.lua``); reads are plain commands.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._model.codec import text
from .._model.errors import ConfigurationError, CorruptQueueError
from .._model.limits import LimitInfo, LimitKeyLoad, Rate, checked_limit_kind, limit_args
from .._store.keys import limit_key_of

# The per-key breakdown of ``limits()`` reads a bounded amount whatever the
# number of keys (a queue may have 100,000 tenants): at most _SCAN_CALLS
# SCAN calls of _SCAN_COUNT each over limits:state and over limits:ready,
# and the counts of at most _CANDIDATES_MAX keys, in one pipeline.
_SCAN_COUNT = 1000
_SCAN_CALLS = 10
_CANDIDATES_MAX = 2000

if TYPE_CHECKING:
    from .base import QueueLike


async def set_limit(
    queue: QueueLike, kind: str, *, concurrency: int | None, rate: Rate | None, per_key: bool
) -> None:
    checked, conc, count, per_ms = limit_args(kind, concurrency, rate, per_key)
    await queue.store.limit(
        action="set", kind=checked, per_key=per_key, concurrency=conc, rate_count=count, rate_ms=per_ms
    )


async def clear_limit(queue: QueueLike, kind: str, *, per_key: bool) -> bool:
    checked = checked_limit_kind(kind)
    return await queue.store.limit(action="clear", kind=checked, per_key=per_key)


async def limits(queue: QueueLike, keys: int = 50) -> list[LimitInfo]:
    if isinstance(keys, bool) or not isinstance(keys, int) or keys < 0:
        raise ConfigurationError(f"keys must be a whole number >= 0, got {keys!r}")
    redis, k = queue.client.redis, queue.keys
    try:
        raw = await redis.hgetall(k.limits)
    except ResponseError as exc:
        raise _wrong_type(exc, k.limits, "hash") from None
    if not raw:
        return []
    out: list[LimitInfo] = []
    for kind_raw, value in sorted(raw.items()):
        kind = text(kind_raw)
        numbers = _config(text(value))
        head = kind + "\t"
        try:
            waiting = int(await redis.zlexcount(k.limits_parked, "[" + head, "(" + kind + "\t\xff"))
        except ResponseError as exc:
            raise _wrong_type(exc, k.limits_parked, "sorted set") from None
        for per_key, (conc, count, per_ms) in ((False, numbers[0:3]), (True, numbers[3:6])):
            if not conc and not (count and per_ms):  # no cap the claim would hold a run back by
                continue
            try:
                running = _count(await redis.hget(k.limits_state, kind + ("\t+" if per_key else "")))
            except ResponseError as exc:
                raise _wrong_type(exc, k.limits_state, "hash") from None
            loads: tuple[LimitKeyLoad, ...] = ()
            total: int | None = 0
            if per_key:
                loads, total = await key_loads(queue, kind, keys) if keys else ((), None)
            out.append(
                LimitInfo(
                    kind=kind,
                    per_key=per_key,
                    concurrency=conc or None,
                    rate=_rate(count, per_ms),
                    running=running,
                    waiting=waiting,
                    keys=loads,
                    keys_total=total,
                )
            )
    return out


async def key_loads(queue: QueueLike, kind: str, shown: int) -> tuple[tuple[LimitKeyLoad, ...], int | None]:
    """The ``shown`` busiest keys of ``kind``, and how many keys are busy (None: more than read).

    A key is busy while one of its runs holds a per-key slot (its entity has
    a count in limits:state) or a job of it is parked (its entity is in
    limits:ready; an entity stays there a little after its last parked job
    left, so it is counted, and kept, only if its count says so). Both are
    found by SCAN with MATCH ``<kind>\t*``, bounded; each field found is
    decoded exactly (``limit_key_of``) and anything else under the kind (its
    rate rings, its flags, an entity's ring) is skipped.
    """
    redis, k = queue.client.redis, queue.keys
    head = kind.encode() + b"\t"
    match = re.sub(rb"([*?\[\]\\])", rb"\\\1", kind.encode()) + b"\t*"
    found: dict[bytes, str | None] = {}
    complete = True
    # The running keys may take half the candidates: the waiting ones get the rest.
    for scan, key, room, type_name in (
        (redis.hscan, k.limits_state, _CANDIDATES_MAX // 2, "hash"),
        (redis.zscan, k.limits_ready, _CANDIDATES_MAX, "sorted set"),
    ):
        cursor: Any = 0
        for _ in range(_SCAN_CALLS):
            try:
                cursor, page = await scan(key, cursor, match=match, count=_SCAN_COUNT)
            except ResponseError as exc:
                raise _wrong_type(exc, key, type_name) from None
            for item in page:  # a hash's fields, or a zset's (member, score) pairs
                field = item[0] if isinstance(item, tuple) else item
                if isinstance(field, bytes) and field.startswith(head) and field not in found:
                    try:
                        found[field] = limit_key_of(field[len(head) :])
                    except ValueError:
                        continue
            if int(cursor) == 0 or len(found) >= room:
                break
        complete = complete and int(cursor) == 0
    entities = list(found)[:_CANDIDATES_MAX]
    complete = complete and len(entities) == len(found)
    if not entities:
        return (), 0 if complete else None
    pipe = redis.pipeline(transaction=False)
    for entity in entities:
        pipe.hget(k.limits_state, entity)
        pipe.zlexcount(k.limits_parked, b"[" + entity + b"\t", b"(" + entity + b"\t\xff")
    counts = await pipe.execute()
    busy: list[LimitKeyLoad] = []
    for i, entity in enumerate(entities):
        running, waiting = _count(counts[2 * i]), _count(counts[2 * i + 1])
        if running or waiting:
            busy.append(LimitKeyLoad(found[entity], running, waiting))
    busy.sort(key=lambda x: (-(x.running + x.waiting), -x.running, x.key is None, x.key or ""))
    return tuple(busy[:shown]), len(busy) if complete else None


def _config(value: str) -> list[int]:
    """A kind's six numbers as the claim reads them (lua/include/limits.lua limit_config):
    one edited by hand that is no whole number of at most 15 digits is 0, no such cap."""
    numbers = [int(x) if len(x) <= 15 and x.isascii() and x.isdigit() else 0 for x in value.split()]
    return (numbers + [0] * 6)[:6]


def _rate(count: int, per_ms: int) -> Rate | None:
    if not count:
        return None
    try:
        return Rate(count, per_ms / 1000)
    except ConfigurationError:  # set by hand past the API's bounds (a window of 0: no cap)
        return None


def _wrong_type(exc: ResponseError, key: str, kind: str) -> Exception:
    if not str(exc).startswith("WRONGTYPE"):
        return exc
    return CorruptQueueError(
        f"{key} is not a {kind}: the queue's limits cannot be read; repair or delete that key"
    )


def _count(raw: object) -> int:
    """A count as Redis holds it; anything else (a hand-edited field) is 0."""
    try:
        value = int(text(raw))
    except ValueError:
        return 0
    return max(value, 0)
