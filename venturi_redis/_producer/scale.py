"""An autoscaling signal: how much work a queue has now and soon, and who serves it (issue 41).

The dashboard serves it at ``GET /api/queues/{queue}/scale`` for KEDA's
metrics-api scaler (docs/deployment.md). Every number is an O(log n) read of
an index (``ZCOUNT`` of the pending sets by score, ``ZCARD``), plus one
``EXISTS`` over the names in the queue's registry of workers: a million
pending jobs cost the same as ten. Two round trips.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import _text, server_now_ms
from .reads import _atomic_pipeline

if TYPE_CHECKING:
    from .base import QueueLike

# ``due_soon`` looks this far ahead.
SOON_MS = 60_000


@dataclass(frozen=True, slots=True)
class ScaleSignal:
    """What an autoscaler reads of one queue.

    Attributes:
        queue: The queue name.
        ready: Jobs eligible now, every priority (not those parked on a limit).
        running: Jobs holding a lease.
        due_soon: Pending jobs that become eligible within the next minute
            (a delay, a retry's backoff), not counted in ``ready``.
        limited: Jobs eligible but parked on a limit (flow control): more
            workers would not run them sooner.
        workers: Workers registered on the queue and alive (their record not
            expired).
        lag_seconds: Age of the oldest eligible job (0 when none waits).
        paused: Whether claims are paused (``queue.pause()``).
        at_ms: The time the numbers were read at (the scripts' clock, ms).
    """

    queue: str
    ready: int
    running: int
    due_soon: int
    limited: int
    workers: int
    lag_seconds: float
    paused: bool
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the dashboard's ``/api/queues/{queue}/scale``)."""
        return {
            "queue": self.queue,
            "ready": self.ready,
            "running": self.running,
            "due_soon": self.due_soon,
            "limited": self.limited,
            "workers": self.workers,
            "lag_seconds": self.lag_seconds,
            "paused": self.paused,
            "at_ms": self.at_ms,
        }


async def scale_signal(queue: QueueLike) -> ScaleSignal:
    """The queue's ``ScaleSignal``, read in one MULTI (so the counts agree) and one ``EXISTS``."""
    now = await server_now_ms(queue.client)
    k = queue.keys
    pipe = _atomic_pipeline(queue.client)
    for key in k.pending_high_first:
        pipe.zcount(key, "-inf", now)
        pipe.zcount(key, f"({now}", now + SOON_MS)
        pipe.zrangebyscore(key, "-inf", now, start=0, num=1, withscores=True)
    pipe.zcard(k.running)
    pipe.zcard(k.limits_parked)
    pipe.hget(k.meta, "paused")
    # Workers renew their registration by their own wall clock (_worker/registry.py): the
    # zset holds the names not yet trimmed, each name's record says whether it is alive.
    pipe.zrangebyscore(k.workers, int(time.time() * 1000), "+inf")
    res = await pipe.execute()
    ready = soon = 0
    oldest: float | None = None
    for i in range(len(k.pending_high_first)):
        eligible, later, head = res[3 * i : 3 * i + 3]
        ready += int(eligible)
        soon += int(later)
        if head:
            score = float(head[0][1])
            oldest = score if oldest is None else min(oldest, score)
    running, limited, paused, names = res[3 * len(k.pending_high_first) :]
    workers = int(await queue.client.redis.exists(*[k.worker(_text(n)) for n in names])) if names else 0
    return ScaleSignal(
        queue=queue.name,
        ready=ready,
        running=int(running),
        due_soon=soon,
        limited=int(limited),
        workers=workers,
        lag_seconds=max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0,
        paused=_text(paused) == "1",
        at_ms=now,
    )
