"""Redis Cluster specifics: URLs, queues over several masters, NOSCRIPT, wake-ups, durable mode.

The contract suite itself runs on the cluster through the ``cluster`` backend
of tests/conftest.py; this module covers what only a cluster has.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar

import anyio
import pytest
from redis.crc import key_slot

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.helpers import make_worker
from tests.servers import RedisServer, replicate
from tests.tasks import Echo, EchoJob
from venturi_redis._transport.cluster import cluster_redis, is_cluster, split_cluster_url
from venturi_redis._transport.durable import Durability

pytestmark = pytest.mark.anyio


# -- a connection cut by the client's own reset --------------------------------------


@pytest.mark.parametrize("via", ["command", "pipeline"])
async def test_a_connection_cut_by_a_client_reset_is_a_connection_error(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """redis-py's AttributeError on a connection closed under it is reported as transient."""
    from redis.asyncio.cluster import ClusterPipeline, RedisCluster
    from redis.exceptions import ConnectionError as RedisConnectionError

    target = ClusterPipeline if via == "pipeline" else RedisCluster
    name = "execute" if via == "pipeline" else "execute_command"
    message = "'NoneType' object has no attribute 'writelines'"

    async def cut(*args: object, **kwargs: object) -> object:
        raise AttributeError(message)

    r = cluster_redis(redis_cluster.url)
    try:
        await r.initialize()
        monkeypatch.setattr(target, name, cut)

        async def send() -> object:
            if via == "pipeline":
                pipe = r.pipeline(transaction=False)
                pipe.get("k")
                return await pipe.execute()
            return await r.get("k")

        with pytest.raises(RedisConnectionError, match="closed under it"):
            await send()
        message = "some other bug"  # any other AttributeError is not disguised
        with pytest.raises(AttributeError, match="some other bug"):
            await send()
    finally:
        monkeypatch.undo()
        await r.aclose()


# -- URLs ----------------------------------------------------------------------------


def test_cluster_urls_parse_into_seeds() -> None:
    single, seeds = split_cluster_url("redis+cluster://u:p%40ss@h1:7000,h2:7001,h3/0?ssl_cert_reqs=none")
    assert single == "redis://u:p%40ss@h1:7000/0?ssl_cert_reqs=none"
    assert seeds == [("h1", 7000), ("h2", 7001), ("h3", 6379)]
    single, seeds = split_cluster_url("rediss+cluster://h:6380?x=1")
    assert (single, seeds) == ("rediss://h:6380/?x=1", [("h", 6380)])
    # Query values with slashes, with and without a path (a CA file, as TLS needs).
    single, seeds = split_cluster_url("rediss+cluster://h1:1,h2:2?ssl_ca_certs=/etc/ssl/ca.pem&x=a/b")
    assert (single, seeds) == ("rediss://h1:1/?ssl_ca_certs=/etc/ssl/ca.pem&x=a/b", [("h1", 1), ("h2", 2)])
    single, seeds = split_cluster_url("rediss+cluster://h1:1,h2:2/0?ssl_ca_certs=/etc/ssl/ca.pem")
    assert (single, seeds) == ("rediss://h1:1/0?ssl_ca_certs=/etc/ssl/ca.pem", [("h1", 1), ("h2", 2)])
    assert split_cluster_url("redis://h:1")[1] == [("h", 1)]  # the cluster=True form


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+cluster://h:1/3", "only database 0"),
        ("unix+cluster:///tmp/s", "TCP"),
        ("redis+cluster://h:1,,h:2", "empty seed"),
        ("redis+cluster://h:notaport", "bad port"),
    ],
)
def test_bad_cluster_urls_say_what_is_wrong(url: str, match: str) -> None:
    with pytest.raises(vr.ConfigurationError, match=match):
        split_cluster_url(url)


async def test_cluster_true_option_and_url_scheme_give_a_cluster_client(redis_cluster: LocalCluster) -> None:
    seed = redis_cluster.master_nodes[0].port
    for c in (
        vr.Client.from_url(f"redis://127.0.0.1:{seed}", cluster=True),
        vr.Client.from_url(redis_cluster.url),
    ):
        try:
            assert is_cluster(c.redis)
            q = c.queue(f"u-{uuid.uuid4().hex[:8]}")
            job_id = await q.enqueue(Echo(text="hi"))
            info = await q.get(job_id)
            assert info is not None and info.state == vr.JobState.PENDING
        finally:
            await c.aclose()


# -- queues over several masters -----------------------------------------------------


@pytest.fixture
async def cclient(redis_cluster: LocalCluster) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_cluster.url)
    try:
        yield c
    finally:
        await c.aclose()


def spread_names(cluster: LocalCluster, per_master: int) -> list[str]:
    """Fresh queue names, ``per_master`` on each master."""
    tag = uuid.uuid4().hex[:8]
    owners: dict[int, int] = {}
    names: list[str] = []
    i = 0
    while len(names) < per_master * len(cluster.master_nodes):
        name = f"m{tag}-{i}"
        port = cluster.owner_of_slot(key_slot(name.encode())).port
        if owners.get(port, 0) < per_master:
            owners[port] = owners.get(port, 0) + 1
            names.append(name)
        i += 1
    return names


async def test_one_worker_drains_queues_on_every_master(
    cclient: vr.Client, redis_cluster: LocalCluster
) -> None:
    names = spread_names(redis_cluster, 2)
    ids = {n: await cclient.queue(n).enqueue_many([Echo(text=f"{n}:{i}") for i in range(600)]) for n in names}
    ran: dict[str, list[str]] = {}
    worker = make_worker([cclient.queue(n) for n in names], EchoJob, state=ran, concurrency=16)
    with anyio.fail_after(90):
        await worker.run(until_idle=True)
    assert len(ran["ran"]) == 600 * len(names)
    for n in names:
        q = cclient.queue(n)
        assert (await q.counts())["completed"] == 600
        for job_id in ids[n][:5]:
            info = await q.get(job_id)
            assert info is not None and info.state == vr.JobState.COMPLETED


async def test_noscript_after_a_flush_on_every_node_is_recovered(
    cclient: vr.Client, redis_cluster: LocalCluster
) -> None:
    names = spread_names(redis_cluster, 1)
    await cclient.queue(names[0]).enqueue(Echo(text="warm"))
    for node in redis_cluster.nodes:
        with node.conn() as r:
            r.script_flush()
    # enqueue_many over 500 jobs goes out as one cluster transaction of EVALs
    # (ScriptSet.run_transaction): a flushed cache cannot fail or split it.
    for n in names:
        ids = await cclient.queue(n).enqueue_many([Echo(text=str(i)) for i in range(1200)])
        assert len(set(ids)) == 1200
        assert (await cclient.queue(n).counts())["pending"] == 1200 + (n == names[0])


class Counted(vr.Task):
    KIND: ClassVar[str] = "counted"
    key: str
    n: int = 1

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Counted, vr.NoCarry]) -> vr.Merge[Counted, vr.NoCarry]:
        return vr.Merge.with_(Counted(key=self.key, n=existing.payload.n + 1), vr.NoCarry())


async def test_dedup_merges_under_watch_on_queues_of_every_master(
    cclient: vr.Client, redis_cluster: LocalCluster
) -> None:
    names = spread_names(redis_cluster, 1)

    async def producer(name: str) -> None:
        for _ in range(40):
            await cclient.queue(name).enqueue(Counted(key="k"))

    async with anyio.create_task_group() as tg:
        for name in names:
            for _ in range(4):  # four producers race on each queue's one key
                tg.start_soon(producer, name)
    for name in names:
        q = cclient.queue(name)
        assert (await q.counts())["pending"] == 1
        (job_id,) = [
            i.decode() for i in await cclient.redis.zrange(q.keys.pending(vr.Priority.NORMAL), 0, -1)
        ]
        info = await q.get(job_id)
        assert info is not None and info.payload == {"key": "k", "n": 160}  # no update lost


async def test_an_idle_worker_is_woken_on_every_master(
    cclient: vr.Client, redis_cluster: LocalCluster
) -> None:
    names = spread_names(redis_cluster, 1)
    ran: dict[str, list[str]] = {}
    # A poll interval far beyond the test's bound: only a wake-up (the
    # enqueue's token, taken by the worker's BLPOP on that queue's master)
    # can get the jobs run in time.
    worker = make_worker([cclient.queue(n) for n in names], EchoJob, state=ran, poll_interval=120)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await anyio.sleep(0.5)  # idle, blocked on every queue's wake list
            for n in names:
                await cclient.queue(n).enqueue(Echo(text=n))
            while len(ran.get("ran", [])) < len(names):
                await anyio.sleep(0.05)
            worker.shutdown()
    assert sorted(ran["ran"]) == sorted(names)


# -- durable mode ----------------------------------------------------------------------


async def test_durable_mode_needs_a_real_server() -> None:
    with pytest.raises(vr.ConfigurationError, match="replicas"):
        vr.Client.from_url(f"memory://{uuid.uuid4().hex}", durable=1)
    with pytest.raises(vr.ConfigurationError, match=">= 1"):
        Durability(replicas=0)


async def test_durable_mode_on_a_single_redis_with_a_replica() -> None:
    with RedisServer() as master, RedisServer("--repl-diskless-sync-delay", "0") as replica:
        await replicate(replica, master)
        async with vr.Client.from_url(master.url, durable=vr.Durability(replicas=1, timeout=0.5)) as c:
            q = c.queue("d")
            job_id = await q.enqueue(Echo(text="x"))
            async with vr.Client.from_url(replica.url) as rc:
                # WAIT returned: the replica has the job already.
                assert await rc.queue("d").get(job_id) is not None
                # Batches too (chunks of 500 jobs, each its own script call + WAIT).
                ids = await q.enqueue_many([Echo(text=str(i)) for i in range(1200)])
                assert (await rc.queue("d").counts())["pending"] == 1201
                assert await rc.queue("d").get(ids[-1]) is not None
            # A replica that stops acknowledging: the write is applied, the call says so.
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(vr.NotDurableError, match="0/1 replicas"):
                    await q.enqueue(Echo(text="y"))
            finally:
                replica.proc.send_signal(signal.SIGCONT)
            assert (await q.counts())["pending"] == 1202
            # Redis 7.0 here has no WAITAOF (7.2+): said plainly, not a raw error.
            c2 = vr.Client(c.redis.venturi_inner, durable=vr.Durability(aof=True))
            with pytest.raises(vr.ConfigurationError, match="WAITAOF"):
                await c2.queue("d").enqueue(Echo(text="z"))


async def test_durable_mode_on_a_cluster_waits_on_the_queue_master(
    redis_cluster: LocalCluster,
) -> None:
    # The session cluster has no replicas: WAIT 1 on the queue's master must
    # fail, and say so, whichever master the queue lives on (the WAIT went
    # to the node that ran the script, not to a random one).
    async with vr.Client.from_url(redis_cluster.url, durable=vr.Durability(replicas=1, timeout=0.05)) as c:
        for name in spread_names(redis_cluster, 1):
            with pytest.raises(vr.NotDurableError, match="0/1 replicas"):
                await c.queue(name).enqueue(Echo(text="x"))
            assert (await c.queue(name).counts())["pending"] == 1  # applied on the master
