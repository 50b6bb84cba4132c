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
from urllib.parse import parse_qsl

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


def max_connections_of(url: str, given: int | None) -> int:
    """The bound of the client's pool: the URL's ``?max_connections=N``, else ``given``, else 20.

    The URL wins, as every query option does over a keyword in redis-py
    (an operator's ``REDIS_URL`` over the code's default).

    Raises:
        ConfigurationError: a bound that is not a whole number >= 1.
    """
    from .pool import DEFAULT_MAX_CONNECTIONS, max_connections_option

    raw = dict(parse_qsl(url.partition("?")[2], keep_blank_values=True)).get("max_connections")
    if raw is not None:
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigurationError(
                f"?max_connections={raw!r} in the URL: a whole number >= 1 (the most connections "
                "the client's pool opens)"
            )
        return int(raw)
    return DEFAULT_MAX_CONNECTIONS if given is None else max_connections_option(given)


def connect(url: str, *, cluster: bool = False, max_connections: int | None = None) -> Any:
    """A ``redis.asyncio`` client (``decode_responses=False``) for ``url``.

    Args:
        url: A URL of one of the schemes in the module docstring.
        cluster: Treat a ``redis://`` / ``rediss://`` URL as a cluster seed.
        max_connections: The most connections the client's pool opens
            (``pool.py``; 20 when None); the URL's ``?max_connections=``
            wins. On a cluster it is redis-py's own bound per node (100 by
            default on redis-py 8, which fails a call past it rather than
            wait), and ``memory://`` has no connections.

    Raises:
        ConfigurationError: An unsupported scheme, a malformed URL or a bad bound.
    """
    scheme = scheme_of(url)
    # Redis Cluster (docs/cluster.md): a RedisCluster client; each queue's
    # keys share the hash tag {queue}, so every script stays in one slot.
    if cluster or scheme.endswith("+cluster"):
        from .cluster import cluster_redis
        from .pool import max_connections_option

        bound = None if max_connections is None else max_connections_option(max_connections)
        return cluster_redis(url, bound)
    if scheme.endswith("+sentinel"):
        from .sentinel import sentinel_redis

        bound = max_connections_of(url, max_connections)
        return sentinel_redis(url, max_connections=bound, **SOCKET_TIMEOUTS, **tls_defaults(url))
    if scheme == "memory":
        from .memory import memory_redis

        return memory_redis(url)
    if scheme in ("redis", "rediss", "unix"):
        import redis.asyncio as aioredis

        from .pool import BoundedPool

        extra: dict[str, Any] = {**SOCKET_TIMEOUTS, **tls_defaults(url)}
        extra["max_connections"] = max_connections_of(url, max_connections)
        conn_cls = None
        if scheme in ("redis", "rediss"):
            from .fastpack import fast_connection_class

            if (conn_cls := fast_connection_class(scheme)) is not None:
                extra["connection_class"] = conn_cls
        # What redis-py's Redis.from_url does, with a pool that waits at its
        # bound instead of failing (pool.py); the client owns and closes it.
        pool = BoundedPool.from_url(url, decode_responses=False, **extra)
        if conn_cls is not None:
            from .redispy import use_connection_class

            # redis-py before 8.2 drops it for rediss:// (redispy.use_connection_class).
            use_connection_class(pool, conn_cls)
        return aioredis.Redis.from_pool(pool)
    raise ConfigurationError(
        f"unsupported URL {url!r}: use redis://host:port/db, rediss://, unix://, memory://, "
        "redis+cluster://host:port or redis+sentinel://host:port/service"
    )


__all__ = ["DEFAULT_URL", "SOCKET_TIMEOUTS", "connect", "default_url", "max_connections_of", "scheme_of"]
