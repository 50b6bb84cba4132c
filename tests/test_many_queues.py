"""Many queues (a queue per tenant): what a producer keeps, what a worker on hundreds of queues
costs Redis, and the operator's views of many queues. Counted (objects, connections, blocked
clients, commands by INFO commandstats), never timed. docs/operations.md, "Many queues (a queue
per tenant)"; benchmarks/many_queues.py has the figures.

On a redis-server of this module's own, so that the counts are only ours.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator

import pytest

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo
from venturi_redis._producer import registry
from venturi_redis._producer.names import QUEUES_KEPT

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def client(own_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(own_server.url)
    await c.redis.flushall()
    await c.redis.config_resetstat()
    yield c
    await c.aclose()


async def _calls(client: vr.Client) -> dict[str, int]:
    stats = await client.redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    for ours in ("info", "config|resetstat", "flushall"):
        calls.pop(ours, None)
    return calls


def _instances(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cls)


async def _clients(client: vr.Client) -> tuple[int, int]:
    """Redis's connected and blocked clients."""
    info = await client.redis.info("clients")
    return int(info["connected_clients"]), int(info["blocked_clients"])


# -- a producer writing to a queue per tenant ---------------------------------------------------


async def test_a_client_keeps_a_bounded_number_of_queues_and_one_dropped_is_made_again(
    client: vr.Client,
) -> None:
    before = _instances(vr.Queue)
    for i in range(3 * QUEUES_KEPT):
        client.queue(f"tenant-{i}")
    assert _instances(vr.Queue) - before <= QUEUES_KEPT  # 3,072 before the bound
    first = client.queue("tenant-0")  # dropped long ago: made again, and it works
    assert first.name == "tenant-0" and client.queue("tenant-0") is first  # kept again
    job_id = await first.enqueue(Echo(text="still here"))
    assert (await client.queue("tenant-0").counts())["pending"] == 1
    info = await first.get(job_id)
    assert info is not None and info.kind == "echo"
    with pytest.raises(vr.ConfigurationError):
        client.queue("no{pe")  # a bad name is refused, and drops nothing
    assert client.queue(f"tenant-{3 * QUEUES_KEPT - 1}") is client.queue(f"tenant-{3 * QUEUES_KEPT - 1}")


def test_a_sync_client_keeps_a_bounded_number_of_queues(own_server: RedisServer) -> None:
    before = _instances(vr.SyncQueue), _instances(vr.Queue)
    with vr.SyncClient(own_server.url) as sc:
        for i in range(3 * QUEUES_KEPT):
            sc.queue(f"sync-{i % (2 * QUEUES_KEPT)}").enqueue(Echo(text=str(i)))
        sync_queues, queues = _instances(vr.SyncQueue) - before[0], _instances(vr.Queue) - before[1]
        assert sync_queues <= QUEUES_KEPT and queues <= QUEUES_KEPT, (sync_queues, queues)
        assert sc.queue("sync-0").counts()["pending"] == 2  # every job landed
        assert sc.queue(f"sync-{2 * QUEUES_KEPT - 1}").counts()["pending"] == 1


async def test_the_registry_memo_is_bounded_and_a_forgotten_name_is_recorded_again(
    client: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "MEMO_MAX", 50)
    for i in range(120):
        await client.queue(f"memo-{i}").enqueue(Echo(text="x"))
    assert len(client._recorded) <= 50  # 120 before the bound
    # Each enqueue's script adds its job to a pending zset (one ZADD); a name not remembered
    # is recorded first (one more).
    zadds = (await _calls(client))["zadd"]
    assert zadds == 2 * 120
    await client.queue("memo-119").enqueue(Echo(text="remembered"))
    assert (await _calls(client))["zadd"] == zadds + 1  # remembered: no record
    await client.queue("memo-0").enqueue(Echo(text="forgotten"))
    assert (await _calls(client))["zadd"] == zadds + 3  # forgotten: recorded again, first
    assert "memo-0" in await registry_names(client)


async def registry_names(client: vr.Client) -> set[str]:
    return {m.decode() for m in await client.redis.zrange("venturi:queues", 0, -1)}
