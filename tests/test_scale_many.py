"""The autoscaling signal summed over many queues, ``GET /api/scale`` and ``Client.scale_total``:
the sums over queues with known counts, a prefix of the registry, an empty set, the cap and
bad input (400 with the reason), distinct workers, read-only, and its round trips."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from tests.test_dashboard import http
from venturi_redis._producer import scale
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

FIELDS = {
    "queues",
    "ready",
    "running",
    "due_soon",
    "limited",
    "workers",
    "lag_seconds",
    "paused",
    "unreadable",
    "at_ms",
}
T0 = 1_800_000_000_000


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_server.url, namespace=f"s{uuid.uuid4().hex[:10]}")
    try:
        yield c
    finally:
        await c.aclose()


async def tenants(client: vr.Client) -> None:
    """tenant-a: 3 ready (the oldest enqueued at T0); tenant-b: 2 ready, 1 due within the
    minute, 1 in an hour, paused; tenant-c: 1 running, 1 ready; other: 5 ready."""
    client.clock = lambda: T0
    a, b, c, other = (client.queue(n) for n in ("tenant-a", "tenant-b", "tenant-c", "other"))
    for _ in range(3):
        await a.enqueue(Echo(text="a"))
    client.clock = lambda: T0 + 1_000
    for _ in range(2):
        await b.enqueue(Echo(text="b"))
    await b.enqueue(Echo(text="soon"), delay=30)
    await b.enqueue(Echo(text="later"), delay=3600)
    await b.pause()
    await c.enqueue(Echo(text="runs"))
    await claim_raw(c, 1, worker="w-test", lease_ms=600_000)
    await c.enqueue(Echo(text="c"))
    for _ in range(5):
        await other.enqueue(Echo(text="o"))
    client.clock = lambda: T0 + 5_000


async def test_the_sum_of_named_queues_is_the_sum_of_their_signals(client: vr.Client) -> None:
    await tenants(client)
    async with http(create_app(client, read_only=True)) as h:
        r = await h.get("/api/scale", params={"queues": "tenant-a,tenant-b,tenant-c"})
        one = [(await h.get(f"/api/queues/tenant-{x}/scale")).json() for x in "abc"]
    assert r.status_code == 200, r.text
    doc = r.json()
    assert set(doc) == FIELDS
    assert doc == {
        "queues": 3,
        "ready": 6,
        "running": 1,
        "due_soon": 1,
        "limited": 0,
        "workers": 0,
        "lag_seconds": 5.0,  # tenant-a's oldest, enqueued at T0, read at T0 + 5 s
        "paused": 1,
        "unreadable": 0,
        "at_ms": T0 + 5_000,
    }
    for field in ("ready", "running", "due_soon", "limited"):
        assert doc[field] == sum(s[field] for s in one)
    assert doc["lag_seconds"] == max(s["lag_seconds"] for s in one)
    # The per-queue route answers as before.
    assert set(one[0]) == {"queue", "ready", "running", "due_soon", "limited", "workers"} | {
        "lag_seconds",
        "paused",
        "at_ms",
    }


@pytest.mark.parametrize("backend", ["memory", "cluster"])
async def test_the_sum_is_the_same_on_the_embedded_server_and_on_redis_cluster(url: str) -> None:
    # Each queue is a slot of its own on a Cluster: the reads go out per node, never in one MULTI.
    on = vr.Client.from_url(url, namespace=f"s{uuid.uuid4().hex[:10]}")
    try:
        await tenants(on)
        async with http(create_app(on, read_only=True)) as h:
            named = (await h.get("/api/scale", params={"queues": "tenant-a,tenant-b,tenant-c"})).json()
            prefixed = (await h.get("/api/scale", params={"prefix": "tenant-"})).json()
    finally:
        await on.aclose()
    assert named == prefixed
    assert {k: named[k] for k in ("queues", "ready", "running", "due_soon", "paused", "lag_seconds")} == {
        "queues": 3,
        "ready": 6,
        "running": 1,
        "due_soon": 1,
        "paused": 1,
        "lag_seconds": 5.0,
    }


async def test_a_prefix_sums_the_registered_queues_it_starts(client: vr.Client) -> None:
    await tenants(client)
    async with http(create_app(client, read_only=True)) as h:
        by_prefix = (await h.get("/api/scale?prefix=tenant-")).json()
        union = (await h.get("/api/scale?prefix=tenant-&queues=other")).json()
        repeated = (await h.get("/api/scale?queues=tenant-a&queues=other,tenant-a")).json()
        every = (await h.get("/api/scale?prefix=")).json()
    assert (by_prefix["queues"], by_prefix["ready"], by_prefix["running"]) == (3, 6, 1)
    assert (union["queues"], union["ready"]) == (4, 11)
    assert (repeated["queues"], repeated["ready"]) == (2, 8)  # a name given twice counts once
    assert (every["queues"], every["ready"]) == (4, 11)


async def test_an_empty_set_answers_zeros(client: vr.Client) -> None:
    await tenants(client)
    async with http(create_app(client, read_only=True)) as h:
        r = await h.get("/api/scale?prefix=nobody-")
    assert r.status_code == 200
    doc = r.json()
    assert doc["queues"] == doc["ready"] == doc["running"] == doc["workers"] == doc["paused"] == 0
    assert doc["lag_seconds"] == 0.0


async def test_a_queue_not_written_yet_counts_with_zeros(client: vr.Client) -> None:
    async with http(create_app(client, read_only=True)) as h:
        doc = (await h.get("/api/scale?queues=not-yet,nor-this")).json()
    assert (doc["queues"], doc["ready"], doc["lag_seconds"]) == (2, 0, 0.0)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("", "name the queues to sum"),
        ("?queues=", "queues= names no queue"),
        ("?queues=a,b{c", "invalid queue name 'b{c'"),
        ("?prefix=tenant-*", "no wildcards"),
        ("?prefix=-x", "cannot start a queue name"),
    ],
)
async def test_bad_input_is_400_with_the_reason(client: vr.Client, query: str, says: str) -> None:
    async with http(create_app(client, read_only=True)) as h:
        r = await h.get(f"/api/scale{query}")
    assert r.status_code == 400
    assert says in r.json()["error"]


async def test_more_queues_than_the_cap_is_400(client: vr.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ",".join(f"q{i}" for i in range(scale.MAX_SCALE_QUEUES + 1))
    async with http(create_app(client, read_only=True)) as h:
        r = await h.get(f"/api/scale?queues={names}")
        assert r.status_code == 400
        assert "10,001 queues, more than the 10,000" in r.json()["error"]
        # A prefix that matches more than the cap: the registry's names counted first.
        for n in ("t-1", "t-2", "t-3"):
            await client.queue(n).enqueue(Echo(text=n))
        monkeypatch.setattr(scale, "MAX_SCALE_QUEUES", 2)
        r = await h.get("/api/scale?prefix=t-")
        assert r.status_code == 400
        assert "3 queues to sum, more than the 2 one call reads" in r.json()["error"]


async def test_a_worker_on_many_of_the_queues_counts_once(client: vr.Client) -> None:
    qs = [client.queue(f"tenant-{i}") for i in range(3)]
    for q in qs:
        await q.pause()  # registered, claiming nothing
    both = make_worker(qs[:2], EchoJob, concurrency=1)
    one = make_worker(qs[2], EchoJob, concurrency=1)
    async with anyio.create_task_group() as tg, http(create_app(client, read_only=True)) as h:
        tg.start_soon(both.run)
        tg.start_soon(one.run)
        with anyio.fail_after(10):
            while not all([await q.workers() for q in qs]):
                await anyio.sleep(0.02)
        total = (await h.get("/api/scale?prefix=tenant-")).json()
        per_queue = [(await h.get(f"/api/queues/{q.name}/scale")).json()["workers"] for q in qs]
        both.shutdown()
        one.shutdown()
    assert per_queue == [1, 1, 1]
    assert total["workers"] == 2  # not 3: the worker on two queues is one worker
    assert total["paused"] == 3


async def test_the_python_api_answers_as_the_route(client: vr.Client) -> None:
    await tenants(client)
    got = await client.scale_total(["other"], prefix="tenant-")
    async with http(create_app(client, read_only=True)) as h:
        doc = (await h.get("/api/scale?queues=other&prefix=tenant-")).json()
    assert got.to_dict() == doc
    assert isinstance(got, vr.ScaleTotal)
    with pytest.raises(vr.ConfigurationError, match="name the queues"):
        await client.scale_total()
    with pytest.raises(vr.ConfigurationError, match="is one string: give a list"):
        await client.scale_total("tenant-a")


async def test_the_blocking_client_answers_the_same(client: vr.Client, redis_server: RedisServer) -> None:
    await tenants(client)
    client.clock = None
    want = await client.scale_total(prefix="tenant-")

    def blocking() -> vr.ScaleTotal:
        with vr.SyncClient(redis_server.url, namespace=client.namespace) as sc:
            return sc.scale_total(prefix="tenant-")

    got = await anyio.to_thread.run_sync(blocking)
    assert (got.queues, got.ready, got.running, got.paused) == (
        want.queues,
        want.ready,
        want.running,
        want.paused,
    )


async def test_it_reads_many_queues_a_round_trip_and_writes_nothing(client: vr.Client) -> None:
    names = [f"tenant-{i:03}" for i in range(250)]
    for n in names:
        await client.queue(n).enqueue(Echo(text=n))
    redis = client.redis
    await redis.config_resetstat()
    async with http(create_app(client, read_only=True)) as h:
        doc = (await h.get("/api/scale?prefix=tenant-")).json()
    assert (doc["queues"], doc["ready"]) == (250, 250)
    stats: dict[str, Any] = await redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_").lower(): int(v["calls"]) for name, v in stats.items()}
    # One MULTI per 100 queues, one registry read, one clock: not a round trip per queue.
    assert calls["multi"] == 3
    assert calls["zrange"] == 1 and calls["time"] == 1
    assert set(calls) <= {"time", "zrange", "multi", "exec", "zcount", "zrangebyscore", "zcard", "hget"} | {
        "exists",
        "config|resetstat",
        "info",
    }


async def test_a_queue_that_cannot_be_read_is_left_out_and_counted(client: vr.Client) -> None:
    await tenants(client)
    await client.redis.set(client.queue("tenant-b").keys.running, "not a zset")
    async with http(create_app(client, read_only=True)) as h:
        doc = (await h.get("/api/scale?prefix=tenant-")).json()
    assert (doc["queues"], doc["unreadable"], doc["ready"]) == (2, 1, 4)


async def test_the_aggregate_needs_the_token_when_the_dashboard_has_one(client: vr.Client) -> None:
    app = create_app(client, token="s3cret-token", read_only=True)
    async with http(app) as h:
        assert (await h.get("/api/scale?prefix=")).status_code == 401
    async with http(app, authorization="Bearer s3cret-token") as h:
        assert (await h.get("/api/scale?prefix=")).status_code == 200
