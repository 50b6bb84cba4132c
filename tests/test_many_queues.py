"""Many queues (a queue per tenant): what a producer keeps, what a worker on hundreds of queues
costs Redis, and the operator's views of many queues. Counted (objects, connections, blocked
clients, commands by INFO commandstats), never timed. docs/operations.md, "Many queues (a queue
per tenant)"; benchmarks/many_queues.py has the figures.

On a redis-server of this module's own, so that the counts are only ours.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import anyio
import httpx
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from tests.test_batch_handlers import Mail, SendMails
from venturi_redis._producer import registry
from venturi_redis._producer.names import QUEUES_KEPT
from venturi_redis._producer.reads import COUNT_COMMANDS
from venturi_redis._worker.registry import Registration
from venturi_redis._worker.waiting import GROUP_SIZE
from venturi_redis.cli.commands import app
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

MANY = 300  # queues of a worker: past redis-py 8's pool of 100 connections, five wait groups


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


async def _cli(*argv: str) -> Any:
    """``venturi ARGV`` (it runs an event loop of its own: from a thread)."""
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(app, list(argv)))


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


# -- a worker serving hundreds of queues --------------------------------------------------------


class Slow(vr.Task):
    KIND: ClassVar[str] = "slow"
    seconds: float = 0.05


class SlowJob(Slow, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(self.seconds)
        return vr.Outcome.completed()


async def _until(what: str, check: Any, timeout: float = 30.0) -> None:
    """Wait for ``check()`` (a bound on a hang, not a timing: fails saying what never came)."""
    with anyio.move_on_after(timeout):
        while not await check():
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"not within {timeout} s: {what}")


async def _registered_everywhere(client: vr.Client, names: list[str]) -> bool:
    pipe = client.redis.pipeline(transaction=False)
    for n in names:
        pipe.exists(client.queue(n).keys.workers)
    return all(await pipe.execute())


async def test_a_worker_on_300_queues_blocks_on_a_few_connections_and_starves_no_queue(
    client: vr.Client, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"tenant-{i:03d}" for i in range(MANY)]
    groups = -(-MANY // GROUP_SIZE)
    connected, _ = await _clients(client)
    worker = make_worker([client.queue(n) for n in names], EchoJob, SlowJob, concurrency=2, poll_interval=60)
    caplog.set_level(logging.WARNING, logger="venturi_redis")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await _until("registered", lambda: _registered_everywhere(client, names))
        await _until("idle", lambda: _blocked(client, groups))
        now_connected, blocked = await _clients(client)
        # One connection per wait group blocks (a connection per queue before: 300), and the
        # worker holds a few more (its pool, the completer's pipelines).
        assert blocked == groups
        assert now_connected - connected <= groups + 12, now_connected - connected
        # Slot tasks are started as jobs need them: not 2 x concurrency x 300 up front (a
        # claim loop and a scheduler a queue remain, and a few services).
        assert len(asyncio.all_tasks()) < 2 * MANY + 50
        # A flood on one queue, then one job on each of 20 others: those run beside the flood.
        flood = client.queue(names[0])
        await flood.enqueue_many([Slow() for _ in range(200)])  # 5 s of work at concurrency 2
        others = [client.queue(n) for n in names[100:300:10]]
        for q in others:
            await q.enqueue(Echo(text=q.name))
        await _until("the others ran", lambda: _all_completed(others))
        flooded = (await flood.counts())["completed"]
        worker.shutdown()
    assert flooded < 150, flooded  # most of the flood still to go when the others had run
    # Nothing failed on the way: no "Too many connections" from a pool of 100.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _blocked(client: vr.Client, n: int) -> bool:
    return (await _clients(client))[1] == n


async def _all_completed(queues: list[vr.Queue]) -> bool:
    return all([(await q.counts())["completed"] == 1 for q in queues])


async def test_a_busy_queue_neither_floods_its_wait_group_with_blpops_nor_starves_the_others(
    client: vr.Client,
) -> None:
    """A group blocks only for its idle queues (a busy one claims on by itself, its tokens left
    for idle workers), and names them from the one after the last woken: the others of a
    busy queue's group are woken while it still has work."""
    queues = [client.queue(f"busy-{i:02d}") for i in range(20)]  # one wait group
    worker = make_worker(queues, EchoJob, SlowJob, concurrency=2, poll_interval=60)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await _until("idle", lambda: _blocked(client, 1))
        before = (await _calls(client)).get("blpop", 0)
        await queues[0].enqueue_many([Slow(seconds=0.01) for _ in range(300)])  # 1.5 s at concurrency 2
        for q in queues[1:]:
            await q.enqueue(Echo(text=q.name))
        await _until("the others ran", lambda: _all_completed(queues[1:]))
        flooded = (await queues[0].counts())["completed"]
        blpops = (await _calls(client)).get("blpop", 0) - before
        worker.shutdown()
    assert flooded < 300, flooded
    # A BLPOP a wake-up of the 19 others, and a few as the busy queue leaves and joins its
    # group: not one per token of the flood (300).
    assert blpops <= 40, blpops  # (23 or 24 measured)


async def test_a_token_for_a_queue_with_no_free_slot_is_left_to_another_worker(client: vr.Client) -> None:
    """One token wakes one worker: a wait group hands a token back when its queue's slots are
    full, so an idle worker takes the job instead of it waiting for the busy one."""
    names = [f"pair-{i:02d}" for i in range(20)]
    release = anyio.Event()

    class Hold(vr.Task):
        KIND: ClassVar[str] = "hold"

    class HoldJob(Hold, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            await release.wait()
            return vr.Outcome.completed()

    a = make_worker(
        [client.queue(n) for n in names], HoldJob, EchoJob, concurrency=1, poll_interval=60, name="a"
    )
    b = make_worker(
        [client.queue(n) for n in names], HoldJob, EchoJob, concurrency=1, poll_interval=60, name="b"
    )
    q0 = client.queue(names[0])
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await _until("a idle", lambda: _blocked(client, 1))
        held = await q0.enqueue(Hold())
        await _until("a holds it", lambda: _owner_is(q0, held, "a"))
        tg.start_soon(b.run)
        await _until("b idle", lambda: _blocked(client, 2))
        second = await q0.enqueue(Echo(text="for b"))
        await _until("the second ran", lambda: _state_is(q0, second, "completed"))
        info = await q0.get(second)
        assert info is not None and info.lease_owner == "b"  # a's slot on q0 was taken
        release.set()
        await _until("the first ran", lambda: _state_is(q0, held, "completed"))
        a.shutdown()
        b.shutdown()


async def _owner_is(q: vr.Queue, job_id: str, owner: str) -> bool:
    info = await q.get(job_id)
    return info is not None and info.lease_owner == owner and info.state.value == "running"


async def _state_is(q: vr.Queue, job_id: str, state: str) -> bool:
    info = await q.get(job_id)
    return info is not None and info.state.value == state


@pytest.mark.parametrize("batches", [False, True], ids=["jobs", "with-a-batch-handler"])
async def test_a_grouped_worker_run_until_idle_drains_every_queue_and_returns(
    client: vr.Client, batches: bool
) -> None:
    queues = [client.queue(f"drain-{i:02d}") for i in range(40)]
    for i, q in enumerate(queues):
        await q.enqueue_many([Echo(text=str(i))] * 3)
        if batches:
            await q.enqueue_many([Mail(to=f"{i}-{k}") for k in range(12)])
    state: dict[str, Any] = {}
    handlers = (EchoJob, SendMails) if batches else (EchoJob,)
    worker = make_worker(queues, *handlers, concurrency=2, state=state)
    with anyio.fail_after(60):
        await worker.run(until_idle=True)
    assert all([(await q.counts())["completed"] == (15 if batches else 3) for q in queues])
    assert (await _clients(client))[1] == 0  # no wait group left blocking
    assert len(state.get("ids", [])) == (40 * 12 if batches else 0)


async def test_a_wait_group_whose_connection_is_killed_blocks_again_and_misses_no_job(
    client: vr.Client,
) -> None:
    """CLIENT KILL of a group's blocked connection: the group drops it, pokes its runners (each
    claims the ordinary way) and blocks again on a fresh one; a job enqueued then runs well
    within poll_interval (60 s here: a lost wake-up would wait for it)."""
    queues = [client.queue(f"kill-{i:02d}") for i in range(20)]
    worker = make_worker(queues, EchoJob, poll_interval=60)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await _until("idle", lambda: _blocked(client, 1))
        listed = await client.redis.client_list()
        blocked = [c for c in listed if c.get("cmd") == "blpop"]
        assert len(blocked) == 1
        await client.redis.client_kill_filter(_id=blocked[0]["id"])
        await _until("blocking again, on another connection", lambda: _blocked(client, 1))
        job_id = await queues[7].enqueue(Echo(text="after the kill"))
        await _until("the job ran", lambda: _state_is(queues[7], job_id, "completed"), timeout=30)
        again = [c for c in await client.redis.client_list() if c.get("cmd") == "blpop"]
        worker.shutdown()
    assert [c["id"] for c in again] != [blocked[0]["id"]]


async def test_a_worker_record_names_20_queues_and_counts_them_all(client: vr.Client) -> None:
    names = [f"rec-{i:03d}" for i in range(MANY)]
    worker = make_worker([client.queue(n) for n in names], EchoJob, name="big")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await _until("registered", lambda: _registered_everywhere(client, names))
        raw = await client.redis.get(client.queue(names[-1]).keys.worker("big"))
        res = await _cli("workers", "--redis", client.url)
        res_json = await _cli("workers", "--json", "--redis", client.url)
        listed = await client.queue(names[7]).workers()
        worker.shutdown()
    record = json.loads(raw)
    # Written on every queue, every tick: 20 names, not 300 (a 300-queue record each before).
    assert record["queues"] == names[:20] and record["queue_count"] == MANY
    assert len(raw) < 1024
    assert [(w.name, w.queue_count, len(w.queues)) for w in listed] == [("big", MANY, 20)]
    assert res.exit_code == 0 and "(+280 more)" in res.output
    docs = json.loads(res_json.output)
    assert [(d["name"], d["queue_count"]) for d in docs] == [("big", MANY)]


async def test_a_worker_narrowed_with_only_queues_registers_on_those_alone(client: vr.Client) -> None:
    a, b = client.queue("only-a"), client.queue("only-b")
    worker = make_worker([a, b], EchoJob, name="narrow").only_queues(["only-a"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await _until("registered", lambda: _registered_everywhere(client, ["only-a"]))
        on_b = await b.workers()
        worker.shutdown()
    assert on_b == []  # it registered (and so showed) on a queue it did not consume


# -- the operator's views of many queues --------------------------------------------------------


async def _fill(client: vr.Client, names: list[str]) -> None:
    for n in names:
        await client.queue(n).enqueue(Echo(text=n))


async def test_venturi_stats_and_workers_read_many_queues_in_few_round_trips(client: vr.Client) -> None:
    names = [f"stat-{i:03d}" for i in range(MANY)]
    await client.queue("stat-123").enqueue_many([Echo(text="first")] * 3)  # the oldest job, the most
    await _fill(client, names)
    served = [client.queue(n) for n in names[:10]]
    # A worker's registration on ten queues, as its lease keeper writes it (no worker
    # running: its claims and sweeps would be counted too).
    registration = Registration("ten", served, 4)
    assert await registration.beat([(q, 0) for q in served], 10.0) == [None] * 10
    await client.redis.config_resetstat()
    res = await _cli("stats", "--json", "--redis", client.url)
    stats_calls = await _calls(client)
    await client.redis.config_resetstat()
    listed = await _cli("workers", "--json", "--redis", client.url)
    workers_calls = await _calls(client)
    table = await _cli("stats", "--redis", client.url)
    assert res.exit_code == 0, res.output
    rows = {r["queue"]: r for r in json.loads(res.output)}
    assert len(rows) == MANY and rows["stat-123"]["eligible"] == 4
    assert all(r["eligible"] == 1 for n, r in rows.items() if n != "stat-123")
    assert {n for n, r in rows.items() if r["workers"] == 1} == set(names[:10])
    assert stats_calls.get("time", 0) == 1  # one clock for every row (one a queue before)
    assert stats_calls.get("multi", 0) <= -(-MANY // 50)  # a MULTI per 50 queues (one a queue before)
    assert [(d["name"], d["queue_count"]) for d in json.loads(listed.output)] == [("ten", 10)]
    # One record read for a worker on ten queues (an MGET per queue before).
    assert workers_calls.get("get", 0) == 1 and "mget" not in workers_calls, workers_calls
    # The table: the 200 busiest of 300 (drawing thousands of rows took rich minutes), busiest first.
    shown = [line.split()[0] for line in table.stdout.splitlines() if line.strip().startswith("stat-")]
    assert table.exit_code == 0 and len(shown) == 200 and shown[0] == "stat-123", shown[:3]
    assert "300 queues: the table shows the 200 busiest" in table.stderr


async def test_the_overview_shows_a_page_of_queues_and_reads_only_those(client: vr.Client) -> None:
    names = [f"tenant-{i:03d}" for i in range(250)]
    await _fill(client, names)
    web = create_app(client, read_only=True)
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
        first = (await h.get("/api/queues")).json()
        await client.redis.config_resetstat()
        again = (await h.get("/api/queues")).json()
        refresh = sum((await _calls(client)).values())
        last = (await h.get("/api/queues?page=3")).json()
        found = (await h.get("/api/queues?q=tenant-01")).json()
        html = (await h.get("/?page=2")).text
        bad = [(await h.get(f"/api/queues?page={p}")).status_code for p in ("0", "x", "-1")]
    assert [q["queue"] for q in first["queues"]] == names[:100] == [q["queue"] for q in again["queues"]]
    assert (first["total"], first["pages"], first["page"], first["page_size"]) == (250, 3, 1, 100)
    # A refresh reads the page's queues only: 250 queues' reads before.
    assert refresh <= (COUNT_COMMANDS + 4) * 100, refresh
    assert [q["queue"] for q in last["queues"]] == names[200:] and last["page"] == 3
    assert [q["queue"] for q in found["queues"]] == names[10:20] and found["total"] == 10
    assert 'rel="next"' in html and 'rel="prev"' in html and "queues 101&ndash;200 of 250" in html
    assert 'hx-get="/?page=2"' in html  # the refresh stays on its page
    assert bad == [400, 400, 400]


async def test_the_metrics_refresh_reads_many_queues_at_one_clock(client: vr.Client) -> None:
    names = [f"gauge-{i:03d}" for i in range(MANY)]
    await _fill(client, names)
    metrics = vr.PrometheusMetrics()
    await client.redis.config_resetstat()
    await metrics.refresh([client.queue(n) for n in names])
    calls = await _calls(client)
    assert calls.get("time", 0) == 1  # one clock for every queue (one a queue, and a round trip, before)
    assert calls.get("multi", 0) <= -(-MANY // 50)
    text = metrics.render().decode()
    assert 'venturi_queue_jobs{queue="gauge-299",state="eligible"} 1.0' in text
