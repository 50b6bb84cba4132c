"""The fence: every use of redis-py's (and asyncio's) private parts, in one place.

The speed work (the enqueue lane, hiredis packing, the blocking direct
enqueue, a claim pipelined behind its BLPOP, the dedup merge's one-write
WATCH) and two cluster workarounds reach below redis-py's documented API.
Each such reach is a function here, and nowhere else, with a comment naming
what it relies on: the attribute or method, and the redis-py releases it was
checked on. ``tests/test_redispy.py`` checks each assumption against the
installed redis-py, and ``.ci/run`` runs it (with the contract suite) on the
oldest and the newest release ``pyproject.toml`` allows, so a release that
moves one of them fails there, not in production.

Checked on (CI, every run): redis-py 5.0.1 with hiredis 3.0.0 (the oldest
the pin ``redis[hiredis]>=5.0.1,<9``, ``hiredis>=3.0`` allows, in
``.venv-oldest``) and redis-py 8.2.0 with hiredis 3.5.0 (the newest, in
``.venv``); a single Redis and Sentinel on both, Redis Cluster on 8.2 only
(below it ``cluster.require_cluster_support`` refuses it). Each part below
gives the range it holds on (read in the sources of the releases between;
run by CI on the two ends) and, where a release in the pin lacks it, what
the code does there instead: its fallback, or the feature's gate
(docs/operations.md, "Supported redis-py", tabulates what works on which
release).

The bounded pools that wait (``WaitingPool``, for the client's pool) reach
into redis-py's pools too: they are the fence's second module,
``redispy_pools.py``, under the same rules.

Everything else the package does with redis-py goes through its public API
(``execute_command``, pipelines, ``send_packed_command`` / ``read_response``,
``pack_command``, ``make_connection``), which these notes do not repeat.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio.connection import ConnectionPool as AsyncConnectionPool
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# -- the release ---------------------------------------------------------------


@functools.cache
def release() -> tuple[int, int, int]:
    """The installed redis-py's release, ``(8, 2, 0)``: what the gates of newer-only features read.

    ``redis.__version__`` (public, 5.0 to 8.2); a part that is not a number
    (``0b1``) counts by its leading digits.
    """
    import redis

    numbers = [int(re.sub(r"\D.*", "", part) or 0) for part in redis.__version__.split(".")[:3]]
    major, minor, patch = (*numbers, 0, 0, 0)[:3]
    return major, minor, patch


# -- redis.asyncio connections -------------------------------------------------


def stream_writer(conn: Any) -> asyncio.StreamWriter | None:
    """The ``asyncio.StreamWriter`` of a connected ``redis.asyncio`` connection, else None.

    Relies on ``AbstractConnection._writer`` (redis-py 5.0 to 8.2: set by
    ``connect``, None again after ``disconnect``). Used by the hiredis-packed
    connection (fastpack.py) on every write, to write without
    ``asyncio.wait_for``, and to abort a connection it gives up on: a plain
    read, no ``getattr`` default or type check on that path (a redis-py
    without it fails tests/test_redispy.py, not silently).
    """
    writer: asyncio.StreamWriter | None = conn._writer
    return writer


def handshaken_transport(conn: Any) -> tuple[Any, Callable[[Any], Exception]] | None:
    """The transport under a freshly connected ``redis.asyncio`` connection, and its error mapper.

    For the enqueue lane's take-over (lane.py): returns None, and the lane
    reads through redis-py, unless everything it relies on is there:

    - ``AbstractConnection._reader`` / ``_writer``: the ``StreamReader`` and
      ``StreamWriter`` redis-py reads and writes through (5.0 to 8.2);
    - ``AbstractConnection._parser.parse_error``: the classmethod turning an
      error reply's text into redis-py's exception class (``NoScriptError``,
      ``ResponseError``, ...) (``BaseParser.parse_error``, 5.0 to 8.2);
    - ``asyncio.StreamReader._buffer`` (CPython 3.11 to 3.13): the bytes read
      but not consumed; after the handshake (AUTH, SELECT, HELLO,
      CLIENT SETNAME) it must be empty, or a reply would be lost in the swap;
    - the hiredis parser's own ``hiredis.Reader``, ``_AsyncHiredisParser._reader``
      (5.0 to 8.2), empty too (``Reader.has_data``, hiredis 3.0 and later): the
      parser may have moved bytes out of the stream (redis-py before 8.0
      does, in ``can_read_destructive``). A connection with another parser
      (redis-py's pure-Python one, never chosen while hiredis is installed)
      is not taken over.
    """
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    parser = getattr(conn, "_parser", None)
    parse_error = getattr(parser, "parse_error", None)
    if not isinstance(reader, asyncio.StreamReader) or not isinstance(writer, asyncio.StreamWriter):
        return None
    unread: Any = getattr(reader, "_buffer", b"")
    parsed = getattr(getattr(parser, "_reader", None), "has_data", None)
    if not callable(parse_error) or unread or not callable(parsed) or parsed():
        return None
    return writer.transport, parse_error


def swap_protocol(transport: Any, protocol: asyncio.BaseProtocol) -> asyncio.BaseProtocol:
    """Put ``protocol`` on ``transport`` in place of redis-py's stream protocol; the one it replaced.

    ``get_protocol`` / ``set_protocol`` are public asyncio API (and uvloop's).
    What is not documented is that redis-py survives it: after the swap its
    ``StreamReader`` is never fed again, and its ``disconnect`` waits in
    ``StreamWriter.wait_closed`` for the replaced ``StreamReaderProtocol`` to
    hear ``connection_lost``, which the new protocol must forward (the lane's
    ``_Wire`` does). Checked with redis-py 5.0.1 and 8.2, asyncio and uvloop,
    TCP and TLS (tests/test_lane.py).
    """
    previous: asyncio.BaseProtocol = transport.get_protocol()
    transport.set_protocol(protocol)
    return previous


def stale_check(conn: Any) -> Callable[[], Awaitable[bool]]:
    """The check the pool runs on a connection before handing it out: unread data, or closed.

    ``AbstractConnection.can_read`` (8.0 to 8.2); before 8.0 the same check
    is ``can_read_destructive`` (5.0 to 7.4), which 8.0 deprecated and warns
    when called, so it is taken only where ``can_read`` is missing.
    """
    check: Callable[[], Awaitable[bool]] | None = getattr(conn, "can_read", None)
    if check is None:
        check = conn.can_read_destructive
    return check


def health_check_due(conn: Any, now: float) -> bool:
    """Whether ``conn`` has been idle long enough to be PINGed first (its ``health_check_interval`` set).

    Relies on ``AbstractConnection.next_health_check``: the event loop's time
    after which redis-py's own ``check_health`` PINGs (-1 before the first
    command), which redis-py moves on after each reply it reads (5.0 to 8.2).
    The caller checks the public ``health_check_interval`` first (0: never).
    """
    return bool(now >= conn.next_health_check)


def health_checked(conn: Any, now: float) -> None:
    """A reply just came on ``conn``: its next health check is an interval from ``now``.

    What redis-py's ``read_response`` does to ``next_health_check`` (see
    ``health_check_due``), for the replies the lane reads itself.
    """
    conn.next_health_check = now + conn.health_check_interval


def unpooled_connection(pool: Any, *, untimed: bool = False) -> Any:
    """A new connection made by ``pool`` (same address, credentials and options), never handed out by it.

    ``ConnectionPool.make_connection`` is public but undocumented (4.2 to
    8.2). ``untimed``: no socket timeout on this connection (the caller bounds
    its calls itself); relies on redis-py reading
    ``AbstractConnection.socket_timeout`` at each read and write (5.0 to 8.2).
    """
    conn = pool.make_connection()
    if untimed:
        conn.socket_timeout = None
    return conn


def refusal_unread(conn: Any) -> bool:
    """Whether the server's refusal at ``maxclients`` sits unread on ``conn``'s stream.

    Redis answers a connection past ``maxclients`` with ``-ERR max number of
    clients reached`` and closes it. redis-py before 8 writes its handshake
    (``CLIENT SETINFO``) before it reads anything, and fails writing it
    ("Connection lost"), the refusal left unread in the connection's
    ``StreamReader``: ``AbstractConnection._reader`` and
    ``asyncio.StreamReader._buffer`` (5.0 to 8.2, CPython 3.11 to 3.13).
    redis-py 8 reads it and raises ``MaxClientsReachedError`` itself.
    """
    buffered = getattr(getattr(conn, "_reader", None), "_buffer", b"")
    return b"max number of clients reached" in bytes(buffered)


def server_said_full(exc: BaseException) -> bool:
    """Whether redis-py raised the server's refusal at ``maxclients`` itself (8.x: its own class)."""
    return type(exc).__name__ == "MaxClientsReachedError" or "max number of clients reached" in str(exc)


async def refuses_new_clients(host: str, port: int, wait: float = 0.5) -> bool:
    """Whether the server at ``host:port`` refuses a new connection at its ``maxclients`` now.

    A connection of our own that only listens: Redis sends the refusal
    unasked and closes, where a server that takes it says nothing until
    spoken to (so ``wait`` is all a listen costs). Only on the error path
    of a handshake that failed without saying why (``ReadsRefusal``).
    """
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), wait)
    except (OSError, TimeoutError):
        return False
    try:
        said = await asyncio.wait_for(reader.read(64), wait)
    except (OSError, TimeoutError):
        said = b""
    finally:
        writer.transport.abort()
    return said.startswith(b"-ERR max number of clients reached")


class ReadsRefusal:
    """Mixed in before a ``redis.asyncio`` connection class: a refusal at ``maxclients`` says so.

    redis-py 8 reads the server's refusal in the handshake and raises it.
    redis-py before 8 writes its handshake (``CLIENT SETINFO``) before it
    reads anything, and mostly fails writing it ("Connection lost"): the
    refusal, sent before the connection closed, is then unread or lost with
    it. Here ``on_connect`` (5.0 to 8.2) raises a handshake that failed that
    way with the refusal's own text when it was unread (``refusal_unread``,
    looked at by ``disconnect`` too, which redis-py runs first and which
    drops the reader) or, over plain TCP, when a connection that only
    listens is refused too (``refuses_new_clients``), so that
    ``errors.server_full`` tells it from a lost server. Nothing runs per
    command, nor on a handshake that succeeds.
    """

    _refused = False

    async def on_connect(self) -> None:
        base: Any = super()
        self._refused = False
        try:
            await base.on_connect()
        except (RedisConnectionError, OSError) as exc:
            if isinstance(exc, AuthenticationError) or server_said_full(exc):
                raise  # said why already
            if self._refused or refusal_unread(self) or await self._listen_refused():
                raise RedisConnectionError("max number of clients reached") from exc
            raise

    async def _listen_refused(self) -> bool:
        host, port = getattr(self, "host", None), getattr(self, "port", None)
        if getattr(self, "ssl_context", None) is not None or not isinstance(host, str) or not port:
            return False  # TLS: a listener would need the handshake; unix sockets are not this class's
        return await refuses_new_clients(host, int(port))

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        base: Any = super()
        if refusal_unread(self):
            self._refused = True
        await base.disconnect(*args, **kwargs)


# -- connection pools --------------------------------------------------------


def use_connection_class(pool: Any, connection_class: type) -> None:
    """Make ``pool`` open its connections as ``connection_class`` (a subclass of its own class).

    ``ConnectionPool.from_url`` lets the URL's scheme choose the class over a
    ``connection_class`` passed to it before redis-py 8.2 (``SSLConnection``
    for ``rediss://``: the hiredis-packed TLS class was silently dropped);
    8.2 keeps the one passed. Relies on ``ConnectionPool.connection_class``
    being read by ``make_connection`` for each new connection (5.0 to 8.2),
    so setting it before the first connection is the same as passing it.
    Only a subclass of the class the pool chose replaces it: a pool that
    chose something else (a Unix socket) keeps its own.
    """
    if pool.connection_class is not connection_class and issubclass(connection_class, pool.connection_class):
        pool.connection_class = connection_class


def derive_connection_class(pool: Any, derive: Callable[[Any], type]) -> None:
    """Make ``pool`` open its connections as ``derive(the class it opens them as)``, a subclass of it.

    For a pool whose class the package did not choose (fakeredis's, for
    ``memory://``: ``memory.py``). The same reach as ``use_connection_class``:
    ``ConnectionPool.connection_class``, read by ``make_connection`` for each
    new connection (5.0 to 8.2).
    """
    use_connection_class(pool, derive(pool.connection_class))


@functools.cache
def _wants_command_name(pool_class: Any) -> bool:
    """Whether ``pool_class.get_connection`` must be given a command name.

    ``ConnectionPool.get_connection(command_name, *keys, **options)`` required
    it before redis-py 5.3 (5.0 to 5.2, never used), made it optional in 5.3
    and warns when given one since 6.0: it is passed only where the
    signature has no default for it. Read once per pool class.
    """
    param = inspect.signature(pool_class.get_connection).parameters.get("command_name")
    return param is not None and param.default is inspect.Parameter.empty


async def pooled_connection(pool: Any) -> Any:
    """A connection from a ``redis.asyncio`` pool, to be given back with ``pool.release``.

    ``ConnectionPool.get_connection`` (5.0 to 8.2; see ``_wants_command_name``).
    """
    if _wants_command_name(pool.__class__):
        return await pool.get_connection("_")
    return await pool.get_connection()


def pooled_sync_connection(pool: Any) -> Any:
    """A connection from a blocking ``redis`` pool (``get_connection``: see ``pooled_connection``)."""
    if _wants_command_name(pool.__class__):
        return pool.get_connection("_")
    return pool.get_connection()


def sibling_pool(pool: Any, max_connections: int) -> Any:
    """A new plain ``redis.asyncio`` pool whose connections are ``pool``'s: same class, address, options.

    ``ConnectionPool.connection_class`` and the public ``connection_kwargs``
    (5.0 to 8.2), as ``make_connection`` reads them.
    """
    return AsyncConnectionPool(
        connection_class=pool.connection_class, max_connections=max_connections, **pool.connection_kwargs
    )


# -- redis.asyncio pipelines (the dedup merge's WATCH) -------------------------


async def pin_connection(pipe: Any) -> Any:
    """Take a connection from ``pipe``'s pool and pin it to ``pipe``, as ``Pipeline.watch`` does.

    Relies on ``redis.asyncio.client.Pipeline.connection``: once set,
    ``multi()``, ``execute()`` and ``reset()`` use that connection, and
    ``reset()`` sends UNWATCH on it and gives it back to the pool (5.0 to 8.2).
    """
    conn = pipe.connection = await pooled_connection(pipe.connection_pool)
    return conn


async def pipeline_reply(pipe: Any, conn: Any, command_name: str) -> Any:
    """Read one reply on ``conn`` through ``pipe``'s own reply parsing.

    ``Pipeline.parse_response`` (5.0 to 8.2) applies redis-py's reply
    callbacks (a dict for HGETALL) and, for ``WATCH``, marks the pipeline as
    watching, so that ``multi()`` and ``reset()`` behave as after ``watch()``.
    """
    return await pipe.parse_response(conn, command_name)


def watch_lost_with_connection(exc: BaseException) -> bool:
    """Whether redis-py raised the ``WatchError`` ``exc`` because the watching connection failed.

    redis-py says so only by where it raises it: from inside its handler of
    the connection error (a single Redis, ``Pipeline._disconnect_raise_on_watching``:
    the error is the context) or ``from`` it (a cluster transaction), 5.0 to
    8.2. A connection lost after EXEC went out: applied or not, unknown.
    """
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return isinstance(cause, (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError))


def forget_watch(pipe: Any) -> None:
    """Tell ``pipe`` its WATCH is gone (its connection was closed): ``reset()`` sends no UNWATCH.

    ``Pipeline.watching`` (5.0 to 8.2).
    """
    pipe.watching = False


# -- redis.asyncio.cluster -----------------------------------------------------


def cluster_uninitialized(client: Any) -> bool:
    """Whether the async ``RedisCluster`` has not learnt its slot map yet (or must learn it again).

    ``RedisCluster._initialize`` (5.0 to 8.2; reached on 8.2 and later only,
    the Cluster floor): True until ``initialize()``
    has run, and set again by the error paths that need a refresh.
    """
    return bool(client._initialize)


def is_cut_connection(exc: AttributeError) -> bool:
    """Whether ``exc`` is how redis-py's async cluster fails a command whose connection it closed.

    When the cluster client resets itself (every ``reinitialize_steps``
    MOVEDs, or on CLUSTERDOWN) it closes the connections other coroutines are
    using; their commands then fail deep in redis-py with
    ``AttributeError: 'NoneType' object has no attribute 'writelines'`` (or
    ``read``...), the connection's ``_writer`` / ``_reader`` being None
    (8.1 and 8.2; reached on 8.2 and later only, the Cluster floor).
    Recognised by that text alone: there is nothing else.
    """
    return "NoneType" in str(exc)


def socket_timeout(redis: Any) -> float | None:
    """The read timeout of ``redis``'s pooled connections (a blocking read on one stays under it)."""
    inner = getattr(redis, "venturi_inner", redis)
    kwargs = getattr(getattr(inner, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:
        kwargs = getattr(inner, "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None


__all__ = [
    "ReadsRefusal",
    "cluster_uninitialized",
    "derive_connection_class",
    "forget_watch",
    "handshaken_transport",
    "health_check_due",
    "health_checked",
    "is_cut_connection",
    "pin_connection",
    "pipeline_reply",
    "pooled_connection",
    "pooled_sync_connection",
    "refusal_unread",
    "refuses_new_clients",
    "server_said_full",
    "release",
    "sibling_pool",
    "socket_timeout",
    "stale_check",
    "stream_writer",
    "swap_protocol",
    "unpooled_connection",
    "use_connection_class",
    "watch_lost_with_connection",
]
