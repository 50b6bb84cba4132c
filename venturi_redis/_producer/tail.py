"""One reader of a queue's event stream per client, shared by its followers and waiters.

``queue.events()``, ``queue.wait()`` and the dashboard's live feed wait on
the queue's event stream with ``XREAD BLOCK``. Each blocking on a connection
of its own, the connections would grow with them: a web server with 500
requests in ``queue.wait``, a worker whose 100 handlers wait on their
children, a dashboard with ten tabs open. So one ``StreamTail`` per queue
and client reads the stream, on one connection of its own beside the
client's pool (``pool.side_redis``; where there is none, fakeredis, a
cluster or Sentinel, on the client itself), and hands each batch it reads to
everyone registered with it:

- a *waiter* (``queue.wait``) is woken when an entry says its job finished,
  and after every quiet slice (``_BLOCK_MS`` with nothing) or failed read, to
  read its job back, as it did when it read the stream itself: the job's
  hash is the authority;
- a *follower* (``queue.events``) gets the entries after its own position.

Joining is race-free because registering never awaits: the reader hands a
batch to whoever is registered when the batch arrives, and an entry written
after a registration comes after the reader's position then (the newest
entry it had read, or where it started). A waiter reads its job back after
it registered, so a finish before that is in the hash and one after it
reaches the waiter. A follower whose position is behind the reader's (it
resumes from an old id, or the reader ran ahead) reads that gap itself with
``XRANGE`` through the client's pool, then takes the reader's batches,
skipping what it has seen. A follower that leaves more than ``_BUFFER``
entries unread is let go the same way: its buffer is dropped and it reads
the gap itself, so a slow browser tab never makes the reader hold a queue's
worth of entries for it.

The reader starts with the first registration, at the position its starter
gives, and stops when nobody is registered after its current read (at most
``_BLOCK_MS``), closing its connection; ``Client.aclose`` stops it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import anyio

from .._transport.errors import TRANSIENT, server_full
from .._transport.pool import side_redis
from .._transport.redispy import socket_timeout

# One blocking read: under the 5 s socket timeout of Client.from_url's default
# (a shorter timeout in the URL shortens it: block_ms).
BLOCK_MS = 4000
# Entries per read: a reader or a follower that fell behind catches up in steps this big.
COUNT = 500
# Entries a follower may leave unread before it is let go to read the gap itself.
_BUFFER = 2000
FINISH_EVENTS = frozenset({b"completed", b"dead", b"cancelled"})

Entry = tuple[str, dict[Any, Any]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_id(value: str) -> tuple[int, int]:
    """A stream entry id as a pair of numbers, for ordering ("0-0" for none)."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def _entries(reply: Any) -> list[Entry]:
    """The entries of an ``XREAD`` reply of one stream.

    RESP2 gives ``[[key, entries]]``; RESP3 ``{key: [entries]}``.
    """
    if not reply:
        return []
    found = next(iter(reply.values()))[0] if isinstance(reply, dict) else reply[0][1]
    return [(_text(entry_id), fields) for entry_id, fields in found]


def block_ms(redis: Any) -> int:
    """How long one ``XREAD`` on ``redis`` blocks: ``BLOCK_MS``, or a second under its socket timeout.

    A read that outlasted the client's socket timeout (``?socket_timeout=2``
    in the URL) would fail every time, and the reader would never read.
    """
    timeout = socket_timeout(redis)
    if not timeout:
        return BLOCK_MS
    return max(10, min(BLOCK_MS, int((timeout - 1.0) * 1000)))


def finished_jobs(entries: list[Entry]) -> set[bytes]:
    """The ids of the jobs the entries say finished (completed, dead, cancelled)."""
    done: set[bytes] = set()
    for _, fields in entries:
        if fields.get(b"event") not in FINISH_EVENTS:
            continue
        job = fields.get(b"job")
        if job is not None:
            done.add(job)
        else:
            done.update(fields.get(b"jobs", b"").split(b" "))
    return done


class _Follower:
    """One follower's place: the last id it was given, and what the reader handed it since."""

    __slots__ = ("after", "buffer", "error", "gap_end", "wake")

    def __init__(self, after: str, gap_end: str | None) -> None:
        self.after = after
        # Entries up to this id (after ``after``) it must read itself, by XRANGE.
        self.gap_end = gap_end
        self.buffer: list[Entry] = []
        self.wake = anyio.Event()
        self.error: BaseException | None = None


class Waiter:
    """One waiter's wake-up: ``woken`` is set when it should read its job back."""

    __slots__ = ("error", "job", "woken")

    def __init__(self, job: bytes) -> None:
        self.job = job
        self.woken = anyio.Event()
        self.error: BaseException | None = None

    def poke(self) -> None:
        self.woken.set()

    async def next(self) -> None:
        """Until the next wake-up (a finish of its job, a quiet slice, a failed read)."""
        await self.woken.wait()
        self.woken = anyio.Event()
        if self.error is not None:
            raise self.error


class StreamTail:
    """The reader of one queue's event stream for one client (module docstring)."""

    def __init__(self, redis: Any, key: str) -> None:
        self._redis = redis
        self.key = key
        # The id of the newest entry the reader handed out (or where it started).
        self.position = "0-0"
        self._task: asyncio.Task[None] | None = None
        self._followers: set[_Follower] = set()
        self._waiters: dict[bytes, set[Waiter]] = {}

    @property
    def running(self) -> bool:
        return self._task is not None

    @property
    def idle(self) -> bool:
        """Not reading, and nobody following or waiting: a new reader would do the same."""
        return self._task is None and not self._followers and not self._waiters

    def _start(self, position: str) -> None:
        self.position = position
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"venturi tail {self.key}")

    # -- waiters -----------------------------------------------------------------

    @contextlib.contextmanager
    def waiting(self, job_id: str, position: str) -> Iterator[Waiter]:
        """Register a waiter for ``job_id``; ``position`` starts the reader when it is not running.

        No await between the check and the registration: see the module docstring.
        """
        waiter = Waiter(job_id.encode())
        self._waiters.setdefault(waiter.job, set()).add(waiter)
        if self._task is None:
            self._start(position)
        try:
            yield waiter
        finally:
            same = self._waiters.get(waiter.job)
            if same is not None:
                same.discard(waiter)
                if not same:
                    del self._waiters[waiter.job]

    def _poke_waiters(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.poke()

    # -- followers ---------------------------------------------------------------

    async def follow(self, after: str) -> AsyncGenerator[list[Entry], None]:
        """The stream's entries after ``after``, in batches, as they come; never ends by itself."""
        gap_end = None
        if self._task is None:
            self._start(after)
        elif stream_id(self.position) > stream_id(after):
            gap_end = self.position  # the reader is ahead: read up to it first
        me = _Follower(after, gap_end)
        self._followers.add(me)
        failures = 0
        try:
            while True:
                if me.gap_end is not None:
                    end = me.gap_end
                    try:
                        found = await self._redis.xrange(self.key, f"({me.after}", end, count=COUNT)
                    except TRANSIENT:
                        failures += 1
                        await anyio.sleep(min(0.05 * 2**failures, 2.0))
                        continue
                    failures = 0
                    batch = [(_text(entry_id), fields) for entry_id, fields in found]
                    if batch:
                        me.after = batch[-1][0]
                    if len(batch) < COUNT and stream_id(end) > stream_id(me.after):
                        me.after = end  # a short read: nothing more up to where it asked
                    # Caught up unless the reader handed out more while the XRANGE ran:
                    # ``_hand_out`` then moved gap_end past ``end`` (and kept no buffer).
                    if stream_id(me.after) >= stream_id(me.gap_end):
                        me.gap_end = None  # the reader's batches from here (no await since)
                    if batch:
                        yield batch
                    continue
                if me.error is not None:
                    raise me.error
                if not me.buffer:
                    await me.wake.wait()
                    me.wake = anyio.Event()
                    continue
                seen = stream_id(me.after)
                batch = [entry for entry in me.buffer if stream_id(entry[0]) > seen]
                me.buffer = []
                if batch:
                    me.after = batch[-1][0]
                    yield batch
        finally:
            self._followers.discard(me)

    def _hand_out(self, entries: list[Entry]) -> None:
        last = entries[-1][0]
        for follower in self._followers:
            if follower.gap_end is not None or len(follower.buffer) >= _BUFFER:
                # Reading a gap, or too far behind: it reads these itself.
                follower.gap_end = last
                follower.buffer = []
            else:
                follower.buffer.extend(entries)
            follower.wake.set()
        if self._waiters:
            for job in finished_jobs(entries):
                for waiter in self._waiters.get(job, ()):
                    waiter.poke()

    # -- the reader --------------------------------------------------------------

    async def _run(self) -> None:
        side = side_redis(self._redis)
        conn = side if side is not None else self._redis
        block = block_ms(conn)
        failures = 0
        try:
            while self._followers or self._waiters:
                try:
                    reply = await conn.xread({self.key: self.position}, count=COUNT, block=block)
                except TRANSIENT as exc:
                    # Read on from the same position once it answers again;
                    # the waiters read their jobs back meanwhile. Refused at
                    # the server's maxclients, read on one of the pool's.
                    if conn is side and server_full(exc):
                        conn = self._redis
                    failures += 1
                    self._poke_waiters()
                    await anyio.sleep(min(0.05 * 2**failures, 2.0))
                    continue
                except Exception as exc:  # noqa: BLE001 - handed to every reader, who raise it
                    self._fail(exc)
                    return
                failures = 0
                entries = _entries(reply)
                if not entries:
                    self._poke_waiters()  # a quiet slice: each waiter reads its job back
                    continue
                self.position = entries[-1][0]
                self._hand_out(entries)
        finally:
            self._task = None
            if side is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await side.aclose()

    def _fail(self, exc: BaseException) -> None:
        for follower in self._followers:
            follower.error = exc
            follower.wake.set()
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.error = exc
                waiter.poke()

    async def aclose(self) -> None:
        """Stop the reader now (``Client.aclose``)."""
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# The readers a client keeps at most, idle ones past it dropped: a producer
# that waits on a queue per tenant kept one per queue it ever waited on (the
# bound of names.py's Queue objects, for the same reason). A reader that is
# reading, or has someone waiting on it, is never dropped.
TAILS_KEPT = 1024


def tail_of(queue: Any) -> StreamTail:
    """The reader of ``queue``'s event stream on its client (one per queue per client)."""
    tails: dict[str, StreamTail] = queue.client._tails
    key = queue.keys.events
    tail = tails.get(key)
    if tail is None:
        if len(tails) >= TAILS_KEPT:
            # An idle reader holds nothing a new one would not start with.
            for idle in [k for k, t in tails.items() if t.idle]:
                del tails[idle]
        tail = tails[key] = StreamTail(queue.client.redis, key)
    return tail


__all__ = [
    "BLOCK_MS",
    "COUNT",
    "TAILS_KEPT",
    "FINISH_EVENTS",
    "StreamTail",
    "Waiter",
    "block_ms",
    "finished_jobs",
    "stream_id",
    "tail_of",
]
