"""What each redis-py release gets: the gates of the features that need a newer one.

The pin allows redis-py 5.0.1 and later (docs/operations.md, "Supported
redis-py"). Standalone Redis and Sentinel run everything on all of it; what
needs more either takes a slower path of the same behaviour or refuses at
first use with a ``vr.ConfigurationError`` naming the release it needs.
``make test-oldest`` runs this file in ``.venv-oldest`` (the oldest redis-py
and hiredis the pin allows), where the gates apply, and ``make test`` in
``.venv`` (the newest), where they let everything through; each test
asserts whichever holds for the release installed, so each gate is seen
both shut and open in CI. The gates tested elsewhere on the same two
releases: a RESP3 enqueue lane without a hiredis that tells pushes apart
(tests/test_lane.py), the host-name check over TLS (tests/test_tls.py),
the hiredis-packed TLS connection (tests/test_fastpack.py), and the fenced
private parts themselves (tests/test_redispy.py).
"""

from __future__ import annotations

import asyncio
import warnings

import hiredis
import pytest
import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo
from venturi_redis._transport import cluster, redispy
from venturi_redis._transport.blocking import blocking_redis
from venturi_redis._transport.lane import Lane
from venturi_redis._transport.urls import tls_defaults

pytestmark = pytest.mark.anyio

INSTALLED = redispy.release()
CLUSTER_SUPPORTED = INSTALLED[:2] >= cluster.CLUSTER_FLOOR
_REFUSED = r"Redis Cluster needs redis-py 8\.2 or later"


def test_the_release_read_is_the_installed_one() -> None:
    assert ".".join(map(str, INSTALLED)) == redis.__version__.split("b")[0].split("rc")[0]
    assert INSTALLED >= (5, 0, 1)  # the pin's floor


@pytest.fixture
def unconnected_cluster() -> RedisCluster:
    """A cluster client that never connects (nothing listens on port 1)."""
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)])


async def test_redis_cluster_is_refused_below_its_floor_and_taken_from_it(
    unconnected_cluster: RedisCluster,
) -> None:
    """Every way to a cluster client: a cluster URL, ``cluster=True``, a caller's own ``RedisCluster``."""
    ways = [
        lambda: vr.Client.from_url("redis+cluster://127.0.0.1:1"),
        lambda: vr.Client.from_url("redis://127.0.0.1:1", cluster=True),
        lambda: vr.Client(unconnected_cluster),
        lambda: vr.Client(unconnected_cluster, durable=1),
    ]
    for make in ways:
        if CLUSTER_SUPPORTED:
            client = make()  # nothing connects yet
            assert cluster.is_cluster(client.redis)
            await client.aclose()
        else:
            with pytest.raises(
                vr.ConfigurationError, match=r"Redis Cluster needs redis-py 8\.2 or later"
            ) as e:
                make()
            assert redis.__version__ in str(e.value) and "pip install 'redis[hiredis]>=8.2,<9'" in str(
                e.value
            )


def test_a_sharded_queue_on_a_cluster_is_refused_with_its_client() -> None:
    """``ShardedQueue`` is plain queues on one client: on a cluster, the client's gate is its gate."""
    if CLUSTER_SUPPORTED:
        sync = vr.SyncClient("redis+cluster://127.0.0.1:1")
        try:
            assert len(vr.ShardedQueue(sync.client, "orders", partitions=3).partitions) == 3
        finally:
            sync.close()
    else:
        with pytest.raises(vr.ConfigurationError, match=_REFUSED):
            vr.SyncClient("redis+cluster://127.0.0.1:1")


def test_the_cluster_gate_reads_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's own rule, on any installed release: 8.1 is refused, 8.2 is not."""
    monkeypatch.setattr(cluster, "release", lambda: (8, 1, 0))
    with pytest.raises(
        vr.ConfigurationError, match=r"needs redis-py 8\.2 or later; this process has redis-py 8\.1\.0"
    ):
        cluster.require_cluster_support()
    monkeypatch.setattr(cluster, "release", lambda: (8, 2, 0))
    cluster.require_cluster_support()


async def test_standalone_redis_runs_the_fast_paths_on_every_release(redis_server: RedisServer) -> None:
    """The enqueue lane reads its own replies and the sync client enqueues directly, whatever the release."""
    client = vr.Client.from_url(redis_server.url)
    try:
        q = client.queue("gates-lane")
        job_id = await q.enqueue(Echo(text="x"))
        lane = client.sender.lane
        assert lane is not None and lane.direct and Lane.reads_own_replies
        assert await q.get(job_id) is not None
    finally:
        await client.aclose()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # get_connection given a name it does not want warns (6.0 and later)
        with vr.SyncClient(redis_server.url) as sync:
            assert sync._direct is not None  # the direct single enqueue, not the loop thread
            sync_id = sync.queue("gates-sync").enqueue(Echo(text="y"))
            assert sync.queue("gates-sync").get(sync_id) is not None


async def test_the_takeover_waits_for_bytes_redis_py_parsed_but_did_not_hand_out(
    redis_server: RedisServer,
) -> None:
    """Bytes in the hiredis parser's buffer (redis-py before 8.0 moves them there) refuse the takeover."""
    conn = Connection(port=redis_server.port)
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
        assert redispy.handshaken_transport(conn) is not None
        conn._parser._reader.feed(b"+PONG\r\n")  # type: ignore[union-attr]
        assert redispy.handshaken_transport(conn) is None
        assert await conn.read_response() == b"PONG"
        assert redispy.handshaken_transport(conn) is not None
    finally:
        await conn.disconnect()


def test_tls_urls_check_the_host_name_unless_they_say_otherwise() -> None:
    """redis-py 6.0 and later check it by default, 5.x does not: a TLS URL checks it on every release."""
    assert tls_defaults("rediss://h:6380/0") == {"ssl_check_hostname": True}
    assert tls_defaults("rediss+sentinel://h:26379/svc?ssl_ca_certs=/ca.pem") == {"ssl_check_hostname": True}
    assert tls_defaults("rediss://h/0?ssl_check_hostname=false") == {}  # the URL's choice wins
    assert tls_defaults("rediss://h/0?ssl_cert_reqs=none") == {}  # no verification, no host check
    assert tls_defaults("redis://h:6379/0") == {} and tls_defaults("unix:///tmp/r.sock") == {}
    client = vr.Client.from_url("rediss://127.0.0.1:1/0")
    try:
        assert client.redis.connection_pool.connection_kwargs["ssl_check_hostname"] is True
    finally:
        asyncio.run(client.aclose())
    direct = blocking_redis("rediss://127.0.0.1:1/0?ssl_check_hostname=false")
    try:
        assert direct.connection_pool.connection_kwargs["ssl_check_hostname"] is False
    finally:
        direct.close()


def test_hiredis_is_at_least_the_floor() -> None:
    """hiredis 3.0, the package's own floor: ``pack_command`` and ``Reader.has_data`` (the transport's)."""
    assert callable(hiredis.pack_command) and callable(hiredis.Reader().has_data)
