"""The embedded ``memory://`` backend: fakeredis (with Lua) in this process.

Every client made from the same ``memory://NAME`` URL in one process shares one
in-memory server, so a producer and a worker started side by side see the same
queue. Nothing survives the process: it is for examples, tests and local runs.
"""

from __future__ import annotations

import threading
from typing import Any

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
    return aioredis.FakeRedis(server=server)


def forget(name: str) -> None:
    """Drop the shared server named ``name`` (and its data); clients still open keep theirs."""
    with _lock:
        _servers.pop(name, None)
