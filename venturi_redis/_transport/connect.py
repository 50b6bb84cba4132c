"""From a URL to a redis-py client: the one place a connection URL is read.

``Client.from_url`` (and through it ``Queue.from_url``, ``vr.SyncClient`` and
the CLI's ``--redis``) hands its URL here and wraps what comes back. The
schemes, each with its own module where it needs more than redis-py's
``from_url``:

* ``redis://``, ``rediss://`` (TLS), ``unix://``: one server, through a plain
  ``redis.asyncio.Redis`` (commands packed by hiredis, ``fastpack.py``);
* ``redis+cluster://`` / ``rediss+cluster://``, or any of the above with
  ``cluster=True``: Redis Cluster (``cluster.py``);
* ``redis+sentinel://`` / ``rediss+sentinel://``: the master of a service
  monitored by Redis Sentinel (``sentinel.py``);
* ``memory://[name]``: the embedded in-process server (``memory.py``), only
  when asked for by name.

No URL means ``REDIS_URL``, else ``redis://127.0.0.1:6379/0``, as everywhere
in the Redis ecosystem (and as the CLI's ``--redis``).
"""

from __future__ import annotations

import os
from typing import Any

from .._model.errors import ConfigurationError
from .urls import tls_defaults

# Every command waits at most 5 s for its reply: a connection that went silent
# (a half-open TCP connection, a hung server) then fails and is replaced
# instead of hanging a worker's claim loop forever. redis-py >= 6 has this
# default; 5.x waits forever. A ``?socket_timeout=`` in the URL wins.
SOCKET_TIMEOUTS: dict[str, float] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


DEFAULT_URL = "redis://127.0.0.1:6379/0"


def default_url() -> str:
    """The URL used when none is given: ``REDIS_URL``, else ``redis://127.0.0.1:6379/0``.

    Never ``memory://`` by itself: a producer that silently enqueued into a
    throwaway in-process server would lose every job at exit.
    """
    return os.environ.get("REDIS_URL") or DEFAULT_URL


def scheme_of(url: str) -> str:
    """``url``'s scheme, lower case ('' when it has none)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def connect(url: str, *, cluster: bool = False) -> Any:
    """A ``redis.asyncio`` client (``decode_responses=False``) for ``url``.

    Args:
        url: A URL of one of the schemes in the module docstring.
        cluster: Treat a ``redis://`` / ``rediss://`` URL as a cluster seed.

    Raises:
        ConfigurationError: An unsupported scheme or a malformed URL.
    """
    scheme = scheme_of(url)
    # Redis Cluster (docs/cluster.md): a RedisCluster client; each queue's
    # keys share the hash tag {queue}, so every script stays in one slot.
    if cluster or scheme.endswith("+cluster"):
        from .cluster import cluster_redis

        return cluster_redis(url)
    if scheme.endswith("+sentinel"):
        from .sentinel import sentinel_redis

        return sentinel_redis(url, **SOCKET_TIMEOUTS, **tls_defaults(url))
    if scheme == "memory":
        from .memory import memory_redis

        return memory_redis(url)
    if scheme in ("redis", "rediss", "unix"):
        import redis.asyncio as aioredis

        extra: dict[str, Any] = {**SOCKET_TIMEOUTS, **tls_defaults(url)}
        conn_cls = None
        if scheme in ("redis", "rediss"):
            from .fastpack import fast_connection_class

            if (conn_cls := fast_connection_class(scheme)) is not None:
                extra["connection_class"] = conn_cls
        client = aioredis.Redis.from_url(url, decode_responses=False, **extra)
        if conn_cls is not None:
            from .redispy import use_connection_class

            # redis-py before 8.2 drops it for rediss:// (redispy.use_connection_class).
            use_connection_class(client.connection_pool, conn_cls)
        return client
    raise ConfigurationError(
        f"unsupported URL {url!r}: use redis://host:port/db, rediss://, unix://, memory://, "
        "redis+cluster://host:port or redis+sentinel://host:port/service"
    )


__all__ = ["DEFAULT_URL", "SOCKET_TIMEOUTS", "connect", "default_url", "scheme_of"]
