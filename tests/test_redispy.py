"""The transport's fence (_transport/redispy.py): its assumptions hold on the installed redis-py.

``.ci/run`` runs this file on the oldest and the newest redis-py the pin
allows, so a release that moves one of the private parts the package relies on
fails here, by name, before it fails in the lane or the dedup merge. The last
test keeps those parts inside the fence.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import tokenize
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError, WatchError

import venturi_redis
from tests.servers import RedisServer
from venturi_redis._transport import redispy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def conn(redis_server: RedisServer) -> AsyncIterator[Connection]:
    c = Connection(port=redis_server.port, health_check_interval=30)
    try:
        yield c
    finally:
        await c.disconnect()


async def test_a_connected_connection_shows_its_stream_and_its_error_mapper(conn: Connection) -> None:
    assert redispy.stream_writer(conn) is None and redispy.handshaken_transport(conn) is None
    await conn.connect()  # type: ignore[no-untyped-call]
    writer = redispy.stream_writer(conn)
    assert isinstance(writer, asyncio.StreamWriter)
    stream = redispy.handshaken_transport(conn)
    assert stream is not None
    transport, parse_error = stream
    assert transport is writer.transport
    assert isinstance(parse_error("NOSCRIPT No matching script"), NoScriptError)
    err = parse_error("ERR something else")
    assert type(err) is ResponseError and str(err) == "something else"
    await conn.disconnect()
    assert redispy.stream_writer(conn) is None


async def test_unread_bytes_after_the_handshake_refuse_the_takeover(conn: Connection) -> None:
    await conn.connect()  # type: ignore[no-untyped-call]
    await conn.send_command("PING")
    await asyncio.sleep(0.05)
    assert await redispy.stale_check(conn)()  # the reply waits unread
    assert redispy.handshaken_transport(conn) is None  # (a look at the buffer reads nothing)
    assert await conn.read_response() == b"PONG"
    assert not await redispy.stale_check(conn)()
    assert redispy.handshaken_transport(conn) is not None


async def test_a_swapped_protocol_hears_the_socket_and_hands_the_end_back(conn: Connection) -> None:
    await conn.connect()  # type: ignore[no-untyped-call]
    stream = redispy.handshaken_transport(conn)
    assert stream is not None
    transport = stream[0]
    heard: list[bytes] = []

    class Probe(asyncio.Protocol):
        previous: asyncio.BaseProtocol

        def data_received(self, data: bytes) -> None:
            heard.append(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.previous.connection_lost(exc)

    probe = Probe()
    probe.previous = redispy.swap_protocol(transport, probe)
    assert isinstance(probe.previous, asyncio.StreamReaderProtocol)
    transport.write(b"*1\r\n$4\r\nPING\r\n")
    for _ in range(100):
        if heard:
            break
        await asyncio.sleep(0.01)
    assert b"".join(heard) == b"+PONG\r\n"
    # redis-py's own disconnect waits for the stream protocol to hear the end.
    await asyncio.wait_for(conn.disconnect(), 5)
    assert not conn.is_connected


async def test_the_health_check_clock_is_redis_pys(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    assert redispy.health_check_due(conn, loop.time())  # never checked yet
    await conn.send_command("PING")
    assert await conn.read_response() == b"PONG"
    # redis-py moved it on after its own reply, on the event loop's clock.
    assert not redispy.health_check_due(conn, loop.time())
    assert redispy.health_check_due(conn, loop.time() + 31)
    redispy.health_checked(conn, loop.time() + 100)
    assert not redispy.health_check_due(conn, loop.time() + 120)


async def test_connections_from_a_pool_and_beside_it(redis_server: RedisServer) -> None:
    r = aioredis.Redis(port=redis_server.port, socket_timeout=5)
    try:
        pool = r.connection_pool
        conn = await redispy.pooled_connection(pool)  # no warning, no command name
        await pool.release(conn)
        aside = redispy.unpooled_connection(pool)
        untimed = redispy.unpooled_connection(pool, untimed=True)
        assert aside.socket_timeout == 5 and untimed.socket_timeout is None
        for c in (aside, untimed):
            await c.send_command("PING")
            assert await c.read_response() == b"PONG"
            assert c not in pool._in_use_connections and c not in pool._available_connections
            await c.disconnect()
    finally:
        await r.aclose()


def test_a_pool_takes_the_connection_class_it_was_given_whatever_the_url_says() -> None:
    """redis-py before 8.2 drops a class given for ``rediss://``: set on the pool, it holds on any release."""
    from redis.asyncio.connection import ConnectionPool, SSLConnection, UnixDomainSocketConnection

    from venturi_redis._transport.fastpack import FastPackSSLConnection

    pool = ConnectionPool.from_url("rediss://127.0.0.1:1/0", connection_class=FastPackSSLConnection)
    assert issubclass(FastPackSSLConnection, pool.connection_class)  # SSLConnection before 8.2
    redispy.use_connection_class(pool, FastPackSSLConnection)
    assert pool.connection_class is FastPackSSLConnection
    assert isinstance(pool.make_connection(), SSLConnection)
    unix = ConnectionPool.from_url("unix:///tmp/none.sock")
    redispy.use_connection_class(unix, FastPackSSLConnection)  # not a subclass of its class: kept
    assert unix.connection_class is UnixDomainSocketConnection


def test_a_pool_opens_its_connections_as_a_class_derived_from_its_own() -> None:
    """``memory://``'s connections: a subclass of the class fakeredis's pool chose, made from it."""
    from redis.asyncio.connection import Connection, ConnectionPool

    pool = ConnectionPool.from_url("redis://127.0.0.1:1/0")
    seen: list[type] = []

    def derive(base: type) -> type:
        seen.append(base)
        return type("Derived", (base,), {})

    redispy.derive_connection_class(pool, derive)
    assert seen == [Connection]
    assert pool.connection_class.__name__ == "Derived" and issubclass(pool.connection_class, Connection)
    assert type(pool.make_connection()) is pool.connection_class


def test_a_blocking_pool_hands_out_a_connection(redis_server: RedisServer) -> None:
    import redis

    r = redis.Redis(port=redis_server.port)
    try:
        conn = redispy.pooled_sync_connection(r.connection_pool)
        conn.send_command("PING")
        assert conn.read_response() == b"PONG"
        r.connection_pool.release(conn)
    finally:
        r.close()


async def test_a_pinned_pipeline_watches_on_its_connection_and_unwatches_on_reset(
    redis_server: RedisServer,
) -> None:
    r = aioredis.Redis(port=redis_server.port)
    try:
        pipe = r.pipeline(transaction=True)
        assert isinstance(pipe, Pipeline)
        conn = await redispy.pin_connection(pipe)
        await conn.send_packed_command(conn.pack_commands([("WATCH", "k"), ("HGETALL", "h")]))
        await redispy.pipeline_reply(pipe, conn, "WATCH")
        assert pipe.watching
        assert await redispy.pipeline_reply(pipe, conn, "HGETALL") == {}  # redis-py's callback ran
        await r.set("k", "changed")  # another connection writes the watched key
        pipe.multi()
        pipe.set("k", "mine")
        with pytest.raises(Exception, match="Watched variable changed"):
            await pipe.execute()
        assert await r.get("k") == b"changed"
        pipe2 = r.pipeline(transaction=True)
        await redispy.pin_connection(pipe2)
        pipe2.watching = True
        redispy.forget_watch(pipe2)
        assert not pipe2.watching
        await pipe2.reset()
        await pipe.reset()
    finally:
        await r.aclose()


def test_a_watch_lost_with_its_connection_is_told_from_a_lost_race() -> None:
    """The shapes redis-py raises a WatchError in (the dedup merge's lost-EXEC tests run the real ones)."""

    def raised(make: Any) -> BaseException:
        try:
            make()
        except WatchError as exc:
            return exc
        raise AssertionError("no WatchError")

    def inside_handler() -> None:
        try:
            raise RedisConnectionError("gone")
        except RedisConnectionError:
            raise WatchError("A ConnectionError occurred on while watching one or more keys") from None

    def inside_handler_keeping_context() -> None:
        try:
            raise RedisConnectionError("gone")
        except RedisConnectionError:
            raise WatchError("A ConnectionError occurred on while watching one or more keys")  # noqa: B904

    def from_it() -> None:
        raise WatchError("watched key changed") from RedisConnectionError("gone")

    def a_lost_race() -> None:
        raise WatchError("Watched variable changed.")

    assert redispy.watch_lost_with_connection(raised(inside_handler_keeping_context))
    assert redispy.watch_lost_with_connection(raised(from_it))
    assert not redispy.watch_lost_with_connection(raised(a_lost_race))
    assert not redispy.watch_lost_with_connection(raised(inside_handler))  # context suppressed: unknown


def test_a_fresh_cluster_client_says_it_has_no_slot_map() -> None:
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)])  # never connected
    assert redispy.cluster_uninitialized(rc)
    assert redispy.is_cut_connection(AttributeError("'NoneType' object has no attribute 'writelines'"))
    assert not redispy.is_cut_connection(AttributeError("'Foo' object has no attribute 'bar'"))


async def test_a_pool_at_its_bound_says_so_before_it_hands_anything_out(redis_server: RedisServer) -> None:
    """``pool_full``: redis-py's "Too many connections", asyncio and blocking; nothing left in use."""
    import redis

    from venturi_redis._transport.redispy_pools import pool_full

    pool = aioredis.ConnectionPool(port=redis_server.port, max_connections=1)
    conn = await redispy.pooled_connection(pool)
    with pytest.raises(RedisConnectionError) as err:
        await redispy.pooled_connection(pool)
    assert pool_full(err.value) and pool._in_use_connections == {conn}
    await pool.release(conn)
    await pool.disconnect()
    sync_pool = redis.ConnectionPool(port=redis_server.port, max_connections=1)
    sconn = redispy.pooled_sync_connection(sync_pool)
    with pytest.raises(RedisConnectionError) as serr:
        redispy.pooled_sync_connection(sync_pool)
    assert pool_full(serr.value) and sync_pool._in_use_connections == {sconn}
    sync_pool.release(sconn)
    sync_pool.disconnect()


async def test_a_connection_the_server_refused_goes_back_disconnected() -> None:
    """At ``maxclients``: the refusal's text (``server_full``), the refused connection put back
    unconnected, and ``_take_connected_first`` finding the pool's idle connected one."""
    import redis

    from venturi_redis._transport import redispy_pools
    from venturi_redis._transport.errors import server_full
    from venturi_redis._transport.fastpack import FastPackConnection

    with RedisServer("--maxclients", "3") as server:
        # The client's connection class: it names the refusal on redis-py 5 to 7 too (ReadsRefusal).
        pool = aioredis.ConnectionPool(port=server.port, connection_class=FastPackConnection)
        first, second = await redispy.pooled_connection(pool), await redispy.pooled_connection(pool)
        await pool.release(first)
        hog = redis.Redis(port=server.port)
        hog.ping()  # the third, and last, client
        try:
            # The idle one is taken first (LIFO); then the pool makes a new one, refused.
            assert await redispy.pooled_connection(pool) is first
            with pytest.raises(RedisConnectionError) as err:
                await redispy.pooled_connection(pool)
            assert server_full(err.value) and redispy_pools._in_use(pool) == 2
            (refused,) = pool._available_connections
            assert not refused.is_connected
            assert not redispy_pools._take_connected_first(pool)  # none idle and connected
            await pool.release(second)
            assert redispy_pools._take_connected_first(pool)
            assert pool._available_connections[-1] is second
            assert await redispy.pooled_connection(pool) is second
        finally:
            hog.close()
            await pool.disconnect()


async def test_the_refusal_at_maxclients_is_read_on_every_release() -> None:
    """redis-py 8 raises the server's refusal itself; before 8 it fails writing its handshake
    ("Connection lost") with the refusal unread, which ``ReadsRefusal`` reads (``refusal_unread``)."""
    import redis

    from venturi_redis._transport.errors import server_full
    from venturi_redis._transport.fastpack import FastPackConnection, FastPackSSLConnection

    assert issubclass(FastPackConnection, redispy.ReadsRefusal)
    assert issubclass(FastPackSSLConnection, redispy.ReadsRefusal)
    with RedisServer("--maxclients", "1") as server:
        hog = redis.Redis(port=server.port)
        hog.ping()
        try:
            conn = FastPackConnection(port=server.port, socket_timeout=5)
            with pytest.raises(RedisConnectionError) as err:
                await conn.connect()  # type: ignore[no-untyped-call]
            assert server_full(err.value), repr(err.value)
            assert not server_full(RedisConnectionError("Error while writing to socket: Connection lost"))
        finally:
            hog.close()


def test_a_sibling_pool_opens_the_same_connections() -> None:
    from redis.asyncio.connection import ConnectionPool

    from venturi_redis._transport.fastpack import FastPackConnection

    pool = ConnectionPool.from_url(
        "redis://u:p@127.0.0.1:1/3?client_name=web", connection_class=FastPackConnection
    )
    sibling = redispy.sibling_pool(pool, 1)
    assert type(sibling) is ConnectionPool and sibling.max_connections == 1
    assert sibling.connection_class is FastPackConnection
    same = ("host", "port", "db", "username", "password", "client_name", "socket_timeout")
    assert {k: sibling.connection_kwargs.get(k) for k in same} == {
        "host": "127.0.0.1", "port": 1, "db": 3, "username": "u", "password": "p", "client_name": "web",
        "socket_timeout": None,
    }  # fmt: skip


# Attributes and methods of redis-py's (or asyncio's) objects that only the fence may touch.
_FENCED = {
    "_reader",
    "_writer",
    "_parser",
    "_buffer",
    "_initialize",
    "next_health_check",
    "can_read",
    "can_read_destructive",
    "watching",
    "parse_response",
    "get_connection",
    "make_connection",
    "connection_class",
    "get_protocol",
    "set_protocol",
    "_available_connections",
    "_in_use_connections",
}


def _reaches(path: Path) -> list[str]:
    """``.name`` accesses of fenced names in ``path``, and strings naming the cut connection."""
    found: list[str] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for prev, tok in itertools.pairwise(tokens):
        if tok.type == tokenize.NAME and prev.string == "." and tok.string in _FENCED:
            found.append(f"{path.name}:{tok.start[0]}: .{tok.string}")
        if tok.type == tokenize.STRING and tok.string.strip("\"'") == "NoneType":
            found.append(f"{path.name}:{tok.start[0]}: {tok.string}")
    return found


def test_only_the_fence_reaches_into_redis_py() -> None:
    root = Path(venturi_redis.__file__).parent
    fence = {root / "_transport" / "redispy.py", root / "_transport" / "redispy_pools.py"}
    assert all(_reaches(path) for path in fence)  # the scan sees what it looks for
    found = [hit for path in sorted(root.rglob("*.py")) if path not in fence for hit in _reaches(path)]
    assert found == []
