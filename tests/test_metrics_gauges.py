"""Who exports the queue gauges on many queues (``PrometheusMetrics(gauges=...)``,
``venturi worker --metrics-gauges``): every worker, one elected among those serving the same
queues, or none; the values a refresh of many queues reads; the election's takeover."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio
import pytest

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo

pytestmark = pytest.mark.anyio

MANY = 120
STATES = ("eligible", "delayed", "retrying", "running", "suspended", "completed", "dead", "cancelled")


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_server.url, namespace=f"g{uuid.uuid4().hex[:10]}")
    try:
        yield c
    finally:
        await c.aclose()


async def fleet(client: vr.Client, n: int = MANY) -> list[vr.Queue]:
    """``n`` queues: queue i holds i % 4 eligible jobs (high priority on every third), one
    delayed on every fifth, and every seventh is paused."""
    queues = [client.queue(f"tenant-{i:03d}") for i in range(n)]
    for i, q in enumerate(queues):
        if i % 4:
            await q.enqueue_many(
                [Echo(text=str(j)) for j in range(i % 4)], priority="high" if i % 3 == 0 else "normal"
            )
        if i % 5 == 0:
            await q.enqueue(Echo(text="later"), delay=3600)
        if i % 7 == 0:
            await q.pause()
    return queues


def sample(m: vr.PrometheusMetrics, name: str, **labels: str) -> float | None:
    value: float | None = m.registry.get_sample_value(name, labels)
    return value


async def calls(client: vr.Client) -> dict[str, int]:
    stats = await client.redis.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    for ours in ("info", "config|resetstat"):
        out.pop(ours, None)
    return out


async def test_a_refresh_of_many_queues_gives_each_queue_its_stats(client: vr.Client) -> None:
    queues = await fleet(client)
    m = vr.PrometheusMetrics()
    await m.refresh(queues)
    for q in queues:
        st = await q.stats()
        for state in STATES:
            assert sample(m, "venturi_queue_jobs", queue=q.name, state=state) == getattr(st, state), (
                q,
                state,
            )
        for label, count in st.pending.items():
            assert sample(m, "venturi_queue_eligible", queue=q.name, priority=label) == count
        assert sample(m, "venturi_queue_paused", queue=q.name) == (1 if st.paused else 0)
        assert sample(m, "venturi_queue_over_retention", queue=q.name) == st.over_retention


async def test_elected_one_worker_of_those_on_the_same_queues_reads_and_exports(client: vr.Client) -> None:
    queues = await fleet(client)
    await client.redis.config_resetstat()
    await vr.PrometheusMetrics().refresh(queues)
    one_pod = await calls(client)
    pods = [vr.PrometheusMetrics(gauges="elected") for _ in range(3)]
    await client.redis.config_resetstat()
    for m in pods:
        await m.refresh(queues)
    three_pods = await calls(client)
    # Redis read the queues once, not three times: the same reads as one pod's.
    for command in ("zcount", "zcard", "zrangebyscore", "multi"):
        assert three_pods[command] == one_pod[command], command
    assert [m.exporting for m in pods] == [True, False, False]
    assert sample(pods[0], "venturi_queue_jobs", queue="tenant-003", state="eligible") == 3
    assert sample(pods[1], "venturi_queue_jobs", queue="tenant-003", state="eligible") is None
    assert b"venturi_queue_jobs{" not in pods[2].render()
    # The counters are every pod's own, whoever exports the gauges.
    pods[1].job_claimed("tenant-001", "echo")
    assert sample(pods[1], "venturi_jobs_claimed_total", queue="tenant-001", kind="echo") == 1


async def test_another_worker_takes_over_and_the_old_holder_clears_its_gauges(client: vr.Client) -> None:
    queues = await fleet(client, 10)
    first, second = vr.PrometheusMetrics(gauges="elected"), vr.PrometheusMetrics(gauges="elected")
    await first.refresh(queues)
    await second.refresh(queues)
    assert (first.exporting, second.exporting) == (True, False)
    key = first.gauges_key(queues)
    assert (await client.redis.get(key)).decode() == first.holder_id
    assert 0 < await client.redis.pttl(key) <= 15_000  # three intervals of 5 s
    await client.redis.delete(key)  # the holder's key expired (its pod stalled, or died)
    await second.refresh(queues)
    await first.refresh(queues)
    assert (first.exporting, second.exporting) == (False, True)
    assert sample(second, "venturi_queue_jobs", queue="tenant-003", state="eligible") == 3
    assert sample(first, "venturi_queue_jobs", queue="tenant-003", state="eligible") is None


async def test_a_holder_that_stops_gives_the_key_up(client: vr.Client) -> None:
    queues = await fleet(client, 5)
    m = vr.PrometheusMetrics(gauges="elected")
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.refresh_forever, queues, 0.05)
        with anyio.fail_after(10):
            while not m.exporting:
                await anyio.sleep(0.01)
        assert await client.redis.exists(m.gauges_key(queues)) == 1
        tg.cancel_scope.cancel()
    assert await client.redis.exists(m.gauges_key(queues)) == 0
    nxt = vr.PrometheusMetrics(gauges="elected")
    await nxt.refresh(queues)
    assert nxt.exporting


async def test_a_stop_whose_key_cannot_be_given_up_still_stops(
    client: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    queues = await fleet(client, 3)
    m = vr.PrometheusMetrics(gauges="elected")

    async def lost(queues: object) -> None:
        raise ConnectionError("the worker closed its client first")

    monkeypatch.setattr(m, "resign", lost)
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.refresh_forever, queues, 0.05)
        with anyio.fail_after(10):
            while not m.exporting:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert await client.redis.pttl(m.gauges_key(queues)) > 0  # its TTL hands the gauges on


async def test_an_election_key_of_another_type_is_left_and_said_once(
    client: vr.Client, caplog: pytest.LogCaptureFixture
) -> None:
    queues = await fleet(client, 3)
    m = vr.PrometheusMetrics(gauges="elected")
    key = m.gauges_key(queues)
    await client.redis.hset(key, "by", "hand")
    for _ in range(3):
        await m.refresh(queues, 0.05)  # before: each raised WRONGTYPE
    assert not m.exporting
    said = [r.getMessage() for r in caplog.records if "election key" in r.getMessage()]
    assert said == [
        f"metrics: the gauges' election key {key} holds a hash, not a string: no worker "
        f"exports the queue gauges until it is deleted (DEL {key})"
    ]
    assert await client.redis.hgetall(key) == {b"by": b"hand"}  # nothing destroyed
    await client.redis.delete(key)
    await m.refresh(queues, 0.05)
    assert m.exporting


async def test_workers_on_other_queues_elect_their_own(client: vr.Client) -> None:
    queues = await fleet(client, 6)
    a, b = vr.PrometheusMetrics(gauges="elected"), vr.PrometheusMetrics(gauges="elected")
    assert a.gauges_key(queues[:3]) != a.gauges_key(queues[3:])
    assert a.gauges_key(queues[:3]) == a.gauges_key(list(reversed(queues[:3])))  # a set, not a list
    await a.refresh(queues[:3])
    await b.refresh(queues[3:])
    assert a.exporting and b.exporting


async def test_none_reads_no_queue(client: vr.Client) -> None:
    queues = await fleet(client, 10)
    m = vr.PrometheusMetrics(gauges="none")
    await client.redis.config_resetstat()
    await m.refresh(queues)
    assert await calls(client) == {}
    assert b"venturi_queue_jobs{" not in m.render()


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(vr.ConfigurationError, match="use one of all, elected, none"):
        vr.PrometheusMetrics(gauges="some")  # type: ignore[arg-type]
