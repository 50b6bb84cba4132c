"""Redis Sentinel: ``redis+sentinel://`` and ``rediss+sentinel://`` URLs.

A Sentinel deployment is one master and its replicas, watched by a few
sentinels that promote a replica when the master fails. The client is
redis-py's own (``redis.asyncio.sentinel``): a ``SentinelConnectionPool``
asks the sentinels for the service's master each time it opens a connection,
and a connection that finds its server turned replica (``READONLY``, or a
blocked ``BLPOP`` unblocked by the demotion) is dropped with a
``ConnectionError``, so the next one goes to the new master. Workers and
producers already treat a connection error as transient (the call may or may
not have run; docs/guarantees.md), so nothing above this module knows it runs
on Sentinel. Durable mode (``_transport/durable.py``) works unchanged: its
WAIT runs on the connection that ran the script, on whichever master that is.

The URL::

    redis+sentinel://[user:password@]host1:26379,host2:26379/SERVICE[/DB][?options]

``user:password`` authenticate to the master (and its replicas); the
sentinels' own credentials, when they have ``requirepass``, are the query
options ``sentinel_username`` and ``sentinel_password``. Every other query
option is redis-py's (``socket_timeout``, ``ssl_ca_certs``, ...), for the
master's connections; the ``socket_*`` ones and, with ``rediss+sentinel://``,
TLS and its ``ssl_*`` options apply to the sentinels' connections too.

Following a switchover. When the master fails, its connections break and the
next ones ask the sentinels. But a switchover (``SENTINEL FAILOVER``, or a
failover the old master lives through) leaves the old master up and writable
until the sentinels reconfigure it as a replica, about eight seconds later;
redis-py asks the sentinels only when it opens a connection, so pooled
connections would go on writing to the old master all that while, and those
writes are discarded when it resyncs from the new one. So a connection here
asks the sentinels again, at most once per ``MASTER_CHECK_INTERVAL`` per pool,
before it sends (one sentinel round trip a second while commands flow, nothing
when idle). When the master moved, the idle connections are dropped (the next
ones go to the new master), and a connection that was in use then refuses
its next command with a ``ConnectionError`` instead of sending it to the old
master: nothing was sent, and a WATCH is never silently lost by reconnecting
under it. Producers may see a few such errors at a switchover, as they do
when a master dies.

Not taken here: the enqueue lane (``lane.py``) and hiredis command packing
(``fastpack.py``) run only on a plain ``ConnectionPool``; on Sentinel every
command goes through redis-py's ``SentinelManagedConnection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.errors import ConfigurationError, PoolExhaustedError
from .pool import POOL_WAIT, max_clients_error
from .redispy import ReadsRefusal
from .redispy_pools import WaitingPool
from .urls import redact_url

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
# Query options meant for the sentinels themselves, not for the master.
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


# Seconds between two questions to the sentinels about the master's address.
MASTER_CHECK_INTERVAL = 1.0


class _CheckedPool(WaitingPool, SentinelConnectionPool):
    """redis-py's ``SentinelConnectionPool`` that notices a switchover (module docstring).

    At its ``max_connections`` a call waits for a connection to come back, as
    on a single Redis (``pool.py``, ``redispy.WaitingPool``).

    Relies on redis-py's ``get_master_address`` (asks the sentinels, records
    ``master_address``, disconnects the idle connections when it changed) and
    on a connection's ``host``/``port`` being the address it connected to.
    """

    wait_seconds = POOL_WAIT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.next_check = 0.0

    def exhausted(self) -> Exception:
        return PoolExhaustedError(
            f"no connection to the master of {self.service_name!r} came free within "
            f"{self.wait_seconds:g} s: all {self.max_connections} of this client's pool "
            "(max_connections) were in use the whole time; raise it with ?max_connections=N in "
            "the URL or Client.from_url(url, max_connections=N)"
        )

    def refused(self, exc: BaseException) -> Exception:
        return max_clients_error(f"the master of {self.service_name!r}", exc)

    async def get_master_address(self) -> Any:
        """redis-py's, with the passwords taken out of its ``MasterNotFoundError``.

        When no sentinel names a master, redis-py's message lists each
        sentinel client with the error it met; from 6.x to 7.x a client's
        repr shows its connection options, the sentinels' password among
        them, and the CLI prints that message. Each password the pool and
        the sentinels' clients hold (public ``connection_kwargs``) is masked.
        """
        try:
            return await super().get_master_address()  # type: ignore[no-untyped-call]
        except MasterNotFoundError as exc:
            message = str(exc)
            clients = [self, *(sentinel.connection_pool for sentinel in self.sentinel_manager.sentinels)]
            for pool in clients:
                password = pool.connection_kwargs.get("password")
                if password:
                    message = message.replace(str(password), "***")
            raise MasterNotFoundError(message) from None

    async def moved_from(self, connection: Any) -> bool:
        """Whether ``connection`` is on a server the sentinels no longer name as master.

        Asks them at most once per ``MASTER_CHECK_INTERVAL`` (the coroutines
        that come meanwhile go by what is known); when no sentinel answers,
        the master we know is kept: it may well be fine.
        """
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + MASTER_CHECK_INTERVAL
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                await self.get_master_address()
        known = self.master_address
        return known is not None and (connection.host, connection.port) != known


# What redis-py's send calls on its stream writer: an AttributeError on None
# for one of them is the writer its connection dropped (``_Checked``).
_WRITER_METHODS = frozenset({"write", "writelines", "drain"})


class _Checked(ReadsRefusal, SentinelManagedConnection):
    """A connection that will not send to a master the sentinels replaced (module docstring).

    A connection still on the old master when the switch is noticed refuses
    its next command with a ``ConnectionError`` (nothing sent) and reconnects
    for the one after; the idle ones were already dropped. It cannot simply
    reconnect and send: it may hold a ``WATCH`` that the new connection would
    not.

    It also connects through the sentinels when its first command finds it
    unconnected: redis-py 8's ``send_packed_command`` connects by the plain
    ``Connection`` path, to the default ``localhost:6379``, not to the master
    (a pool's connections are connected before they are handed out; a
    worker's own blocking claim connection is not).

    And a connection closed by the pool while it sends (the pool drops its
    idle connections at a switchover without its lock, so one just handed
    out can be among them) raises a ``ConnectionError``, as a dropped
    connection does, not redis-py's ``AttributeError`` on its closed writer.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        pool: Any = self.connection_pool
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]  # SentinelManagedConnection's: asks the sentinels
        elif await pool.moved_from(self):
            address = f"{self.host}:{self.port}"
            await self.disconnect()
            raise RedisConnectionError(
                f"{address} is no longer the master of {pool.service_name!r} (the sentinels name "
                f"{pool.master_address[0]}:{pool.master_address[1]}); nothing was sent, retry"
            )
        try:
            await super().send_packed_command(command, check_health)
        except AttributeError as exc:
            # The pool's sweep of idle connections at a switchover
            # (``get_master_address``) does not take the pool's lock, so it
            # can close a connection that another task took from the pool
            # meanwhile; redis-py then writes to the writer it set to None.
            # Nothing of this command was written: say so as the transient
            # error it is, not as a crash of the caller's loop.
            if exc.obj is not None or exc.name not in _WRITER_METHODS:
                raise
            raise RedisConnectionError(
                f"the connection to {self.host}:{self.port} was closed under this command (the "
                f"sentinels named a new master of {pool.service_name!r}); nothing was sent, retry"
            ) from None


class _CheckedSSL(_Checked, SentinelManagedSSLConnection):
    """``_Checked`` over TLS."""


class SentinelRedis(aioredis.Redis):
    """The master of a Sentinel service; closing it also closes the connections to the sentinels.

    redis-py leaves those open; the client made from a URL owns both, so
    ``Client.aclose`` must close both. Each sentinel is a plain client in the
    public ``Sentinel.sentinels`` (redis-py 5.0 to 8.2), closed here one by
    one, as ``Sentinel.aclose`` does where it exists (8.1 and later).
    """

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            pool: Any = self.connection_pool  # a SentinelConnectionPool (see sentinel_redis)
            results = await asyncio.gather(
                *(sentinel.aclose() for sentinel in pool.sentinel_manager.sentinels), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result


class SentinelURL:
    """A parsed sentinel URL: where the sentinels are and how to reach the master."""

    def __init__(self, url: str) -> None:
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in SENTINEL_SCHEMES:
            raise ConfigurationError(
                f"sentinel URL {redact_url(url)!r}: use redis+sentinel:// or rediss+sentinel://"
            )
        self.tls = scheme == "rediss+sentinel"
        # The query first: its values may hold slashes (ssl_ca_certs=/etc/ssl/ca.pem).
        body, _, query = rest.partition("?")
        netloc, _, path = body.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        self.sentinels: list[tuple[str, int]] = []
        for part in hosts.split(","):
            parsed = urlsplit(f"//{part}")
            if not parsed.hostname:
                raise ConfigurationError(
                    f"sentinel URL {redact_url(url)!r}: empty sentinel address in {hosts!r} "
                    "(use host:port[,host:port...])"
                )
            try:
                port = parsed.port or DEFAULT_SENTINEL_PORT
            except ValueError:
                raise ConfigurationError(f"sentinel URL {redact_url(url)!r}: bad port in {part!r}") from None
            self.sentinels.append((unquote(parsed.hostname), port))
        parts = path.split("/")
        if parts and parts[-1] == "":
            parts.pop()  # a trailing slash
        if not parts or not parts[0]:
            raise ConfigurationError(
                f"sentinel URL {redact_url(url)!r} names no service: use "
                "redis+sentinel://host:26379[,host:port...]/SERVICE[/DB] (SERVICE as in "
                "'sentinel monitor SERVICE ...')"
            )
        if len(parts) > 2:
            raise ConfigurationError(
                f"sentinel URL {redact_url(url)!r}: too many path parts in {path!r}, expected /SERVICE[/DB]"
            )
        self.service = unquote(parts[0])
        db: int | None = None
        if len(parts) == 2:
            if not parts[1].isdigit():
                raise ConfigurationError(
                    f"sentinel URL {redact_url(url)!r}: the database {parts[1]!r} is not a number "
                    "(use /SERVICE/DB, DB >= 0)"
                )
            db = int(parts[1])
        options = parse_qsl(query, keep_blank_values=True)
        own = {k: v for k, v in options if k in _SENTINEL_OPTIONS}
        rest_query = urlencode([(k, v) for k, v in options if k not in _SENTINEL_OPTIONS])
        # redis-py reads the credentials and the options (their types, its
        # errors); the host is a placeholder, Sentinel supplies the master's.
        base = "rediss" if self.tls else "redis"
        try:
            kwargs: dict[str, Any] = dict(
                aioredis.connection.parse_url(f"{base}://{userinfo}{at}sentinel/?{rest_query}")
            )
        except ValueError as exc:
            raise ConfigurationError(f"sentinel URL {redact_url(url)!r}: {exc}") from None
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        # SentinelConnectionPool picks its connection class from ``ssl``.
        kwargs.pop("connection_class", None)
        if self.tls:
            kwargs["ssl"] = True
        if db is not None:
            kwargs["db"] = db
        self.master_kwargs = kwargs
        sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith(("socket_", "ssl"))}
        for key, value in own.items():
            sentinel_kwargs[key.removeprefix("sentinel_")] = value
        self.sentinel_kwargs = sentinel_kwargs


def sentinel_redis(url: str, **defaults: Any) -> SentinelRedis:
    """The master of the service named in ``url``, through redis-py's ``Sentinel``.

    ``defaults`` (``socket_timeout=5.0``, ``ssl_check_hostname=True``, ...)
    apply where the URL does not set the same option, to the master's
    connections and the sentinels' alike.
    Nothing connects here: the first command asks a sentinel for the master.
    """
    from redis.asyncio.sentinel import Sentinel

    parsed = SentinelURL(url)
    master_kwargs = {**defaults, **parsed.master_kwargs}
    sentinel_kwargs = {
        **{k: v for k, v in defaults.items() if k.startswith(("socket_", "ssl_"))},
        **parsed.sentinel_kwargs,
    }
    manager = Sentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs, **master_kwargs)
    client: SentinelRedis = manager.master_for(
        parsed.service,
        redis_class=SentinelRedis,
        connection_pool_class=_CheckedPool,
        connection_class=_CheckedSSL if parsed.tls else _Checked,
        decode_responses=False,
    )
    return client


__all__ = ["SENTINEL_SCHEMES", "SentinelRedis", "SentinelURL", "sentinel_redis"]
