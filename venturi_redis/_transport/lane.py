"""A connection of the client's own for the enqueue script (and a redrive's
``retry_dead`` calls, one after another: ``Store.retry_dead``).

redis-py sends every command through its pool (take a connection, check it,
put it back), its retry wrapper and its response callbacks, and reads every
reply through a ``StreamReader``, its parser wrappers and an
``asyncio.timeout``. A producer that enqueues one job at a time pays all of
that on every call: a bare redis-py ``EVALSHA`` costs ~85 µs of client CPU on
the 2-core benchmark machine, a round trip over a bare asyncio protocol ~45.

The lane keeps one connection aside, made by the client's own pool (so it has
the same address, credentials, database, client name and socket timeout) but
never handed out by it. redis-py connects it and runs the handshake; the lane
then takes the socket's transport over with a protocol of its own
(``_Wire``: the reply parsed by hiredis as the bytes arrive, with redis-py's
own error classes) and writes each script call to the transport directly.
What it keeps from the pool path, so that nothing but speed changes:

- before a call, a connection closed by the server while it sat idle, or
  that sent anything unasked, is replaced, as the pool checks a connection it
  hands out; with ``health_check_interval`` set, a connection idle longer is
  sent a ``PING`` first, and replaced if that fails;
- the socket timeout bounds each call (write and reply): one timer per
  timeout period, not one per call (``Lane._check_deadline``);
- an error or a cancellation while a call is in flight drops the connection
  (the next call connects again) and the call raises; nothing is resent, so a
  lost reply never creates a job twice (docs/guarantees.md);
- ``script`` sends ``EVALSHA``, and ``EVAL`` after ``NOSCRIPT`` (as
  ``Sender.call`` does on the pool path), so the script is found again
  after a flush.

Over TLS the lane's protocol takes the place of the stream protocol above
the TLS layer (``set_protocol`` on the TLS transport), so it reads the
decrypted replies the same way; on uvloop, whose transports have the same
methods without subclassing asyncio's, likewise. Where the takeover does
not apply (decoded replies, a transport without ``set_protocol``, or a
redis-py whose connection no longer has what ``redispy.handshaken_transport``
relies on), or with ``Lane.reads_own_replies`` off, the lane sends on
redis-py's connection as before (``send_packed_command``,
``read_response``): slower, the same behaviour; tests/test_lane.py runs
the lane's tests both ways. Every private part of redis-py or asyncio the
lane relies on is reached through ``redispy.py``, the transport's fence.

A call that finds the lane busy (another queue's enqueue in flight) takes the
pool as before. Only ``Client.from_url`` makes a lane, where the client owns
its connections and ``Client.aclose`` closes them all; a client built around
a caller's own ``redis.asyncio.Redis`` has none, since the caller may close
that pool without the client. And only over a plain ``ConnectionPool`` or the
client's own bounded one (``pool.py``, whose bound the lane is one connection
beside): not fakeredis, a cluster client, durable mode (whose every script is
followed by a WAIT), a single-connection client, or a
``BlockingConnectionPool`` (whose connection limit the lane would exceed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import redispy
from .pool import BoundedPool
from .scriptref import ScriptArg, ScriptRef

_PING = b"*1\r\n$4\r\nPING\r\n"
# RESP3 push messages, which hiredis 3.2 and later parses into a type of its
# own. Older hiredis (3.0, 3.1: the pin allows them) hands a push on as a
# plain list, which the lane could not tell from a reply: on RESP3 it then
# reads through redis-py (``Lane._take_over``).
_PUSH: type | None = getattr(hiredis, "PushNotification", None)


def _swappable(transport: Any) -> bool:
    """Whether the lane can put its protocol on ``transport``.

    By what it does, not its class: uvloop's transports (which a web app under
    uvicorn often runs on) have the methods but do not subclass asyncio's.
    """
    return all(
        callable(getattr(transport, name, None))
        for name in ("get_protocol", "set_protocol", "write", "is_closing", "close")
    )


class _Wire(asyncio.Protocol):
    """The lane's protocol once redis-py's handshake is done: one reply at a time.

    ``waiter`` is the future of the call in flight (None between calls). The
    stream protocol it replaced still hears of the connection's end, so that
    redis-py's ``disconnect`` (which waits for it) closes it as usual.
    """

    def __init__(self, transport: asyncio.Transport, parse_error: Any) -> None:
        self.transport = transport
        # The stream protocol it took the place of (redispy.swap_protocol).
        self.previous: asyncio.BaseProtocol | None = None
        self._replies = hiredis.Reader(protocolError=InvalidResponse, replyError=parse_error)
        self.waiter: asyncio.Future[Any] | None = None
        # Closed by the server, or sent bytes nobody asked for: not to be used again.
        self.unusable = False

    def data_received(self, data: bytes) -> None:
        try:
            self._replies.feed(data)
            while (reply := self._replies.gets()) is not False:
                if _PUSH is not None and isinstance(reply, _PUSH):
                    continue  # RESP3 out-of-band data (redis-py logs and drops it too)
                waiter, self.waiter = self.waiter, None
                if waiter is None:  # a reply nobody asked for: the stream is out of step
                    self.unusable = True
                elif not waiter.done():
                    waiter.set_result(reply)
        except InvalidResponse as exc:  # the stream cannot be trusted
            self.unusable = True
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    def eof_received(self) -> bool:
        self.unusable = True
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.unusable = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(RedisConnectionError(f"Connection closed by server or lost: {exc}"))
        if self.previous is not None:
            self.previous.connection_lost(exc)

    def pause_writing(self) -> None:
        # The transport buffers what the socket does not take; the call's
        # deadline bounds how long its reply (which needs all of it) may take.
        pass

    def resume_writing(self) -> None:
        pass


class Lane:
    """One connection, one script call at a time (see the module docstring).

    ``script`` marks it busy for the call's duration.
    """

    __slots__ = ("_conn", "_deadline", "_stale", "_timeout", "_timer", "_wire", "busy")

    # False: never take the transport over, always read through redis-py (the
    # fallback path; the tests and benchmarks/enqueue_variants.py run it so).
    reads_own_replies = True

    def __init__(self, conn: AbstractConnection) -> None:
        self._conn = conn
        # Unread data, or closed by the server.
        self._stale = redispy.stale_check(conn)
        self._wire: _Wire | None = None
        timeout = getattr(conn, "socket_timeout", None)
        self._timeout: float | None = float(timeout) if timeout else None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.busy = False

    @classmethod
    def for_redis(cls, redis: Any) -> Lane | None:
        """A lane over ``redis``'s pool, or None where the pool path must stay the only one."""
        if type(redis) is not aioredis.Redis or redis.single_connection_client:
            return None
        pool = redis.connection_pool
        if type(pool) is not ConnectionPool and type(pool) is not BoundedPool:
            return None
        return cls(redispy.unpooled_connection(pool))

    @property
    def direct(self) -> bool:
        """True while the lane reads its replies itself (``_Wire``), not through redis-py."""
        return self._wire is not None

    async def script(self, script: ScriptRef, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """Run ``script`` on the lane: its reply, or its error raised.

        ``Sender.call`` in one coroutine: a single enqueue's whole client
        path is short, and on a sequential producer every frame of it is paid
        between one reply and the next command. The caller maps error replies
        (``_store/sender.py``).
        """
        self.busy = True
        try:
            await self._ready()
            try:
                return await self._round_trip("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # The script did not run: send the source (which caches it),
                # in one command, as Sender.call does.
                return await self._round_trip("EVAL", script.source, len(keys), *keys, *args)
        finally:
            self.busy = False

    async def _ready(self) -> None:
        """Connect, or replace a connection that went stale while idle (as the pool does)."""
        conn = self._conn
        wire = self._wire
        if wire is not None:
            if not wire.unusable and conn.is_connected:
                if not conn.health_check_interval or not redispy.health_check_due(
                    conn, asyncio.get_running_loop().time()
                ):
                    return
                try:
                    await self._send(_PING)
                    return
                except (RedisConnectionError, RedisTimeoutError, OSError, InvalidResponse):
                    pass  # replaced below, as redis-py's health check reconnects
        elif conn.is_connected:
            try:
                stale = await self._stale()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                stale = True
            if not stale:
                return
        await self._drop()
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            # Cancelled or failed mid-handshake: a reply to AUTH or SELECT may
            # still be on its way, and must not be read as a script's reply.
            await conn.disconnect(nowait=True)
            raise
        self._wire = self._take_over(conn)

    def _take_over(self, conn: AbstractConnection) -> _Wire | None:
        """Put a ``_Wire`` on the connection's transport, where that is safe (else None)."""
        if not self.reads_own_replies:
            return None
        stream = redispy.handshaken_transport(conn)
        if stream is None or conn.encoder.decode_responses or not _swappable(stream[0]):
            return None
        if _PUSH is None and str(conn.protocol) != "2":
            return None  # RESP3 pushes would read as replies (see _PUSH)
        transport, parse_error = stream
        wire = _Wire(transport, parse_error)
        wire.previous = redispy.swap_protocol(transport, wire)
        return wire

    async def _round_trip(self, *command: Any) -> Any:
        conn = self._conn
        if self._wire is not None:
            return await self._send(b"".join(conn.pack_command(*command)))
        # Both halves drop the connection on any error or cancellation, since
        # part of a command or of its reply may be left on the socket.
        await conn.send_packed_command(conn.pack_command(*command))
        return await conn.read_response()

    async def _send(self, data: bytes) -> Any:
        """Write ``data`` (one command) and return its reply, or raise its error reply."""
        wire = self._wire
        assert wire is not None
        loop = asyncio.get_running_loop()
        waiter = wire.waiter = loop.create_future()
        try:
            wire.transport.write(data)
            if self._timeout is not None:
                self._deadline = loop.time() + self._timeout
                if self._timer is None:
                    self._timer = loop.call_at(self._deadline, self._check_deadline)
            reply = await waiter
        except BaseException:
            # Part of the command may be unsent, or its reply unread: the
            # connection is unusable, and the call is never resent.
            await self._drop()
            raise
        if self._conn.health_check_interval:
            redispy.health_checked(self._conn, loop.time())
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _check_deadline(self) -> None:
        """The timer: fail the call in flight if its deadline passed, else wait for it.

        One timer serves every call: each call only moves ``_deadline``, and
        the timer, when it fires, sleeps again until the current call's
        deadline, or stops while no call is in flight.
        """
        self._timer = None
        wire = self._wire
        waiter = wire.waiter if wire is not None else None
        if waiter is None or waiter.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            waiter.set_exception(
                RedisTimeoutError(
                    f"Timeout reading from the enqueue lane's connection after {self._timeout} s"
                )
            )
        else:
            self._timer = loop.call_at(self._deadline, self._check_deadline)

    async def _drop(self) -> None:
        """Close the connection; the next call connects again."""
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.waiter = None
            wire.unusable = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._conn.disconnect()
