"""The hiredis packer must produce exactly redis-py's bytes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import TimeoutError as RedisTimeoutError

import venturi_redis as vr
from tests.servers import RedisServer, make_tls_files
from venturi_redis._transport import redispy
from venturi_redis._transport.fastpack import FastPackConnection, FastPackSSLConnection


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "venturi:{q}:job:1", b"k2", "", b"", 0, -5, 12345678901234),
        ("SET", "k", b"\x00\xff\r\n"),
        ("CONFIG GET", "maxmemory-policy"),
        ("HSET", "h", "f", 1.5),
        ("PING",),
    ],
)
def test_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    ours = b"".join(FastPackConnection().pack_command(*args))
    theirs = b"".join(Connection().pack_command(*args))
    assert ours == theirs


def test_pack_commands_concatenates() -> None:
    cmds = [("SET", "a", "1"), ("GET", "a")]
    assert b"".join(FastPackConnection().pack_commands(cmds)) == b"".join(Connection().pack_commands(cmds))


# -- the write path: no asyncio.wait_for unless the socket buffer is full ----------


@pytest.fixture(params=["plain", "tls"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own (one test stops it), over plain TCP and over TLS."""
    tls = make_tls_files(tmp_path / "tls") if request.param == "tls" else None
    with RedisServer(tls=tls) as server:
        yield server


@pytest.mark.anyio
async def test_a_command_larger_than_the_socket_buffer_is_written_whole(server: RedisServer) -> None:
    client = vr.Client.from_url(server.url)
    try:
        conn_cls = client.redis.connection_pool.connection_class
        assert conn_cls is (FastPackSSLConnection if server.tls else FastPackConnection)
        big = os.urandom(8 * 1024 * 1024)  # far beyond what one send() takes
        await client.redis.set("big", big)
        assert await client.redis.get("big") == big
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_write_to_a_server_that_stopped_reading_times_out(server: RedisServer) -> None:
    """A full socket buffer is waited out under socket_timeout, then the connection is dropped."""
    client = vr.Client.from_url(server.url_with(socket_timeout=0.5))
    try:
        await client.redis.ping()
        pool = client.redis.connection_pool
        conn = await redispy.pooled_connection(pool)
        sock = conn._writer.transport.get_extra_info("socket")
        await pool.release(conn)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)  # accepts nothing more, answers nothing
        try:
            with anyio.fail_after(10):
                with pytest.raises(RedisTimeoutError):
                    await client.redis.set("big", os.urandom(32 * 1024 * 1024))
        finally:
            # Dropped at once (abort), not closed after a flush that a stopped
            # server never takes, nor after a TLS close_notify it never sends.
            with anyio.fail_after(1):
                while sock.fileno() != -1:
                    await anyio.sleep(0.01)
            server.proc.send_signal(signal.SIGCONT)
        # The half-written connection was dropped; the next command uses a fresh one.
        assert await client.redis.ping()
    finally:
        await client.aclose()
