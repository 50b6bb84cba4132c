"""A connection of the client's own for the enqueue script.

redis-py sends every command through its pool (take a connection, check it,
put it back), its retry wrapper and its response callbacks. A producer that
enqueues one job at a time pays that on every call: about 17 µs of client CPU
and 20 µs of wall time per enqueue on the 2-core benchmark machine, where a
bare redis-py round trip is ~125 µs (benchmarks/README.md, "Where a single
enqueue's time goes").

The lane keeps one connection aside, made by the client's own pool (so it has
the same address, TLS, credentials, database and socket timeout) but never
handed out by it, and sends the enqueue script on it directly. What it keeps
from the pool path, so that nothing but speed changes:

- before a call, a connection with unread data or closed by the server while
  it sat idle is replaced, as the pool checks a connection it hands out;
- an error or a cancellation while a call is in flight drops the connection
  (the next call connects again) and the call raises; nothing is resent, so a
  lost reply never creates a job twice (docs/guarantees.md);
- ``script`` sends ``EVALSHA``, and ``EVAL`` after ``NOSCRIPT`` (as
  ``ScriptSet.call`` does on the pool path), so the script is found again
  after a flush.

A call that finds the lane busy (another queue's enqueue in flight) takes the
pool as before. Only ``Client.from_url`` makes a lane, where the client owns
its connections and ``Client.aclose`` closes them all; a client built around
a caller's own ``redis.asyncio.Redis`` has none, since the caller may close
that pool without the client. And only over a plain ``ConnectionPool``: not
fakeredis, a cluster client, durable mode (whose every script is followed by
a WAIT), a single-connection client, or a ``BlockingConnectionPool`` (whose
connection limit the lane would exceed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._scripts import Script, ScriptArg


class Lane:
    """One connection, one script call at a time (see the module docstring).

    ``script`` marks it busy for the call's duration.
    """

    __slots__ = ("_conn", "_stale", "busy")

    def __init__(self, conn: AbstractConnection) -> None:
        self._conn = conn
        # Unread data, or closed by the server: redis-py 8 renamed the check.
        self._stale = getattr(conn, "can_read", None) or conn.can_read_destructive
        self.busy = False

    @classmethod
    def for_redis(cls, redis: Any) -> Lane | None:
        """A lane over ``redis``'s pool, or None where the pool path must stay the only one."""
        if type(redis) is not aioredis.Redis or redis.single_connection_client:
            return None
        pool = redis.connection_pool
        if type(pool) is not ConnectionPool:
            return None
        return cls(pool.make_connection())  # type: ignore[no-untyped-call]

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """Run ``script`` on the lane: its reply, or its error raised.

        ``ScriptSet.call`` in one coroutine: a single enqueue's whole client
        path is short, and on a sequential producer every frame of it is paid
        between one reply and the next command.
        """
        self.busy = True
        try:
            await self._ready()
            try:
                return await self._round_trip("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # The script did not run: send the source (which caches it),
                # in one command, as ScriptSet.call does.
                return await self._round_trip("EVAL", script.source, len(keys), *keys, *args)
        finally:
            self.busy = False

    async def _ready(self) -> None:
        """Connect, or replace a connection that went stale while idle (as the pool does)."""
        conn = self._conn
        if conn.is_connected:
            try:
                stale = await self._stale()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                stale = True
            if not stale:
                return
            await conn.disconnect()
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            # Cancelled or failed mid-handshake: a reply to AUTH or SELECT may
            # still be on its way, and must not be read as a script's reply.
            await conn.disconnect(nowait=True)
            raise

    async def _round_trip(self, *command: Any) -> Any:
        conn = self._conn
        # Both halves drop the connection on any error or cancellation, since
        # part of a command or of its reply may be left on the socket.
        await conn.send_packed_command(conn.pack_command(*command))
        return await conn.read_response()

    async def aclose(self) -> None:
        await self._conn.disconnect()
