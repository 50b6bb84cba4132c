"""Idle waiting for a worker with many queues: one connection blocks on the wake lists of many.

A worker with a few queues gives each its own idle wait: a ``BLPOP`` of the
queue's wake list on a connection of the queue's runner, with the next claim
pipelined behind (runner.py ``_armed_claim``; docs/design.md, "Waking
workers"). That costs a connection per queue and a ``BLPOP`` and a claim per
queue every block (5 s at most): a worker serving 1,000 tenant queues held
1,000 connections to Redis and sent ~3,600 commands a second while it had
nothing to do (benchmarks/many_queues.py).

So a worker with more than ``GROUP_FROM`` queues on one plain Redis waits in
groups of up to ``GROUP_SIZE`` queues. A group is one task and one connection
of its own: one ``BLPOP`` of the wake list and the schedules wake list of
every idle queue of the group, and of the group's stop
list (``venturi:{<first queue>}:wake:<worker id>``, the stop list of its first
queue). A token popped from a queue's wake list pokes that queue's runner,
which then claims the ordinary way (through the completer, with the other
queues' claims: one round trip more than a pipelined claim); a schedules
token tells the queue's scheduler. Each idle runner waits on its own event
until a token, its next delayed job or ``poll_interval`` comes, whichever is
first: that claim is the only command an idle queue costs, so
``poll_interval`` sets what an idle queue of such a worker costs Redis (an
idle runner of a worker with few queues claims after every 5 s block).

What stays as it was:

- **One token wakes one worker.** A group blocks only on the queues whose
  runner is idle (its last claim came back short) and has a free slot: a
  busy queue's runner claims on by itself, as it did, and the tokens its
  jobs pushed are left for the idle workers (a group that blocked on them
  would pop them one ``BLPOP`` at a time). A token the group pops for a
  queue whose runner has no free slot by then (or a stopping worker) is
  pushed back onto that wake list, for another worker, and the next
  ``BLPOP`` leaves the queue out.
- **Joining.** A runner that goes idle while its group blocks without it
  (its queue was busy, or had no free slot) pushes one token onto the
  group's stop list: the ``BLPOP`` returns and is armed again with the
  runner in (``join``). A wake-up and its claim, or a claim after
  ``poll_interval``, leave the runner idle: no stop token, one ``BLPOP`` a
  wake-up.
- **Fairness.** ``BLPOP`` pops the first of its lists that holds a token:
  each one names the group's queues from the one after the queue last
  woken, so a queue with a stream of tokens cannot keep the others of its
  group waiting.
- **Liveness.** The block is ``Worker.idle_block`` (at most 5 s), and a reply
  overdue by 1.5 s past it means the connection is dead: it is dropped (with
  the pool's idle connections, which likely went the same way), and
  every runner of the group is poked, so each claims the ordinary way
  (whatever a token lost with the connection was for is found by those
  claims), then the group blocks again on a fresh connection.
- **At the server's maxclients.** A group whose own connection the server
  refuses (``max number of clients reached``: nothing was sent) blocks on one
  of the client's pooled connections this time, as a runner's idle claim does
  (runner.py), with one WARNING a minute; the pool's connections are kept
  (dropped, the server might not give them back), and the next ``BLPOP``
  asks for a connection of its own again.
- **Stopping.** A group returns once every runner of it has stopped claiming
  (a shutdown, or an ``until_idle`` run whose queues are drained), cutting its
  ``BLPOP`` short with its stop list as it does to join.

Not on Redis Cluster (a ``BLPOP`` of keys in several slots is refused) nor in
durable mode: there each queue keeps its own wait (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.codec import text
from .._transport.cluster import is_cluster
from .._transport.errors import TRANSIENT, server_full
from .._transport.redispy import socket_timeout, unpooled_connection

if TYPE_CHECKING:
    from .._producer.client import Client, Queue

log = logging.getLogger("venturi_redis.worker")

# A worker waits in groups when it has more than this many queues on one client.
GROUP_FROM = 8
# Queues per group: its BLPOP names two lists per queue, and Redis's work for one
# grows with the keys it names (commandstats on the shared 2-core machine: ~24 µs
# at 3 keys, ~48 at 33, ~97 at 65, ~122 at 129), paid once a wake-up.
GROUP_SIZE = 32
_BLOCK_MARGIN = 1.5  # runner.py's: a reply this late past the block means a dead connection
_STOP_TTL_MS = 60_000  # the stop list outlives a worker killed between the push and the pop


def can_block(client: Client) -> bool:
    """Whether idle claims can block on a connection of their own: a plain Redis, not durable mode."""
    redis = client.redis
    return (
        client.durability is None
        and not is_cluster(redis)
        and hasattr(getattr(redis, "connection_pool", None), "make_connection")
    )


class Waiting(Protocol):
    """What a wait group asks of a queue's runner (runner.py's ``Waiting`` is one)."""

    queue: Queue
    schedules_wake: str
    on_schedules_wake: Callable[[], None] | None
    group: WaitGroup | None
    done: bool

    def takes_tokens(self) -> bool:
        """Whether a wake-up token is for it now: idle (its last claim came back short), with a
        free slot."""

    def wake(self) -> None:
        """Claim now."""

    def join_group(self, group: WaitGroup) -> None:
        """Wait for wake-ups in ``group`` (for one run of the worker)."""


class WaitGroup:
    """Up to ``GROUP_SIZE`` runners of one client, waiting for their tokens on one connection."""

    def __init__(
        self, runners: Sequence[Waiting], stop_key: str, block: float, stopping: Callable[[], bool]
    ) -> None:
        self.runners = list(runners)
        self.stop_key = stop_key
        self.block = block
        self._stopping = stopping
        self.client = runners[0].queue.client
        # What the BLPOP in flight names (empty between two).
        self._armed: set[Waiting] = set()
        self._in_flight = False
        self._cut = False  # a stop token is on its way for the BLPOP in flight
        self._changed = anyio.Event()  # a runner asked to be waited for while none was
        self._conn: Any = None
        self._pushing: asyncio.Task[None] | None = None  # the last push of a stop token
        self.arms = 0  # BLPOPs sent (tests read it)
        self._next = 0  # where the next BLPOP starts naming queues (the one after the last woken)
        self._refused_logged = 0.0  # when a refusal of its connection may be logged again
        self.pooled = 0  # BLPOPs sent on a pooled connection, its own refused (tests read it)

    def _wanted(self, runner: Waiting) -> bool:
        return not self._stopping() and runner.takes_tokens()

    def _over(self) -> bool:
        return self._stopping() or all(r.done for r in self.runners)

    def join(self, runner: Waiting) -> None:
        """``runner`` goes idle: be sure the group's next (or current) BLPOP names its lists."""
        if runner in self._armed:
            return
        self.changed()

    def changed(self) -> None:
        """Who the group waits for may have changed: arm the BLPOP again (cut short if in flight)."""
        if not self._in_flight:
            self._changed.set()
        elif not self._cut:
            # One push per BLPOP, from a task of its own: the caller (a claim
            # loop going idle, one ending) does not wait for it.
            self._cut = True
            self._pushing = asyncio.get_running_loop().create_task(self._push_stop())

    async def _push_stop(self) -> None:
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.rpush(self.stop_key, "1")
        pipe.pexpire(self.stop_key, _STOP_TTL_MS)
        try:
            with anyio.move_on_after(_BLOCK_MARGIN):
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the block then ends by its timeout
            log.debug("wait group: could not cut its BLPOP short (%s)", exc)

    async def run(self) -> None:
        """Block for the group's runners until all of them have stopped claiming."""
        failures = 0
        try:
            while not self._over():
                # From the queue after the last one woken: BLPOP pops the first list it
                # names that holds a token, and a busy queue must not starve its group.
                n = len(self.runners)
                turn = [self.runners[(self._next + i) % n] for i in range(n)]
                members = [r for r in turn if self._wanted(r)]
                if not members:
                    self._changed = anyio.Event()
                    with anyio.move_on_after(self.block):
                        await self._changed.wait()
                    continue
                try:
                    popped = await self._blpop(members)
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - logged; the runners claim the ordinary way
                    if isinstance(exc, TRANSIENT) and not server_full(exc):
                        # They likely went the same way (runner.py); not at maxclients,
                        # where the server may not give them back.
                        await self._drop_idle_pooled()
                    failures += 1
                    delay = min(0.05 * 2**failures, 5.0)
                    log.warning(
                        "queue %s: waiting for wake-ups on %d queue(s) failed (%s); retrying in %.2fs",
                        members[0].queue.name,
                        len(members),
                        exc,
                        delay,
                    )
                    for r in members:
                        r.wake()
                    await anyio.sleep(delay)
                    continue
                if popped:
                    await self._deliver(text(popped[0]), members)
        finally:
            await self.close()

    async def _blpop(self, members: list[Waiting]) -> Any:
        keys: list[str] = []
        for r in members:
            keys += (r.queue.keys.wake, r.schedules_wake)
        keys.append(self.stop_key)
        self._armed = set(members)
        self._in_flight, self._cut = True, False
        self.arms += 1
        try:
            try:
                return await self._own_blpop(keys)
            except RedisConnectionError as exc:
                if not server_full(exc):
                    raise
                # Refused at maxclients, nothing sent: a pooled connection this time.
                self._note_refused(exc)
                return await self._pooled_blpop(keys)
        finally:
            self._in_flight = False
            self._armed = set()

    async def _own_blpop(self, keys: list[str]) -> Any:
        conn = self._conn
        if conn is None:
            # The deadline below bounds the exchange (runner.py _armed_claim says why).
            conn = self._conn = unpooled_connection(self.client.redis.connection_pool, untimed=True)
        limit = self.block + _BLOCK_MARGIN
        try:
            with anyio.fail_after(limit):
                await conn.send_command("BLPOP", *keys, f"{self.block:.3f}")
                return await conn.read_response()
        except TimeoutError:
            await self._drop()
            raise RedisTimeoutError(f"no reply to BLPOP in {limit:.2f}s") from None
        except BaseException:
            await self._drop()  # a reply may be unread (an error reply too: simpler to start afresh)
            raise

    async def _pooled_blpop(self, keys: list[str]) -> Any:
        """The BLPOP on one of the client's pooled connections, under its socket timeout."""
        redis = self.client.redis
        block = self.block
        timeout = socket_timeout(redis)
        if timeout:
            block = max(0.01, min(block, timeout - _BLOCK_MARGIN))
        self.pooled += 1
        try:
            with anyio.fail_after(block + _BLOCK_MARGIN):
                return await redis.blpop(keys, timeout=block)
        except TimeoutError:
            raise RedisTimeoutError(f"no reply to BLPOP in {block + _BLOCK_MARGIN:.2f}s") from None

    def _note_refused(self, exc: BaseException) -> None:
        """The group's own connection was refused (maxclients): logged once a minute at most."""
        now = time.monotonic()
        if now >= self._refused_logged:
            self._refused_logged = now + 60.0
            log.warning(
                "queue %s: Redis refused the idle-wait connection of %d queue(s) of this worker (%s); "
                "they wait on one of the client's pooled connections until the server takes it "
                '(docs/deployment.md, "Connections each part holds")',
                self.runners[0].queue.name,
                len(self.runners),
                exc,
            )

    async def _deliver(self, key: str, members: list[Waiting]) -> None:
        """The token popped from ``key``: to its runner, or back onto its list."""
        if key == self.stop_key:
            return
        for r in members:
            if key == r.queue.keys.wake:
                self._next = (self.runners.index(r) + 1) % len(self.runners)
                if self._wanted(r):
                    r.wake()
                    return
                # No free slot (or stopping): the token is for another worker.
                try:
                    await self.client.redis.rpush(key, "1")
                except Exception as exc:  # noqa: BLE001 - the next claim of any worker finds the job
                    log.warning("queue %s: could not hand a wake-up token back (%s)", r.queue.name, exc)
                return
            if key == r.schedules_wake:
                if r.on_schedules_wake is not None:
                    r.on_schedules_wake()
                return

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await conn.disconnect()

    async def _drop_idle_pooled(self) -> None:
        pool = getattr(self.client.redis, "connection_pool", None)
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.disconnect(inuse_connections=False)

    async def close(self) -> None:
        await self._drop()
        self._armed = set()


def wait_groups(
    runners: Sequence[Waiting], worker_id: str, block: float, stopping: Callable[[], bool]
) -> list[WaitGroup]:
    """The wait groups of a worker's runners: those of each client with more than ``GROUP_FROM``
    queues, where a group can block (a plain Redis, not durable mode); none otherwise."""
    by_client: dict[int, list[Waiting]] = {}
    for r in runners:
        by_client.setdefault(id(r.queue.client), []).append(r)
    groups: list[WaitGroup] = []
    for members in by_client.values():
        if len(members) <= GROUP_FROM or not can_block(members[0].queue.client):
            continue
        for i in range(0, len(members), GROUP_SIZE):
            chunk = members[i : i + GROUP_SIZE]
            stop_key = chunk[0].queue.keys.wake_stop(worker_id)
            group = WaitGroup(chunk, stop_key, block, stopping)
            for r in chunk:
                r.join_group(group)
            groups.append(group)
    return groups
