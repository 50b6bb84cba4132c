"""A running worker says it is alive: registered on every queue it consumes, and its health file.

Per queue (docs/redis-layout.md, "Workers")::

    venturi:{q}:workers        zset    worker name -> when its registration expires (ms)
    venturi:{q}:worker:<name>  string  the worker's record (JSON: name, host, pid,
                                       queues, concurrency, started, last heartbeat,
                                       jobs running, version, event-loop blocks
                                       and the longest), PX ttl

The record is written by the lease keeper on each of its ticks (``beat``), in
one pipeline for up to 100 queues: SET the record with its TTL. Every
``TRIM_EVERY``-th beat (and the first) also ZADDs the name, scored past the
next such beat, drops the names whose score has passed and gives the zset an
hour's TTL (so it goes an hour after the last worker; a shorter one could drop
a slower-ticking worker's name). Idle, the tick is a third of the lease (10 s
by default): about 0.13 commands/s per queue, which keeps an idle worker
within its budget of 2 commands/s (measured with INFO commandstats,
``benchmarks/schedules_idle.py``; docs/operations.md). The TTL spans three ticks, so a worker that stops
ticking (SIGKILL, a blocked event loop, a cut network) disappears within a
lease or so; a clean stop removes its registration at once (``leave``).

Expiry uses the worker's clock for the zset score and Redis's for the record's
TTL; readers trust the record (a name whose record has expired is not listed),
so clock skew between hosts only delays trimming the zset.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from redis.exceptions import RedisError

from .._model.records import WORKER_QUEUES_NAMED, WorkerInfo, ms_to_dt

if TYPE_CHECKING:
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")

# A registration outlives this many lease-keeper ticks.
TTL_TICKS = 3
# The zset of names outlives the last worker by this much.
ZSET_TTL_MS = 3_600_000
# Expired names are trimmed (and the zset's TTL renewed) every this many beats.
TRIM_EVERY = 6
# Queues renewed in one pipeline (a worker on 1,000 queues: ten round trips a tick).
BEATS_PER_TRIP = 100
_SURVIVABLE = (RedisError, OSError)


class Registration:
    """What one worker says about itself; ``beat`` renews it on each of its queues."""

    def __init__(self, name: str, queues: list[Queue], concurrency: int) -> None:
        from .. import __version__

        self.name = name
        self.queues = queues
        self.names = tuple(q.name for q in queues[:WORKER_QUEUES_NAMED])  # what the record names
        self.concurrency = concurrency
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.version = __version__
        self.started_at: datetime = ms_to_dt(time.time() * 1000)
        self._beats: dict[str, int] = {}  # per queue name
        # The blocks of the event loop the loop watch warned of (loopwatch.py), since the start.
        self.loops_blocked = 0
        self.longest_block = 0.0

    def loop_blocked(self, seconds: float) -> None:
        """The event loop ran again after a block the worker warned of: counted for the record."""
        self.loops_blocked += 1
        self.longest_block = max(self.longest_block, seconds)

    def record(self, now_ms: int, ttl_ms: int, running: int) -> WorkerInfo:
        return WorkerInfo(
            name=self.name,
            host=self.host,
            pid=self.pid,
            queues=self.names,
            queue_count=len(self.queues),
            concurrency=self.concurrency,
            started_at=self.started_at,
            heartbeat_at=ms_to_dt(now_ms),
            expires_at=ms_to_dt(now_ms + ttl_ms),
            running=running,
            version=self.version,
            loop_blocked=self.loops_blocked,
            longest_block=round(self.longest_block, 3),
        )

    async def beat(self, beats: Sequence[tuple[Queue, int]], tick_s: float) -> list[Exception | None]:
        """Renew the registration on each ``(queue, jobs running there)``: one command per queue
        (four when indexing), in one pipeline per client of up to ``BEATS_PER_TRIP`` queues.

        Returns, per queue, the error that kept it from being renewed (None: renewed).
        """
        out: list[Exception | None] = []
        for i in range(0, len(beats), BEATS_PER_TRIP):
            out += await self._beat_chunk(beats[i : i + BEATS_PER_TRIP], tick_s)
        return out

    async def _beat_chunk(self, beats: Sequence[tuple[Queue, int]], tick_s: float) -> list[Exception | None]:
        # The registry of queues too (_producer/registry.py): recorded at the worker's start and
        # again each time the client's memo of it lapses (five minutes), so that a queue only
        # workers write to (its schedules firing) is listed again after the registry was lost.
        by_client: dict[int, list[str]] = {}
        for q, _ in beats:
            if q.client._recorded.due(q.name):
                by_client.setdefault(id(q.client), []).append(q.name)
        for q, _ in beats:
            names = by_client.pop(id(q.client), None)
            if names:
                await q.client._recorded.record(q.client.redis, *names)
        now_ms = int(time.time() * 1000)
        ttl_ms = max(int(tick_s * 1000 * TTL_TICKS), 1000)
        out: list[Exception | None] = [None] * len(beats)
        # One pipeline per client (a worker's queues are usually all on one).
        clients: dict[int, list[int]] = {}
        for i, (q, _) in enumerate(beats):
            clients.setdefault(id(q.client), []).append(i)
        for indexes in clients.values():
            pipe = beats[indexes[0]][0].client.redis.pipeline(transaction=False)
            sizes: list[int] = []
            records: dict[int, str] = {}  # by jobs running: most queues' is the same record
            for i in indexes:
                queue, running = beats[i]
                keys = queue.keys
                record = records.get(running)
                if record is None:
                    record = records[running] = self.record(now_ms, ttl_ms, running).to_json()
                pipe.set(keys.worker(self.name), record, px=ttl_ms)
                n = self._beats.get(queue.name, 0)
                if n % TRIM_EVERY == 0:
                    # The name's score outlives the next ZADD (TRIM_EVERY beats on):
                    # the zset is only the index of names, the record says who is alive.
                    horizon_ms = max(int(tick_s * 1000 * (TRIM_EVERY + TTL_TICKS)), 1000)
                    pipe.zadd(keys.workers, {self.name: now_ms + horizon_ms})
                    pipe.zremrangebyscore(keys.workers, "-inf", now_ms - 1)
                    pipe.pexpire(keys.workers, max(horizon_ms, ZSET_TTL_MS))
                    sizes.append(4)
                else:
                    sizes.append(1)
            try:
                replies = await pipe.execute(raise_on_error=False)
            except _SURVIVABLE as exc:
                for i in indexes:
                    out[i] = exc
                continue
            at = 0
            for i, size in zip(indexes, sizes, strict=True):
                error = next((r for r in replies[at : at + size] if isinstance(r, Exception)), None)
                at += size
                out[i] = error
                if error is None:
                    name = beats[i][0].name
                    self._beats[name] = self._beats.get(name, 0) + 1
        return out

    async def leave(self, queues: Sequence[Queue]) -> None:
        """Remove the registration on ``queues`` (a clean stop): pipelines of up to
        ``BEATS_PER_TRIP`` queues, one client's each."""
        by_client: dict[int, list[Queue]] = {}
        for q in queues:
            by_client.setdefault(id(q.client), []).append(q)
        for qs in by_client.values():
            for i in range(0, len(qs), BEATS_PER_TRIP):
                pipe = qs[0].client.redis.pipeline(transaction=False)
                for queue in qs[i : i + BEATS_PER_TRIP]:
                    pipe.delete(queue.keys.worker(self.name))
                    pipe.zrem(queue.keys.workers, self.name)
                await pipe.execute()


def _touch(path: Path) -> None:
    """Create ``path`` or set its modification time to now."""
    path.touch()
    os.utime(path)


async def keep_touching(path: Path, interval: float, worker_id: str) -> None:
    """Touch the health file now and every ``interval`` (the lease tick), until cancelled.

    On the worker's event loop, beside the lease keeper but not behind its
    Redis calls: a blocked loop stops touching it, Redis being down does not
    (docs/deployment.md, the liveness probe).
    """
    warned = False
    while True:
        try:
            _touch(path)  # a few µs, on the loop on purpose: a blocked loop stops it
        except OSError as exc:
            if not warned:
                log.warning("worker %s: cannot touch health file %s (%s)", worker_id, path, exc)
                warned = True
        await anyio.sleep(interval)
