"""The hiredis packer must produce exactly redis-py's bytes."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import TimeoutError as RedisTimeoutError

import venturi_redis as vr
from tests.servers import RedisServer
from venturi_redis._fastpack import FastPackConnection


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


@pytest.mark.anyio
async def test_a_command_larger_than_the_socket_buffer_is_written_whole() -> None:
    with RedisServer() as server:
        client = vr.Client.from_url(server.url)
        try:
            conn_cls = client.redis.connection_pool.connection_class
            assert issubclass(conn_cls, FastPackConnection)
            big = os.urandom(8 * 1024 * 1024)  # far beyond what one send() takes
            await client.redis.set("big", big)
            assert await client.redis.get("big") == big
        finally:
            await client.aclose()


@pytest.mark.anyio
async def test_a_write_to_a_server_that_stopped_reading_times_out() -> None:
    """A full socket buffer is waited out under socket_timeout, then the connection is dropped."""
    with RedisServer() as server:
        client = vr.Client.from_url(server.url + "?socket_timeout=0.5")
        try:
            await client.redis.ping()
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)  # accepts nothing more, answers nothing
            try:
                with anyio.fail_after(10):
                    with pytest.raises(RedisTimeoutError):
                        await client.redis.set("big", os.urandom(32 * 1024 * 1024))
            finally:
                server.proc.send_signal(signal.SIGCONT)
            # The half-written connection was dropped; the next command uses a fresh one.
            assert await client.redis.ping()
        finally:
            await client.aclose()
