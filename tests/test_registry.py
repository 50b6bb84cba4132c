"""The registry of queues (issue 46): recorded by every way a queue comes to exist, once per
client; listed without the keyspace; pruned safely; a job's queue found by probing it;
``venturi queues rebuild`` (bounded, resumable) for queues written before it existed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis._producer import discovery
from venturi_redis._producer import registry as registry_module
from venturi_redis._producer.rebuild import rebuild
from venturi_redis._store.keys import QueueKeys, rebuild_key, registry_key
from venturi_redis.cli.commands import app

pytestmark = pytest.mark.anyio

REGISTRY = registry_key()


async def score(client: vr.Client, name: str) -> float | None:
    got = await client.redis.zscore(registry_key(client.namespace), name)
    return None if got is None else float(got)


# -- every way a queue comes to exist records it ---------------------------------------------------


async def _enqueue(q: vr.Queue) -> None:
    await q.enqueue(Echo(text="a"))


async def _enqueue_many(q: vr.Queue) -> None:
    await q.enqueue_many([Echo(text="a"), Echo(text="b")])


async def _enqueue_flow(q: vr.Queue) -> None:
    await q.enqueue_flow(Echo(text="parent"), [Echo(text="child")])


async def _schedule(q: vr.Queue) -> None:
    await q.schedule("nightly", Echo(text="n"), cron="0 3 * * *")


async def _limit(q: vr.Queue) -> None:
    await q.set_limit("echo", concurrency=2)


async def _pause(q: vr.Queue) -> None:
    await q.pause()


async def _resume(q: vr.Queue) -> None:
    await q.resume_queue()


async def _events(q: vr.Queue) -> None:
    await q.set_events(True)


async def _offload(q: vr.Queue) -> None:
    async def double(n: int) -> int:
        return 2 * n

    await vr.offload(queue=q.name, kind="tests.double")(double).offload(q.client, 21)


async def _worker_start(q: vr.Queue) -> None:
    worker = make_worker(q, EchoJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while not await q.workers():
                await anyio.sleep(0.02)
        assert q.name in await discovery.discover_queues(q.client)  # listed while it serves it
        worker.shutdown()


async def _sharded(q: vr.Queue) -> None:
    sq = vr.ShardedQueue(q.client, q.name, partitions=2)
    await sq.enqueue_many([Echo(text=str(i)) for i in range(4)])


async def _sync_enqueue(q: vr.Queue) -> None:
    def go() -> None:
        with vr.SyncClient(q.client.url) as sc:
            sc.queue(q.name).enqueue(Echo(text="from a thread"))

    await anyio.to_thread.run_sync(go)


WAYS: dict[str, Callable[[vr.Queue], Awaitable[None]]] = {
    "enqueue": _enqueue,
    "enqueue_many": _enqueue_many,
    "enqueue_flow": _enqueue_flow,
    "schedule": _schedule,
    "set_limit": _limit,
    "pause": _pause,
    "resume_queue": _resume,
    "set_events": _events,
    "offload": _offload,
    "worker": _worker_start,
    "sharded": _sharded,
    "sync": _sync_enqueue,
}


@pytest.mark.parametrize("way", sorted(WAYS))
async def test_every_way_a_queue_comes_to_exist_records_it(url: str, queue_name: str, way: str) -> None:
    async with vr.Client.from_url(url) as client:
        q = client.queue(queue_name)
        assert queue_name not in await discovery.discover_queues(client)
        await WAYS[way](q)
        names = (
            [queue_name]
            if way != "sharded"
            else vr.ShardedQueue(client, queue_name, partitions=2).partition_names
        )
        registered = await discovery.registered(client)
        assert all(n in registered for n in names)
        # Resuming a queue that has nothing writes no key it is listed by; a worker that stopped
        # leaves none (its listing while it runs is checked above).
        if way not in ("resume_queue", "worker"):
            listed = await discovery.discover_queues(client)
            assert all(n in listed for n in names)


async def test_enqueue_after_records_the_queue(url: str, queue_name: str) -> None:
    """A job that waits (after=) records its queue too: a fresh client, the registry entry gone."""
    async with vr.Client.from_url(url) as first:
        dep = await first.queue(queue_name).enqueue(Echo(text="first"))
        await first.redis.zrem(REGISTRY, queue_name)
    async with vr.Client.from_url(url) as client:
        await client.queue(queue_name).enqueue(Echo(text="then"), after=[dep])
        assert queue_name in await discovery.registered(client)


async def test_a_client_records_a_queue_once_not_per_job(
    redis_server: RedisServer, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ZADD the first time; none per job after it; again once the memo's period has passed."""
    async with vr.Client.from_url(redis_server.url) as client:
        q = client.queue(queue_name)
        await q.enqueue(Echo(text="first"))
        first = await score(client, queue_name)
        assert first is not None
        await anyio.sleep(0.01)  # a record now would move the score by 10 ms
        for i in range(20):
            await q.enqueue(Echo(text=str(i)))
        await q.enqueue_many([Echo(text="many")])
        await q.pause()
        await q.set_events(True)
        assert await score(client, queue_name) == first
        # The memo lasts RECORD_EVERY: a process that keeps writing records again after it,
        # so a reader never prunes the name of a queue in use.

        class Later:
            time = staticmethod(time.time)

            @staticmethod
            def monotonic() -> float:
                return time.monotonic() + registry_module.RECORD_EVERY + 1

        monkeypatch.setattr(registry_module, "time", Later)
        await q.enqueue(Echo(text="later"))
        later = await score(client, queue_name)
        assert later is not None and later > first + 5
        await anyio.sleep(0.01)
        await q.enqueue(Echo(text="and then"))  # remembered again
        assert await score(client, queue_name) == later


async def test_a_burst_of_first_enqueues_sends_one_record(url: str, queue_name: str) -> None:
    """300 concurrent first enqueues (a web server's burst): one ZADD, not one each (which
    also ran the connection pool dry)."""
    async with vr.Client.from_url(url) as client:
        real_zadd = client.redis.zadd
        sent: list[Any] = []

        async def counting_zadd(key: str, *args: Any, **kwargs: Any) -> Any:
            if key == REGISTRY:
                sent.append(args)
            return await real_zadd(key, *args, **kwargs)

        client.redis.zadd = counting_zadd
        q = client.queue(queue_name)
        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(q.enqueue, Echo(text=str(i)))
        assert len(sent) == 1
        assert (await q.counts())["pending"] == 300
        assert queue_name in await discovery.discover_queues(client)


async def test_a_record_that_failed_is_sent_again_by_the_next_write(
    redis_server: RedisServer, queue_name: str
) -> None:
    async with vr.Client.from_url(redis_server.url) as client:
        real_zadd = client.redis.zadd
        failures = [RedisConnectionError("connection lost")]

        async def flaky_zadd(key: str, *args: Any, **kwargs: Any) -> Any:
            if key == REGISTRY and failures:
                raise failures.pop()
            return await real_zadd(key, *args, **kwargs)

        client.redis.zadd = flaky_zadd
        q = client.queue(queue_name)
        with pytest.raises(RedisConnectionError):
            await q.enqueue(Echo(text="first"))  # nothing written: the record goes first
        assert (await q.counts())["pending"] == 0
        await q.enqueue(Echo(text="again"))
        assert await score(client, queue_name) is not None


async def test_a_running_worker_records_its_queues_again_when_the_memo_lapses(
    redis_server: RedisServer, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue only workers write to stays listed after the registry was lost (DEL, a failover)."""
    async with vr.Client.from_url(redis_server.url) as client:
        q = client.queue(queue_name)
        worker = make_worker(q, EchoJob, lease=0.3)  # a beat every 0.1 s
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                while await score(client, queue_name) is None:
                    await anyio.sleep(0.02)
            await client.redis.zrem(REGISTRY, queue_name)
            await anyio.sleep(0.5)  # beats, within the memo's period: no record
            assert await score(client, queue_name) is None

            class Later:
                time = staticmethod(time.time)

                @staticmethod
                def monotonic() -> float:
                    return time.monotonic() + registry_module.RECORD_EVERY + 1

            monkeypatch.setattr(registry_module, "time", Later)
            with anyio.fail_after(10):
                while await score(client, queue_name) is None:
                    await anyio.sleep(0.02)
            worker.shutdown()


async def test_an_enqueue_that_is_refused_before_writing_records_nothing(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url, max_payload_bytes=10) as client:
        with pytest.raises(vr.PayloadTooLarge):
            await client.queue(queue_name).enqueue(Echo(text="x" * 100))
        assert queue_name not in await discovery.registered(client)


# -- listing: a queue whose keys are all gone leaves it; pruning --------------------------------------


async def test_a_queue_whose_keys_are_gone_leaves_the_listing_then_the_registry(
    url: str, queue_name: str
) -> None:
    async with vr.Client.from_url(url) as client:
        q = client.queue(queue_name)
        job = await q.enqueue(Echo(text="a"))
        assert queue_name in await discovery.discover_queues(client)
        assert await q.cancel(job) == "cancelled"
        assert await q.purge("cancelled") == 1
        assert not await client.redis.exists(*q.keys.presence)
        # Gone from the listing at once; kept in the registry while recorded lately
        # (a process that remembers having recorded it may write to it any moment).
        assert queue_name not in await discovery.discover_queues(client)
        assert queue_name in await discovery.registered(client)
        old = time.time() * 1000 - registry_module.PRUNE_AFTER_MS - 1000
        await client.redis.zadd(REGISTRY, {queue_name: old}, xx=True)
        assert queue_name not in await discovery.discover_queues(client)
        assert await score(client, queue_name) is None  # pruned by that listing


async def test_a_queue_with_keys_is_never_pruned_however_old_its_record(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url) as client:
        await client.queue(queue_name).schedule("tick", Echo(text="t"), every=60)
        await client.redis.zadd(REGISTRY, {queue_name: 1}, xx=True)  # recorded in 1970
        assert queue_name in await discovery.discover_queues(client)
        assert await score(client, queue_name) == 1


async def test_prune_keeps_a_name_recorded_again_since_it_was_read(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url) as client:
        await client.redis.zadd(REGISTRY, {queue_name: 1})
        await client.redis.zadd(REGISTRY, {queue_name: 2}, gt=True)  # a producer recorded it meanwhile
        assert await discovery.prune(client, [(queue_name, 1.0)]) == 0
        assert await score(client, queue_name) == 2
        assert await discovery.prune(client, [(queue_name, 2.0)]) == 1
        assert await score(client, queue_name) is None


async def test_prune_loses_to_a_record_made_while_it_checks(
    redis_server: RedisServer, queue_name: str
) -> None:
    """A producer records the name after prune read it and before it removes it (its enqueue
    comes next): the WATCH makes the removal fail, and the name stays for that enqueue."""
    async with (
        vr.Client.from_url(redis_server.url) as client,
        vr.Client.from_url(redis_server.url) as producer,
    ):
        await client.redis.zadd(REGISTRY, {queue_name: 1})
        real_exists = client.redis.exists
        recorded = False

        async def exists_while_a_producer_records(*keys: str) -> Any:
            nonlocal recorded
            if not recorded:
                recorded = True
                await producer._recorded.record(producer.redis, queue_name)
            return await real_exists(*keys)

        client.redis.exists = exists_while_a_producer_records
        assert await discovery.prune(client, [(queue_name, 1.0)]) == 0
        client.redis.exists = real_exists
        assert recorded and (await score(client, queue_name) or 0) > 1
        await producer.queue(queue_name).enqueue(Echo(text="now"))  # remembered: no record of its own
        assert queue_name in await discovery.discover_queues(client)


@pytest.mark.admin  # a namespace of its own: keys outside the ACL user's venturi:*
async def test_names_that_are_no_queue_names_are_ignored(url: str) -> None:
    async with vr.Client.from_url(url, namespace=f"n{uuid.uuid4().hex[:8]}") as client:
        await client.redis.zadd(registry_key(client.namespace), {"bad name{": 1, "": 1})
        await client.queue("good").enqueue(Echo(text="a"))
        assert await discovery.discover_queues(client) == ["good"]


# -- a job's queue, by probing the registered queues ----------------------------------------------


async def test_the_queue_of_a_job_is_found_by_probing_the_registered_queues(
    url: str, queue_name: str
) -> None:
    async with vr.Client.from_url(url) as client:
        other = client.queue(f"{queue_name}-other")
        await other.enqueue(Echo(text="decoy"))
        job = await client.queue(queue_name).enqueue(Echo(text="a"))
        assert await discovery.find_job_queue(client, job) == queue_name
        assert await discovery.find_job_queue(client, "01J0000000000000000000NONE") is None


def test_job_show_without_queue_says_when_the_registry_does_not_know_the_queue(
    redis_server: RedisServer, queue_name: str
) -> None:
    async def setup() -> str:
        async with vr.Client.from_url(redis_server.url) as client:
            job = await client.queue(queue_name).enqueue(Echo(text="a"))
            await client.redis.zrem(REGISTRY, queue_name)  # as if written before the registry existed
            return job

    job = anyio.run(setup)
    res = CliRunner().invoke(app, ["job", "show", job, "--redis", redis_server.url, "--json"])
    assert res.exit_code == 1
    assert f"job {job} not found in any of the" in res.stderr and "venturi queues rebuild" in res.stderr
    res = CliRunner().invoke(app, ["queues", "rebuild", "--redis", redis_server.url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["done"] and doc["recorded"] >= 1 and doc["registered"] >= 1
    res = CliRunner().invoke(app, ["job", "show", job, "--redis", redis_server.url, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["job"]["queue"] == queue_name


# -- the rebuild: bounded, resumable ---------------------------------------------------------------


@pytest.mark.admin  # a namespace of its own: keys outside the ACL user's venturi:*
async def test_rebuild_is_bounded_resumable_and_finds_every_queue(url: str) -> None:
    async with vr.Client.from_url(url, namespace=f"r{uuid.uuid4().hex[:8]}") as client:
        ns = client.namespace
        names = ["alpha", "beta", "gamma"]
        for name in names:
            await client.queue(name).enqueue(Echo(text=name))
        await client.queue("beta").schedule("tick", Echo(text="t"), every=60)
        # Keys that are not ours, so the walk takes many calls whatever the backend.
        pipe = client.redis.pipeline(transaction=False)
        junk = f"junk-{uuid.uuid4().hex[:8]}"
        for i in range(300):
            pipe.set(f"{{{junk}-{i % 7}}}:{i}", "x")
        await pipe.execute()
        await client.redis.delete(registry_key(ns))  # the registry lost (or never written)
        assert await discovery.discover_queues(client) == []

        steps: list[int] = []
        first = await rebuild(client, count=10, max_calls=3, on_step=lambda w: steps.append(w.calls))
        assert (first.calls, first.done, first.resumed) == (3, False, False) and steps == [1, 2, 3]
        assert first.total >= 300 and first.examined == 30
        saved = json.loads(await client.redis.get(rebuild_key(ns)))
        assert not all(node["done"] for node in saved["nodes"].values())

        rest = await rebuild(client, count=10)
        assert rest.done and rest.resumed and rest.calls > 0 and rest.examined >= 30
        assert await client.redis.get(rebuild_key(ns)) is None  # the walk's end forgets it
        assert await discovery.discover_queues(client) == names
        assert await discovery.discover_schedule_queues(client) == ["beta"]
        # A walk started over finds them again; nothing else is recorded.
        again = await rebuild(client, count=1000, restart=True)
        assert again.done and not again.resumed
        assert sorted(await discovery.registered(client)) == names
        pipe = client.redis.pipeline(transaction=False)
        for i in range(300):
            pipe.delete(f"{{{junk}-{i % 7}}}:{i}")
        await pipe.execute()


def test_rebuild_command_shows_progress_and_stops_when_told(redis_server: RedisServer) -> None:
    junk = [f"junk-{uuid.uuid4().hex[:8]}-{i}" for i in range(500)]  # more than one call of 10 examines
    with redis.Redis.from_url(redis_server.url) as r:
        r.mset(dict.fromkeys(junk, "x"))
        try:
            url = redis_server.url
            res = CliRunner().invoke(
                app, ["queues", "rebuild", "--redis", url, "--count", "10", "--max-calls", "1"]
            )
            assert res.exit_code == 0, res.output
            assert res.stdout.startswith("stopped after 1 SCAN call(s) (--max-calls): ")
            assert "run the command again to go on" in res.stdout
            assert "keys examined" in res.stderr  # the progress bar, on stderr
            assert r.get(rebuild_key()) is not None
            res = CliRunner().invoke(app, ["queues", "rebuild", "--redis", url])
            assert res.exit_code == 0, res.output
            assert res.stdout.startswith("registry rebuilt: continued an interrupted walk; ")
            assert r.get(rebuild_key()) is None
        finally:
            r.delete(*junk)


# -- Redis Cluster: the registry's own slot -----------------------------------------------------------


async def test_on_a_cluster_the_registry_lists_queues_of_every_master(redis_cluster: Any) -> None:
    """The registry key is in a slot of its own: queues on the other masters are recorded,
    listed, probed and rebuilt all the same."""
    async with vr.Client.from_url(redis_cluster.url, namespace=f"k{uuid.uuid4().hex[:8]}") as client:
        ns = client.namespace
        await client.redis.initialize()  # the slot map
        home = client.redis.nodes_manager.get_node_from_slot(key_slot(registry_key(ns).encode())).name
        names: list[str] = []
        nodes: set[str] = set()
        i = 0
        while len(nodes) < 3:  # one queue per master: two of them away from the registry
            name = f"q{i}"
            i += 1
            slot = key_slot(QueueKeys.for_queue(name, ns).meta.encode())
            node = client.redis.nodes_manager.get_node_from_slot(slot).name
            if node not in nodes:
                nodes.add(node)
                names.append(name)
        assert home in nodes and len(nodes) == 3
        jobs = {name: await client.queue(name).enqueue(Echo(text=name)) for name in names}
        assert await discovery.discover_queues(client) == sorted(names)
        for name, job in jobs.items():
            assert await discovery.find_job_queue(client, job) == name
        await client.redis.delete(registry_key(ns))
        walk = await rebuild(client, count=100)
        assert walk.done and walk.recorded == 3
        assert await discovery.discover_queues(client) == sorted(names)
        await drain([client.queue(n) for n in names], EchoJob)
