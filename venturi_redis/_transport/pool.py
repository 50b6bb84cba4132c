"""The client's connection pool: at most ``max_connections``, and a call past them waits.

A plain redis-py pool opens a connection for every command in flight at
once: 1,000 concurrent reads in a web server open 1,000 connections before
redis-py 8 (its bound, 2**31, is none), and fail with "Too many connections"
past 100 from 8.0. Managed plans allow 20 to a few hundred connections for
the whole fleet. So ``Client.from_url`` (``redis://``, ``rediss://``,
``unix://``, and the master's pool on Sentinel) opens at most
``max_connections`` (20 unless the URL's ``?max_connections=N`` or
``Client.from_url(..., max_connections=N)`` says otherwise), and a call that
finds them all in use waits for one to come back, up to ``POOL_WAIT``
seconds, then raises ``vr.PoolExhaustedError``. A call that finds a free
connection takes redis-py's own path: nothing is added to it.

Beside the pool, not counted in it: the enqueue lane (one connection,
``lane.py``), each worker runner's blocking claim connection (one per queue,
``_worker/runner.py``) and each queue's event reader (``_producer/tail.py``).
docs/deployment.md, "Connections each part holds", is the user's table.

A server at its ``maxclients`` that refuses a new connection is one more
bound: the call takes an idle connection of the pool, or waits for one in
use (``redispy_pools.WaitingPool``); only a pool with none in use raises
``vr.MaxClientsError``, which says so, where, and what to do.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.asyncio.connection import ConnectionPool

from .._model.errors import ConfigurationError, MaxClientsError, PoolExhaustedError
from .redispy import sibling_pool
from .redispy_pools import WaitingPool, WaitingSyncPool

DEFAULT_MAX_CONNECTIONS = 20
# Seconds a call waits for a connection of a full pool before PoolExhaustedError.
POOL_WAIT = 10.0

_BOUND_HINT = 'bound each part\'s connections (docs/deployment.md, "Connections each part holds")'


def address(kwargs: dict[str, Any]) -> str:
    """Where a pool's connections go, for an error message: ``host:port`` or the socket's path."""
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def max_clients_error(where: str, exc: BaseException) -> MaxClientsError:
    """``vr.MaxClientsError``: the server at ``where`` refused a connection; this client had none to use."""
    return MaxClientsError(
        f"Redis at {where} refused a new connection: max number of clients reached (its "
        "maxclients), and this client had no connection of its own to use meanwhile. Free "
        f"connections elsewhere, raise the server's maxclients, or {_BOUND_HINT} ({exc})"
    )


def _exhausted(pool: Any) -> PoolExhaustedError:
    return PoolExhaustedError(
        f"no connection to Redis at {address(pool.connection_kwargs)} came free within "
        f"{pool.wait_seconds:g} s: all {pool.max_connections} of this client's pool "
        "(max_connections) were in use the whole time (calls in flight, or blocking commands "
        "of your own on client.redis); raise it with ?max_connections=N in the URL or "
        "Client.from_url(url, max_connections=N), or give long blocking commands a client of their own"
    )


class BoundedPool(WaitingPool, ConnectionPool):
    """The pool of ``Client.from_url`` for ``redis://``, ``rediss://``, ``unix://`` (module docstring)."""

    wait_seconds = POOL_WAIT

    def exhausted(self) -> Exception:
        return _exhausted(self)

    def refused(self, exc: BaseException) -> Exception:
        return max_clients_error(address(self.connection_kwargs), exc)


class BoundedSyncPool(WaitingSyncPool, redis.ConnectionPool):
    """``BoundedPool`` for blocking code (``SyncClient``'s direct single enqueue)."""

    wait_seconds = POOL_WAIT

    def exhausted(self) -> Exception:
        return _exhausted(self)

    def refused(self, exc: BaseException) -> Exception:
        return max_clients_error(address(self.connection_kwargs), exc)


def side_redis(client: Any) -> Any | None:
    """A client of one connection of its own beside ``client``'s pool (same server, credentials, options).

    For a reader that blocks (a queue's event reader, ``_producer/tail.py``;
    a ``resolve``'s subscription): it never holds one of the pool's
    connections while it waits. None where ``client`` is not a plain
    ``redis.asyncio.Redis`` over the pool ``Client.from_url`` made (fakeredis,
    a cluster, Sentinel, durable mode, a caller's own ``Redis``): the reader
    then blocks on a connection of ``client`` itself.
    """
    import redis.asyncio as aioredis

    if type(client) is not aioredis.Redis or type(client.connection_pool) is not BoundedPool:
        return None
    return aioredis.Redis.from_pool(sibling_pool(client.connection_pool, 1))


def max_connections_option(value: object) -> int:
    """``max_connections`` as given to ``Client.from_url``, checked: a whole number >= 1.

    Raises:
        ConfigurationError: anything else (0 would mean "no bound" to redis-py).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"max_connections must be a whole number >= 1 (the most connections the client's pool "
            f"opens), got {value!r}"
        )
    return value


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "POOL_WAIT",
    "BoundedPool",
    "BoundedSyncPool",
    "address",
    "max_clients_error",
    "max_connections_option",
    "side_redis",
]
