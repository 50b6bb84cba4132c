"""A worker's periodic sweep over its queues: expired leases and retention, many queues a round trip.

One task per worker (serving.py starts it), not one per queue. Every reclaim
interval (``min(lease / 2, 15 s)``, jittered) it sends the reclaim call of
every queue, up to ``OPS_PER_TRIP`` of them in one pipeline, then calls again
for the queues whose call took a full batch or stopped at a cap (reclaim.lua's
``more``). Then, at most every trim interval, it records each queue's
retention (one pipeline of ``HSET``s) and trims the finished jobs past it,
queue after queue.

Why one task: a worker with a task per queue sent its queues' reclaims all
at once at its start, each on a connection of its own, and on redis-py 8
(whose asyncio pools hold at most 100 connections by default) a worker on
200 queues failed most of them (``Too many connections``), its claims with
them (benchmarks/many_queues.py). One task uses one connection at a time,
whatever the number of queues; a worker with one queue sends exactly what
it did.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import anyio
from redis.exceptions import RedisError

from .._producer import ops as _ops
from .._producer.retention import retention_field
from .._store.store import send_ops
from .guarded import observer_raised

if TYPE_CHECKING:
    from .._producer.client import Queue
    from .._producer.retention import Retention
    from .._store.store import Reclaimed
    from .metrics import WorkerObserver

log = logging.getLogger("venturi_redis.worker")

_SURVIVABLE = (RedisError, OSError)
RECLAIM_BATCH = 100  # jobs one reclaim call takes back, at most
# Most reclaim calls a tick makes for one queue while a capped part of the
# sweep is full (reclaim.lua's `more`: throttled keys, deadlines): a bound on one that is stuck.
SWEEP_CALLS_MAX = 100
# Calls of as many queues in one pipeline.
OPS_PER_TRIP = 100


def _report(q: Queue, got: Reclaimed, observer: WorkerObserver | None) -> None:
    """Log (and tell the observer of) what one reclaim call of queue ``q`` took back."""
    if not got.ids:
        return
    log.warning(
        "queue %s: reclaimed %d expired lease(s) (%d requeued, %d dead): %s",
        q.name,
        len(got.ids),
        got.requeued,
        got.dead,
        ", ".join(got.ids[:10]),
    )
    expired = getattr(observer, "leases_expired", None)
    if expired is not None:
        try:
            expired(q.name, got.requeued, got.dead)
        except Exception as exc:  # noqa: BLE001 - the application's observer
            observer_raised("leases_expired", exc)


async def reclaim(queues: Sequence[Queue], max_failures: str, observer: WorkerObserver | None) -> int:
    """One reclaim sweep of ``queues``; how many jobs it took back.

    A queue whose call fails (an error reply, a connection lost on the way)
    is logged and left to the next sweep; the other queues are swept.
    """
    calls = dict.fromkeys(queues, 0)
    todo = list(queues)
    total = 0
    while todo:
        again: list[Queue] = []
        for chunk in _chunks(todo):
            ops = [q.store.reclaim_op(batch=RECLAIM_BATCH, max_failures=max_failures) for q in chunk]
            try:
                results = await send_ops(chunk[0].client.sender, ops)
            except _SURVIVABLE as exc:
                results = [exc] * len(chunk)
            for q, got in zip(chunk, results, strict=True):
                if isinstance(got, BaseException):
                    log.warning("queue %s: reclaim failed (%s)", q.name, got)
                    continue
                calls[q] += 1
                total += len(got.ids)
                _report(q, got, observer)
                if len(got.ids) >= RECLAIM_BATCH or (got.more and calls[q] < SWEEP_CALLS_MAX):
                    again.append(q)
        todo = again
    return total


def _chunks(queues: Sequence[Queue]) -> list[list[Queue]]:
    """``queues`` by client (one pipeline is one client's), ``OPS_PER_TRIP`` at most each."""
    by_client: dict[int, list[Queue]] = {}
    for q in queues:
        by_client.setdefault(id(q.client), []).append(q)
    return [qs[i : i + OPS_PER_TRIP] for qs in by_client.values() for i in range(0, len(qs), OPS_PER_TRIP)]


async def _record_retention(queues: Sequence[Queue], retention: Retention | None) -> None:
    """What ``stats`` measures trimming against (the fleet's last word): one pipeline per chunk."""
    field = retention_field(retention)
    for chunk in _chunks(queues):
        pipe = chunk[0].client.redis.pipeline(transaction=False)
        for q in chunk:
            pipe.hset(q.keys.meta, "retention", field)
        results = await pipe.execute(raise_on_error=False)
        for q, res in zip(chunk, results, strict=True):
            if isinstance(res, Exception):  # a meta key of the wrong type: the claim reports it
                log.warning("queue %s: cannot record its retention (%s)", q.name, res)


class Sweep(Protocol):
    """What the sweep reads of its worker, as it runs (the ``Worker`` is one)."""

    @property
    def observer(self) -> WorkerObserver | None: ...

    @property
    def max_failures_arg(self) -> str: ...

    @property
    def reclaim_interval(self) -> float: ...

    @property
    def trim_interval(self) -> float: ...

    @property
    def retention(self) -> Retention | None: ...


async def sweep_forever(queues: Sequence[Queue], worker: Sweep) -> None:
    """Reclaim every tick, and record and trim retention when due, until cancelled."""
    trimmed_at = -math.inf
    recorded = False
    while True:
        await reclaim(queues, worker.max_failures_arg, worker.observer)  # it logs per queue
        retention = worker.retention
        trim_due = retention is not None and time.monotonic() - trimmed_at >= worker.trim_interval
        if not recorded or trim_due:
            try:
                await _record_retention(queues, retention)
                recorded = True
            except _SURVIVABLE as exc:
                log.warning("queue %s: cannot record its retention (%s)", queues[0].name, exc)
        if trim_due and retention is not None:
            # Retention rides on the reclaim tick: bounded batches, idempotent
            # across pods (a job removed by one is skipped by the others).
            trimmed_at = time.monotonic()
            for q in queues:
                try:
                    await _ops.trim(q, retention)
                except _SURVIVABLE as exc:
                    log.warning("queue %s: reclaim failed (%s)", q.name, exc)
        # Jitter spreads many pods' reclaims instead of having them collide.
        await anyio.sleep(worker.reclaim_interval * random.uniform(0.8, 1.2))
