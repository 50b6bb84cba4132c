"""The embedded ``memory://`` backend: fakeredis (with Lua) in this process.

Every client made from the same ``memory://NAME`` URL in one process shares one
in-memory server, so a producer and a worker started side by side see the same
queue. Nothing survives the process: it is for examples, tests and local runs.

Each command is a point where the event loop runs other tasks, as a round
trip over a socket is (``_yielding``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

from .redispy import derive_connection_class

_servers: dict[str, Any] = {}
_lock = threading.Lock()


def memory_redis(url: str) -> Any:
    """An asyncio fakeredis client on the shared server named by ``url``."""
    try:
        import fakeredis
        from fakeredis import aioredis
    except ImportError as exc:  # pragma: no cover - fakeredis is a dependency
        raise RuntimeError("memory:// needs fakeredis[lua] installed") from exc
    name = url.split("://", 1)[1].strip("/") or "default"
    with _lock:
        server = _servers.get(name)
        if server is None:
            server = _servers[name] = fakeredis.FakeServer()
    client = aioredis.FakeRedis(server=server)
    derive_connection_class(client.connection_pool, _yielding)
    return client


@functools.cache
def _yielding(base: Any) -> type:
    """``base`` (fakeredis's connection class) whose every write first lets other tasks run.

    Over a socket a command's reply is awaited, and other tasks run
    meanwhile: concurrent enqueues of a queue then find one in flight and
    share the next call (``_producer/coalesce.py``), and a producer's loop
    does not starve a worker beside it. fakeredis answers within the write,
    and the one step that suspended a command on Python 3.11 was redis-py's
    ``asyncio.wait_for`` around the write (with a socket timeout), which
    there ran it in a task of its own; from 3.12 ``wait_for`` runs it in
    place, and a command on ``memory://`` never let another task in. One
    ``sleep(0)`` before each write (``send_packed_command``, redis-py's public
    connection API, which commands, pipelines and pub/sub all write through)
    is that step on every Python.
    """

    async def send_packed_command(self: Any, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        await base.send_packed_command(self, *args, **kwargs)

    return type(f"Yielding{base.__name__}", (base,), {"send_packed_command": send_packed_command})


def forget(name: str) -> None:
    """Drop the shared server named ``name`` (and its data); clients still open keep theirs."""
    with _lock:
        _servers.pop(name, None)
