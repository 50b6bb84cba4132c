"""The hiredis packer must produce exactly redis-py's bytes."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection

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
