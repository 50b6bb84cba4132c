"""The enqueue lane: a connection of the client's own for the enqueue script (lane.py).

It must change speed only: a stale connection is replaced before anything is
sent, an error or cancellation drops the connection and nothing is resent,
NOSCRIPT is recovered, and a busy lane leaves the call to the pool.

The lane's behaviour is tested on both of its read paths (``read_path``): its
own protocol on the transport (``_Wire``, the path a ``Client.from_url`` takes
on the redis-py and hiredis this project pins), and reading through redis-py
(``send_packed_command``, ``read_response``), which a connection the takeover
does not apply to takes (decoded replies, a redis-py without what the
takeover relies on, _transport/redispy.py). Only the one-timer deadline and
``_Wire`` itself are the own path's alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import hiredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

import venturi_redis as vr
from tests.chaos.proxy import Proxy
from tests.servers import RedisServer
from tests.tasks import Echo
from venturi_redis._transport.lane import Lane, _Wire

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Every lane test on asyncio's own loop and on uvloop, whose transports are not asyncio's.

    A web app under uvicorn runs on uvloop when it is installed, and enqueues from there.
    """
    if request.param == "uvloop":
        return ("asyncio", {"use_uvloop": True})
    return "asyncio"


@pytest.fixture(params=["own", "redis-py"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the lanes made during the test read their replies (module docstring)."""
    monkeypatch.setattr(Lane, "reads_own_replies", request.param == "own")
    return str(request.param)


@pytest.fixture(params=["plain", "tls"])
def server(request: pytest.FixtureRequest) -> RedisServer:
    """Each lane test runs over plain TCP and over TLS (``rediss://``)."""
    name = "redis_server" if request.param == "plain" else "tls_server"
    server: RedisServer = request.getfixturevalue(name)
    return server


@pytest.fixture
async def named(server: RedisServer, read_path: str) -> AsyncIterator[vr.Client]:
    """A client whose connections carry a name of their own, to find them in CLIENT LIST."""
    name = f"lane-{uuid.uuid4().hex[:8]}"
    c = vr.Client.from_url(server.url_with(client_name=name))
    try:
        yield c
    finally:
        await c.aclose()


async def _connections(r: aioredis.Redis, name: str) -> list[dict[str, Any]]:
    return [c for c in await r.client_list() if c.get("name") == name]


def _pool_calls(client: vr.Client, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record which connection each enqueue script call went out on."""
    seen: list[Any] = []
    real = client.sender.call

    async def call(c: Any) -> Any:
        seen.append(client.redis)
        return await real(c)

    monkeypatch.setattr(client.sender, "call", call)
    real_script = Lane.script

    async def script(lane: Lane, script: Any, keys: Any, args: Any) -> Any:
        seen.append(lane)
        return await real_script(lane, script, keys, args)

    monkeypatch.setattr(Lane, "script", script)
    return seen


async def test_only_a_plain_pooled_client_gets_a_lane(redis_server: RedisServer) -> None:
    plain = vr.Client.from_url(redis_server.url)
    assert plain.sender.lane is not None
    await plain.aclose()
    refused = [
        vr.Client.from_url("memory://lane-test"),
        vr.Client.from_url(redis_server.url, durable=1),
        # The caller's own client (whose pool the caller may close alone).
        vr.Client(aioredis.Redis.from_url(redis_server.url)),
    ]
    for client in refused:
        assert client.sender.lane is None
        await client.aclose()
    # Pools the lane must stay out of.
    single = aioredis.Redis.from_url(redis_server.url, single_connection_client=True)
    blocking = aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(redis_server.url))
    for r in (single, blocking):
        assert Lane.for_redis(r) is None
        await r.aclose()
    assert Lane.for_redis(aioredis.Redis.from_url(redis_server.url)) is not None


async def test_sequential_enqueues_go_out_on_the_lane(
    named: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _pool_calls(named, monkeypatch)
    q = named.queue(f"t-{uuid.uuid4().hex[:8]}")
    ids = [await q.enqueue(Echo(text=str(i))) for i in range(5)]
    assert all(isinstance(r, Lane) for r in seen) and len(seen) == 5
    assert [(await q.get(i)).state for i in ids] == [vr.JobState.PENDING] * 5  # type: ignore[union-attr]
    # One connection carried them all.
    conns = await _connections(named.redis, named.redis.connection_pool.connection_kwargs["client_name"])
    assert sum(c["cmd"] == "evalsha" for c in conns) == 1


async def test_a_connection_killed_while_idle_is_replaced_before_the_next_enqueue(
    named: vr.Client, server: RedisServer
) -> None:
    q = named.queue(f"t-{uuid.uuid4().hex[:8]}")
    await q.enqueue(Echo(text="first"))
    name = named.redis.connection_pool.connection_kwargs["client_name"]
    admin = aioredis.Redis.from_url(server.url)
    try:
        (lane_conn,) = [c for c in await _connections(admin, name) if c["cmd"] == "evalsha"]
        await admin.client_kill_filter(_id=lane_conn["id"])
        await anyio.sleep(0.05)  # the close reaches the client's event loop
        second = await q.enqueue(Echo(text="second"))  # no error: the dead connection is noticed first
        assert (await q.get(second)) is not None
        assert (await q.stats()).eligible == 2
    finally:
        await admin.aclose()


async def test_noscript_on_the_lane_runs_the_source(
    named: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _pool_calls(named, monkeypatch)
    q = named.queue(f"t-{uuid.uuid4().hex[:8]}")
    await q.enqueue(Echo(text="a"))
    await named.redis.script_flush()
    job = await q.enqueue(Echo(text="b"))
    assert (await q.get(job)) is not None
    assert all(isinstance(r, Lane) for r in seen)


async def test_a_silent_connection_times_out_drops_the_lane_and_resends_nothing(
    server: RedisServer, read_path: str
) -> None:
    proxy = await Proxy(server.port).start()
    client = vr.Client.from_url(server.url_with(proxy.port, socket_timeout=0.5))
    direct = vr.Client.from_url(server.url)
    name = f"t-{uuid.uuid4().hex[:8]}"
    try:
        q = client.queue(name)
        await q.enqueue(Echo(text="before"))
        # That first enqueue also recorded the queue in the registry through the pool (one
        # ZADD, _producer/registry.py): its idle connection would go silent too, and closing a
        # TLS connection waits for the peer (5 s, or for ever on uvloop). This test is the lane's.
        await client.redis.connection_pool.disconnect()
        proxy.blackhole()  # the lane's connection now swallows everything
        with pytest.raises(RedisTimeoutError):
            await q.enqueue(Echo(text="lost"))
        lane = client.sender.lane
        assert lane is not None and not lane._conn.is_connected
        await q.enqueue(Echo(text="after"))  # a new connection, through the proxy again
        texts = sorted(
            Echo.model_validate(info.payload).text  # type: ignore[union-attr]
            for info in [await direct.queue(name).get(i) for i in await _pending_ids(direct, name)]
        )
        assert texts == ["after", "before"]  # the swallowed call was not sent again
    finally:
        await client.aclose()
        await direct.aclose()
        await proxy.aclose()


async def _pending_ids(client: vr.Client, name: str) -> list[str]:
    keys = client.queue(name).keys
    ids: list[str] = []
    for priority in vr.Priority:
        ids += [m.decode() for m in await client.redis.zrange(keys.pending(priority), 0, -1)]
    return ids


async def test_a_cancelled_enqueue_drops_the_lane_connection(server: RedisServer, read_path: str) -> None:
    proxy = await Proxy(server.port).start()
    client = vr.Client.from_url(server.url_with(proxy.port))
    try:
        q = client.queue(f"t-{uuid.uuid4().hex[:8]}")
        await q.enqueue(Echo(text="warm"))
        proxy.pause()
        with anyio.move_on_after(0.3):
            await q.enqueue(Echo(text="held"))
        lane = client.sender.lane
        assert lane is not None and not lane._conn.is_connected
        proxy.resume()
        job = await q.enqueue(Echo(text="next"))
        assert (await q.get(job)) is not None
    finally:
        await client.aclose()
        await proxy.aclose()


async def test_a_busy_lane_leaves_other_queues_to_the_pool(
    named: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _pool_calls(named, monkeypatch)
    queues = [named.queue(f"t-{uuid.uuid4().hex[:8]}") for _ in range(3)]
    ids: list[tuple[vr.Queue, str]] = []

    async def produce(q: vr.Queue) -> None:
        for i in range(20):
            ids.append((q, await q.enqueue(Echo(text=str(i)))))

    async with anyio.create_task_group() as tg:
        for q in queues:
            tg.start_soon(produce, q)
    assert len(ids) == 60
    for q, job in ids:
        assert (await q.get(job)) is not None
    assert any(isinstance(r, Lane) for r in seen)
    assert any(r is named.redis for r in seen)  # the lane was busy at least once
    lane = named.sender.lane
    assert lane is not None and not lane.busy


async def test_aclose_closes_the_lane_connection(named: vr.Client, server: RedisServer) -> None:
    await named.queue("t-close").enqueue(Echo(text="x"))
    name = named.redis.connection_pool.connection_kwargs["client_name"]
    await named.aclose()
    admin = aioredis.Redis.from_url(server.url)
    try:
        with anyio.fail_after(5):
            while await _connections(admin, name):
                await anyio.sleep(0.02)
    finally:
        await admin.aclose()


# -- the direct read path (_Wire): redis-py connects, the lane reads its own replies --


async def test_a_url_clients_lane_reads_its_replies_itself(
    named: vr.Client, anyio_backend: Any, read_path: str
) -> None:
    """On the redis-py this project is tested with, the takeover applies (else it is only slower)."""
    on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    assert on_uvloop == (anyio_backend != "asyncio")  # the loop parametrization is real
    await named.queue(f"t-{uuid.uuid4().hex[:8]}").enqueue(Echo(text="x"))
    lane = named.sender.lane
    assert lane is not None and lane.direct == (read_path == "own")  # the read_path switch is real


async def test_a_lane_on_decoded_replies_reads_through_redis_py(server: RedisServer) -> None:
    """How the fallback is chosen without the switch: a connection whose replies redis-py decodes.

    ``_Wire`` hands on hiredis's bytes; a lane over a caller's
    ``decode_responses=True`` pool must leave the replies to redis-py.
    """
    r = aioredis.Redis.from_url(server.url_with(), decode_responses=True)
    lane = Lane.for_redis(r)
    assert lane is not None
    client = vr.Client.from_url(server.url_with())
    script = client.sender._scripts["enqueue"]
    try:
        with pytest.raises(ResponseError):  # no keys: enqueue.lua refuses (an error reply, raised)
            await lane.script(script, [], [])
        assert not lane.direct and lane._conn.is_connected  # an error reply leaves it in step
        assert await lane._round_trip("ECHO", "décodé") == "décodé"
    finally:
        await lane.aclose()
        await r.aclose()
        await client.aclose()


async def test_calls_spanning_many_socket_timeouts_do_not_time_out(server: RedisServer) -> None:
    """One timer serves every call: each call's own deadline counts, never the first one's.

    The lane's own read path only: through redis-py each read has a timeout of its own.
    The timeout is long enough for any one call on a loaded machine (at 0.05 s,
    calls starved of a core for that long timed out in CI, as configured).
    """
    client = vr.Client.from_url(server.url_with(socket_timeout=0.5))
    try:
        q = client.queue(f"t-{uuid.uuid4().hex[:8]}")
        n = 0
        with anyio.fail_after(30):
            start = anyio.current_time()
            while anyio.current_time() - start < 2.0:  # four timeouts' worth of calls
                await q.enqueue(Echo(text=str(n)))
                n += 1  # back to back: a call is in flight when the timer fires
        lane = client.sender.lane
        assert lane is not None and lane.direct
        assert (await q.stats()).eligible == n
    finally:
        await client.aclose()


async def test_a_health_check_pings_an_idle_lane_before_the_next_call(
    server: RedisServer, read_path: str
) -> None:
    name = f"lane-{uuid.uuid4().hex[:8]}"
    client = vr.Client.from_url(server.url_with(health_check_interval=1, client_name=name))
    admin = aioredis.Redis.from_url(server.url)
    try:
        q = client.queue(f"t-{uuid.uuid4().hex[:8]}")
        await q.enqueue(Echo(text="first"))
        (lane_conn,) = [c for c in await _connections(admin, name) if c["cmd"] == "evalsha"]
        await q.enqueue(Echo(text="at once"))  # within the interval: no PING
        (after,) = [c for c in await _connections(admin, name) if c["id"] == lane_conn["id"]]
        assert after["cmd"] == "evalsha"
        await anyio.sleep(1.1)
        pings = (await admin.info("commandstats")).get("cmdstat_ping", {}).get("calls", 0)
        await q.enqueue(Echo(text="after idling"))
        assert (await admin.info("commandstats"))["cmdstat_ping"]["calls"] == pings + 1
        (same,) = [c for c in await _connections(admin, name) if c["id"] == lane_conn["id"]]
        assert same["cmd"] == "evalsha"  # the PING went out on the lane, which then sent the script
        assert (await q.stats()).eligible == 3
    finally:
        await client.aclose()
        await admin.aclose()


async def test_resp3_push_messages_on_the_lane_are_not_taken_for_replies(
    server: RedisServer, read_path: str
) -> None:
    """Invalidation pushes (CLIENT TRACKING BCAST) arrive on the lane mid-call; replies still match.

    The lane reads its own RESP3 replies only with a hiredis that parses a
    push into a type of its own (3.2 and later); with an older one (3.0,
    3.1: the oldest venv's) it reads through redis-py, pushes and all.
    """
    client = vr.Client.from_url(server.url_with(protocol=3))  # RESP3: pushes can arrive
    try:
        q = client.queue(f"t-{uuid.uuid4().hex[:8]}")
        await q.enqueue(Echo(text="warm"))
        lane = client.sender.lane
        tells_pushes = hasattr(hiredis, "PushNotification")
        assert lane is not None and lane.direct == (read_path == "own" and tells_pushes)
        conn = lane._conn
        assert str(conn.protocol) == "3"
        assert await lane._round_trip("CLIENT", "TRACKING", "ON", "BCAST") in (b"OK", "OK", True)
        wire = lane._wire
        ids = [await q.enqueue(Echo(text=str(i))) for i in range(20)]  # each write pushes an invalidation
        await anyio.sleep(0.05)  # and some arrive between calls
        ids.append(await q.enqueue(Echo(text="last")))
        if wire is not None:
            assert lane._wire is wire and not wire.unusable  # the same connection throughout
        # (Through redis-py, a push left unread between calls makes the lane
        # replace the connection before the next call, as the pool would.)
        assert len(set(ids)) == 21
        for job_id in ids:
            assert (await q.get(job_id)) is not None
    finally:
        await client.aclose()


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Previous(asyncio.Protocol):
    def __init__(self) -> None:
        self.lost: list[Exception | None] = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def _wire() -> tuple[_Wire, _Previous]:
    prev = _Previous()
    wire = _Wire(_Transport(), lambda msg: ResponseError(msg))
    wire.previous = prev
    return wire, prev


_PUSH = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"


async def test_wire_passes_over_push_messages_where_hiredis_tells_them_apart() -> None:
    """hiredis 3.2 and later: a RESP3 push is skipped. Before: it reads as a reply (so no RESP3 lane)."""
    if not hasattr(hiredis, "PushNotification"):  # hiredis 3.0, 3.1 (the oldest venv)
        reader = hiredis.Reader()
        reader.feed(_PUSH)
        assert reader.gets() == [b"invalidate", [b"k"]]  # a plain list, like any reply
        return
    loop = asyncio.get_running_loop()
    wire, _ = _wire()
    # A reply in two pieces, a push before it: the call gets the reply.
    wire.waiter = fut = loop.create_future()
    wire.data_received(_PUSH + b"*2\r\n:1\r\n$")
    assert not fut.done()
    wire.data_received(b"0\r\n\r\n")
    assert fut.result() == [1, b""] and wire.waiter is None and not wire.unusable
    # A push between calls changes nothing.
    wire.data_received(_PUSH)
    assert not wire.unusable


async def test_wire_matches_one_reply_to_one_call_and_distrusts_the_rest() -> None:
    loop = asyncio.get_running_loop()
    wire, prev = _wire()
    # A reply in two pieces: the call gets the reply.
    wire.waiter = fut = loop.create_future()
    wire.data_received(b"*2\r\n:1\r\n$")
    assert not fut.done()
    wire.data_received(b"0\r\n\r\n")
    assert fut.result() == [1, b""] and wire.waiter is None and not wire.unusable
    # A reply nobody asked for: the stream is out of step.
    wire.data_received(b"+OK\r\n")
    assert wire.unusable
    # Two replies to one call: the second is out of step.
    wire, prev = _wire()
    wire.waiter = fut = loop.create_future()
    wire.data_received(b":1\r\n:2\r\n")
    assert fut.result() == 1 and wire.unusable
    # Bytes that are not RESP: the call fails with them.
    wire, prev = _wire()
    wire.waiter = fut = loop.create_future()
    wire.data_received(b"?what\r\n")
    with pytest.raises(InvalidResponse):
        fut.result()
    assert wire.unusable
    # An error reply is a value: the caller raises it, the connection stays usable.
    wire, prev = _wire()
    wire.waiter = fut = loop.create_future()
    wire.data_received(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(fut.result(), ResponseError) and not wire.unusable
    # The connection's end fails the call in flight and reaches the stream protocol.
    wire.waiter = fut = loop.create_future()
    wire.connection_lost(None)
    with pytest.raises(RedisConnectionError):
        fut.result()
    assert wire.unusable and prev.lost == [None]
