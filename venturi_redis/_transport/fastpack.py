"""Command packing in C for the hot path.

redis-py's asyncio ``Connection.pack_command`` is pure Python (~10 µs for a
transition script's arguments); hiredis, already a dependency, packs the same
RESP bytes in ~1 µs. A worker draining thousands of jobs a second sends a few
commands per job, so this is measurable (see benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .redispy import ReadsRefusal, stream_writer

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    _hiredis_pack = None


class _FastPack(Connection):
    """Commands packed by hiredis; mixed into redis-py's TCP and TLS connection classes."""

    # Whether a write skips asyncio.wait_for when the transport took the bytes
    # (send_packed_command). Not over TLS: the TLS layer hands its bytes on to
    # the socket's transport, so its own buffer reads empty while that one is
    # full and the stream is paused.
    _direct_write = True

    def pack_command(self, *args: Any) -> list[bytes]:
        if _hiredis_pack is None:
            return super().pack_command(*args)
        # redis-py passes some commands as one string ("CONFIG GET"); split it
        # the way its own packer does.
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [_hiredis_pack(args)]
        except TypeError:  # a type hiredis does not pack: let redis-py encode (or reject) it
            return super().pack_command(*args)

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(self.pack_command(*cmd)[0] for cmd in commands)]

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """Write without ``asyncio.wait_for`` when the socket takes the bytes at once.

        With a socket timeout set, redis-py wraps every write in
        ``asyncio.wait_for``, which on Python 3.11 creates a Task per command.
        A write only waits when the kernel's socket buffer is full; here the
        bytes go to the transport first, and only when some are left over does
        the drain wait, under the same timeout. Everything else (connecting,
        health checks, errors) is redis-py's own path.
        """
        writer = stream_writer(self)
        if writer is None or not self.is_connected or not self.socket_timeout or not self._direct_write:
            return await super().send_packed_command(command, check_health)
        if check_health and self.health_check_interval:
            await self.check_health()  # type: ignore[no-untyped-call]
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), self.socket_timeout)
            else:
                await writer.drain()  # returns at once; raises if the connection was lost
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            # Part of the command may have been written: the connection is unusable.
            await self.disconnect(nowait=True)
            raise

    async def disconnect(self, nowait: bool = False, *args: Any, **kwargs: Any) -> None:
        """With ``nowait`` (redis-py's way out after an error), drop the connection at once.

        A plain close first flushes what the transport holds: to a server that
        stopped reading, never; over TLS it also waits for the server's
        ``close_notify`` (up to 30 s). Either way the socket and its buffer
        outlive a connection that is given up. ``abort`` closes it now, and
        the rest of a half-sent command never reaches the server.
        """
        writer = stream_writer(self)
        if nowait and writer is not None:
            writer.transport.abort()
        await super().disconnect(nowait, *args, **kwargs)


class FastPackConnection(ReadsRefusal, _FastPack, Connection):
    """A plain TCP connection whose commands are packed by hiredis (and a refusal at maxclients named)."""


class FastPackSSLConnection(ReadsRefusal, _FastPack, SSLConnection):
    """A TLS connection whose commands are packed by hiredis (written by redis-py's own path)."""

    _direct_write = False


def fast_connection_class(scheme: str = "redis") -> type[Connection] | None:
    """The connection class for a ``redis://`` or ``rediss://`` URL, or None for redis-py's own."""
    if _hiredis_pack is None:
        return None
    return FastPackSSLConnection if scheme == "rediss" else FastPackConnection
