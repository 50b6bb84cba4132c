"""The registry of queues: every process that writes to a queue records its name, once.

``venturi:queues`` (``keys.registry_key``) is a sorted set: queue name ->
when a process last recorded writing to it (ms, that process's own clock).
Listing the queues is then one ``ZRANGE`` of it (``discovery.py``), however
many keys share the database: nothing walks the keyspace (docs/redis-layout.md,
"The registry of queues").

Every way a queue comes to exist goes through ``record``: an enqueue (single,
many, after=, a flow, an offload, ``SyncQueue``'s direct path, a sharded
queue's partitions), a schedule, a limit, a pause or resume, the event
stream's switch, and a worker starting on the queue. Why from here, and not
from the scripts that write the queue: every key a script touches shares the
queue's hash tag, so on Redis Cluster the registry, one key for every queue,
lives in another slot and often on another node; no script can reach it.

Cheap on the hot path: the client remembers what it recorded (``Recorded``),
so a process sends one ``ZADD`` per queue the first time it writes to it, and
again at most every ``RECORD_EVERY`` seconds while it keeps writing (never a
command per job). The refresh is what lets a reader prune safely: a name is
removed only when none of its queue's keys exist *and* nobody has recorded it
for ``PRUNE_AFTER_MS`` (longer than any memo lasts, plus room for clock
skew between hosts), so a process that still remembers having recorded a
queue can never find it pruned behind its back (``discovery.prune``).

The memo is bounded (``MEMO_MAX`` names): a producer that writes to a
queue per tenant must not keep a name for every queue it ever wrote to.
Forgetting is always safe, only dearer: a name no longer remembered is
recorded again (one more ``ZADD``) before the next write to its queue.
Names whose five minutes are over are dropped first, as the memo grows;
past ``MEMO_MAX`` names recorded within five minutes, the oldest records go.

The record goes out before the write it announces: a name recorded for a
write that then failed has no keys and is not listed; the other order could
leave a queue with keys that nobody lists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from .._store.keys import registry_key

# A process re-records a queue it keeps writing to at most this often.
RECORD_EVERY = 300.0
# A name none of whose keys exist is pruned once unrecorded this long: twice
# the memo's life, so a memo still believed anywhere is younger (plus clock skew).
PRUNE_AFTER_MS = int(2 * RECORD_EVERY * 1000) + 300_000
# Most names one client's memo holds (~125 bytes each: ~8 MB at most).
MEMO_MAX = 65_536


class Recorded:
    """One client's memo of the queues it recorded, and the one command that records them.

    ``due`` is on every enqueue's path: one dict lookup and one clock read,
    no lock. The dict changes only under the lock (the threads of a
    ``SyncClient`` record too), and in the order of the records: a name
    recorded again is moved to the end, so the oldest records are first,
    where the bound drops them (two threads may both record the same queue
    once: a harmless repeat).
    """

    __slots__ = ("_lock", "_until", "key")

    def __init__(self, namespace: str) -> None:
        self.key = registry_key(namespace)
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def due(self, name: str) -> bool:
        """Whether ``name`` must be recorded before this client writes to it."""
        return self._until.get(name, 0.0) <= time.monotonic()

    async def ensure(self, redis: Any, name: str) -> None:
        """Record ``name`` unless this client did lately: what every write to a queue calls first."""
        if self.due(name):
            await self.record(redis, name)

    async def record(self, redis: Any, *names: str) -> None:
        """Record ``names`` now: one ``ZADD ... GT`` (a name's time only moves forward).

        Remembered before the command goes out, so that the calls made
        meanwhile (a burst of a web server's first enqueues) send none of their
        own: they may write to the queue a moment before the name lands, which
        no reader can mistake for a queue that is gone (it has keys). Forgotten
        again if the command fails, so that the next call sends it.
        """
        if names:
            self._mark(names)
            try:
                await redis.zadd(self.key, _members(names), gt=True)
            except BaseException:
                self._forget(names)
                raise

    def record_blocking(self, redis: Any, name: str) -> None:
        """``record`` on a blocking redis-py client (``SyncQueue``'s direct enqueue, from its thread)."""
        self._mark((name,))
        try:
            redis.zadd(self.key, _members((name,)), gt=True)
        except BaseException:
            self._forget((name,))
            raise

    def __len__(self) -> int:
        return len(self._until)

    def _mark(self, names: Iterable[str]) -> None:
        now = time.monotonic()
        until = now + RECORD_EVERY
        memo = self._until
        with self._lock:
            for name in names:
                memo.pop(name, None)  # to the end: the dict stays in the order of the records
                memo[name] = until
            # The oldest first: those whose time is over, then any past the bound.
            while memo:
                oldest = next(iter(memo))
                if memo[oldest] > now and len(memo) <= MEMO_MAX:
                    break
                del memo[oldest]

    def _forget(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._until.pop(name, None)


def _members(names: Iterable[str]) -> dict[str, int]:
    return dict.fromkeys(names, int(time.time() * 1000))
