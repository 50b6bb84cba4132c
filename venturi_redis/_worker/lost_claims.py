"""Claims whose reply was lost: their jobs go back to pending at once, not after their lease.

A claim whose connection dropped or timed out may have run: its jobs are then
``running`` under this worker's name with leases nobody renews, and, before
this, they waited out their lease (30 s by default) and were reclaimed as
``lease_expired``, a failed run charged to each (the retry backstop counts
it) for a run that never started. A failover, a ``CLIENT KILL`` or a cut
network did that to every job of the batch in flight.

So the runner notes each claim that failed that way (``note``: its lease
token base and when it was sent) and, before its next claim, ``release``
looks for its jobs: the running set's members whose lease expires within a
few seconds of ``sent + lease`` and ``failed + lease`` by Redis's clock (one
``TIME``, one ``ZRANGEBYSCORE`` and one pipelined ``HMGET`` per member), those
whose ``lease_token`` is ``<base>.<k>`` and ``lease_owner`` this worker. Each
is released (release.lua: fenced by that token, journaled ``released``
with a note saying why, no failure charged) and claimed again like any
other. Nothing runs per claim but the token's note; all this only after a
failed claim.

Not found, and left to their lease as before: jobs with a lease of their own
(``enqueue(lease=...)``: outside the window), a claim that runs only after
the look (a call queued behind ``CLIENT PAUSE``), more than ``MOST`` jobs in
the window. A claim forgotten after its lease has passed is the reclaim's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NamedTuple

from redis.exceptions import RedisError

from .._model.codec import text
from .._model.endings import Released
from .._model.enums import Priority
from .._store.store import NO_STATE, EndingArgs, Lease, send_ops

if TYPE_CHECKING:
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")

SLACK_MS = 2_000  # either side of the window: the clocks' reading and the call's own time
MOST = 2_000  # members of the window looked at, at most
NOTE = "its claim's reply was lost (the connection failed): released unstarted"
_ARGS = EndingArgs(0, 0, 0.0, "none")  # a release uses none of them
_PRIORITY = {p.label: p for p in Priority}


class _Lost(NamedTuple):
    base: str  # the claim's lease token base: its k-th job's token is base.k
    sent_ms: float  # this host's clock
    failed_ms: float


class LostClaims:
    """One runner's claims whose reply was lost, until their jobs are released or their lease is past."""

    def __init__(self, queue: Queue, worker_id: str, lease_ms: int) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.pending: list[_Lost] = []

    def note(self, base: str, sent_s: float) -> None:
        """A claim with token base ``base``, sent at ``sent_s`` (time.time()), failed now."""
        self.pending.append(_Lost(base, sent_s * 1000, time.time() * 1000))

    async def release(self) -> int:
        """Release what the noted claims took; how many jobs. A claim whose look failed is kept for later."""
        try:
            return await self._release_noted()
        except (RedisError, OSError) as exc:
            log.warning("queue %s: looking for a lost claim's jobs failed (%s)", self.queue.name, exc)
            return 0

    async def _release_noted(self) -> int:
        now = time.time() * 1000
        self.pending = [c for c in self.pending if now - c.failed_ms < self.lease_ms + SLACK_MS]
        if not self.pending:
            return 0
        redis = self.queue.client.redis
        sec, usec = await redis.time()
        offset = int(sec) * 1000 + int(usec) // 1000 - time.time() * 1000
        released = 0
        for claim in list(self.pending):
            lo = int(claim.sent_ms + offset) + self.lease_ms - SLACK_MS
            hi = int(claim.failed_ms + offset) + self.lease_ms + SLACK_MS
            ids = await redis.zrangebyscore(self.queue.keys.running, lo, hi, start=0, num=MOST)
            released += await self._release(claim.base, [text(i) for i in ids])
            self.pending.remove(claim)
        return released

    async def _release(self, base: str, ids: list[str]) -> int:
        if not ids:
            return 0
        pipe = self.queue.client.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.queue.keys.job(job_id), "lease_token", "lease_owner", "priority")
        rows = await pipe.execute()
        prefix = base + "."
        store = self.queue.store
        ops = []
        for job_id, row in zip(ids, rows, strict=True):
            token, owner, priority = (text(v) for v in row)
            if token.startswith(prefix) and owner == self.worker_id:
                lease = Lease(job_id, token, _PRIORITY.get(priority, Priority.NORMAL))
                ops.append(store.end_run(lease, Released(NOTE), NO_STATE, _ARGS))
        if not ops:
            return 0
        results = await send_ops(store.sender, ops)
        done = sum(1 for r in results if not isinstance(r, BaseException) and r.applied)
        log.warning(
            "queue %s: a claim's reply was lost; its %d job(s) released at once, not left to their lease",
            self.queue.name,
            done,
        )
        return done
