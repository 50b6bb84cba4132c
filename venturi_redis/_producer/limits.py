"""Flow control's operations: ``queue.set_limit``, ``clear_limit`` and ``limits`` (docs/flow-control.md).

The limits live in Redis (the queue's ``limits`` hash), so every worker
agrees at once and an operator can change them without a deploy; the claim
script enforces them (``lua/include/limits.lua``). Writes are one script
call each (``limit.lua``); reads are plain commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._model.codec import text
from .._model.limits import LimitInfo, Rate, checked_limit_kind, limit_args
from .._store import calls

if TYPE_CHECKING:
    from .base import QueueLike


async def set_limit(
    queue: QueueLike, kind: str, *, concurrency: int | None, rate: Rate | None, per_key: bool
) -> None:
    checked, conc, count, per_ms = limit_args(kind, concurrency, rate, per_key)
    call = calls.limit(
        queue.keys,
        queue.client._now_arg(),
        action="set",
        kind=checked,
        per_key=per_key,
        concurrency=conc,
        rate_count=count,
        rate_ms=per_ms,
    )
    await queue.client._scripts.call(queue.client.redis, *call)


async def clear_limit(queue: QueueLike, kind: str, *, per_key: bool) -> bool:
    checked = checked_limit_kind(kind)
    call = calls.limit(queue.keys, queue.client._now_arg(), action="clear", kind=checked, per_key=per_key)
    return int(await queue.client._scripts.call(queue.client.redis, *call)) == 1


async def limits(queue: QueueLike) -> list[LimitInfo]:
    redis, k = queue.client.redis, queue.keys
    raw = await redis.hgetall(k.limits)
    if not raw:
        return []
    out: list[LimitInfo] = []
    for kind_raw, value in sorted(raw.items()):
        kind = text(kind_raw)
        numbers = [int(float(x)) for x in text(value).split()] + [0] * 6
        head = kind + "\t"
        waiting = int(await redis.zlexcount(k.limits_parked, "[" + head, "(" + kind + "\t\xff"))
        for per_key, (conc, count, per_ms) in ((False, numbers[0:3]), (True, numbers[3:6])):
            if not conc and not count:
                continue
            running = int(await redis.hget(k.limits_state, kind + ("\t+" if per_key else "")) or 0)
            out.append(
                LimitInfo(
                    kind=kind,
                    per_key=per_key,
                    concurrency=conc or None,
                    rate=Rate(count, per_ms / 1000) if count else None,
                    running=running,
                    waiting=waiting,
                )
            )
    return out
