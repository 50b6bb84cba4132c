"""A running worker says it is alive: registered on every queue it consumes, and its health file.

Per queue (docs/redis-layout.md, "Workers")::

    venturi:{q}:workers        zset    worker name -> when its registration expires (ms)
    venturi:{q}:worker:<name>  string  the worker's record (JSON: name, host, pid,
                                       queues, concurrency, started, last heartbeat,
                                       jobs running, version, event-loop blocks
                                       and the longest), PX ttl

The record is written by the lease keeper on each of its ticks (``beat``), in
one pipelined round trip per queue: SET the record with its TTL. Every
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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .._model.records import WorkerInfo, ms_to_dt

if TYPE_CHECKING:
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")

# A registration outlives this many lease-keeper ticks.
TTL_TICKS = 3
# The zset of names outlives the last worker by this much.
ZSET_TTL_MS = 3_600_000
# Expired names are trimmed (and the zset's TTL renewed) every this many beats.
TRIM_EVERY = 6


class Registration:
    """What one worker says about itself; ``beat`` renews it on each of its queues."""

    def __init__(self, name: str, queues: list[Queue], concurrency: int) -> None:
        from .. import __version__

        self.name = name
        self.queues = queues
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
            queues=tuple(q.name for q in self.queues),
            concurrency=self.concurrency,
            started_at=self.started_at,
            heartbeat_at=ms_to_dt(now_ms),
            expires_at=ms_to_dt(now_ms + ttl_ms),
            running=running,
            version=self.version,
            loop_blocked=self.loops_blocked,
            longest_block=round(self.longest_block, 3),
        )

    async def beat(self, queue: Queue, tick_s: float, running: int) -> None:
        """Renew the registration on ``queue``: one round trip, of one command (four when indexing)."""
        # The registry of queues too (_producer/registry.py): recorded at the worker's start and
        # again each time the client's memo of it lapses (five minutes), so that a queue only
        # workers write to (its schedules firing) is listed again after the registry was lost.
        await queue.client._recorded.ensure(queue.client.redis, queue.name)
        now_ms = int(time.time() * 1000)
        ttl_ms = max(int(tick_s * 1000 * TTL_TICKS), 1000)
        keys = queue.keys
        pipe = queue.client.redis.pipeline(transaction=False)
        pipe.set(keys.worker(self.name), self.record(now_ms, ttl_ms, running).to_json(), px=ttl_ms)
        n = self._beats.get(queue.name, 0)
        if n % TRIM_EVERY == 0:
            # The name's score outlives the next ZADD (TRIM_EVERY beats on):
            # the zset is only the index of names, the record says who is alive.
            horizon_ms = max(int(tick_s * 1000 * (TRIM_EVERY + TTL_TICKS)), 1000)
            pipe.zadd(keys.workers, {self.name: now_ms + horizon_ms})
            pipe.zremrangebyscore(keys.workers, "-inf", now_ms - 1)
            pipe.pexpire(keys.workers, max(horizon_ms, ZSET_TTL_MS))
        await pipe.execute()
        self._beats[queue.name] = n + 1

    async def leave(self, queue: Queue) -> None:
        """Remove the registration on ``queue`` (a clean stop)."""
        pipe = queue.client.redis.pipeline(transaction=False)
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
