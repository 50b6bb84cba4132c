"""Sharded queues: one logical queue over N partitions (every backend, cluster included)."""

from __future__ import annotations

import json
import uuid
import zlib
from typing import Any, ClassVar

import anyio
import pytest
from redis.crc import key_slot

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.helpers import make_worker
from tests.tasks import Echo, EchoJob
from venturi_redis._producer.sharded import group_partitions, parse_partition, partition_names
from venturi_redis._store.keys import dedup_field

pytestmark = pytest.mark.anyio


class Keyed(vr.Task):
    KIND: ClassVar[str] = "keyed"
    key: str
    version: int = 0

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Keyed, vr.NoCarry]) -> vr.Merge[Keyed, vr.NoCarry]:
        return vr.Merge.replace()


class Tagged(vr.Task):
    """Records which partition ran it (the handler sees its queue's name)."""

    KIND: ClassVar[str] = "tagged"
    n: int


class TaggedJob(Tagged, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state.append((ctx.queue, self.n))
        await anyio.sleep(0.002)  # long enough that a busy partition keeps its slot busy
        return vr.Outcome.completed()


def test_partition_names_are_stable_valid_and_spread_over_the_slot_space() -> None:
    names = partition_names("orders", 6)
    assert names == partition_names("orders", 6)  # pure function: every process agrees
    assert len(set(names)) == 6
    for i, n in enumerate(names):
        assert parse_partition(n) == ("orders", i)
        slot = key_slot(n.encode())
        assert i * 16384 // 6 <= slot < (i + 1) * 16384 // 6, (n, slot)
    with pytest.raises(vr.ConfigurationError):
        partition_names("orders", 0)
    with pytest.raises(vr.ConfigurationError):
        partition_names("bad name", 2)


def test_group_partitions_shows_a_sharded_queue_as_one() -> None:
    names = partition_names("orders", 4)
    grouped = group_partitions(["emails", *names[:3], "x.p9-1"])
    assert grouped["orders"] == names[:3]  # an empty partition left no keys: still grouped
    assert grouped["emails"] == ["emails"]
    assert grouped["x.p9-1"] == ["x.p9-1"]  # shaped like a partition, but not a real layout


async def test_round_robin_spreads_evenly_and_ids_come_back_in_order(
    client: vr.Client, queue_name: str
) -> None:
    sq = vr.ShardedQueue(client, f"sq-{queue_name}", partitions=4)
    ids = await sq.enqueue_many([Echo(text=str(i)) for i in range(40)])
    ids += [await sq.enqueue(Echo(text=f"one-{i}")) for i in range(8)]
    assert len(set(ids)) == 48
    per = await sq.partition_counts()
    assert sorted(c["pending"] for c in per.values()) == [12, 12, 12, 12]
    counts = await sq.counts()
    assert counts["pending"] == counts["pending:normal"] == 48
    info = await sq.get(ids[17])
    assert info is not None and info.payload == {"text": "17"}
    assert [e.event for e in await sq.journal(ids[17])] == ["enqueued"]
    assert await sq.get("01NOSUCHJOB0000000000000000") is None
    assert not await sq.is_drained()


async def test_dedup_routes_by_key_so_merges_still_happen(client: vr.Client, queue_name: str) -> None:
    sq = vr.ShardedQueue(client, f"dd-{queue_name}", partitions=5)
    first = {k: await sq.enqueue(Keyed(key=k)) for k in ("a", "b", "c", "d", "e", "f")}
    again = await sq.enqueue_many([Keyed(key=k, version=1) for k in ("a", "b", "c", "d", "e", "f")])
    assert again == list(first.values())  # each met its pending twin and replaced it
    for k, job_id in first.items():
        home = sq.partitions[zlib.crc32(dedup_field("keyed", k).encode()) % 5]
        assert await home.get(job_id) is not None
        info = await sq.get(job_id)
        assert info is not None and info.payload == {"key": k, "version": 1}
    assert (await sq.counts())["pending"] == 6


async def test_worker_drains_every_partition_without_starving_any(client: vr.Client, queue_name: str) -> None:
    sq = vr.ShardedQueue(client, f"fair-{queue_name}", partitions=3)
    hot, *cold = sq.partitions
    await hot.enqueue_many([Tagged(n=i) for i in range(120)])
    for q in cold:
        await q.enqueue_many([Tagged(n=i) for i in range(5)])
    ran: list[tuple[str, int]] = []
    worker = make_worker(sq, TaggedJob, state=ran, concurrency=1)
    with anyio.fail_after(60):
        await worker.run(until_idle=True)
    assert await sq.is_drained()
    assert (await sq.counts())["completed"] == 130
    # Each partition has its own claim loop: the cold partitions' jobs all ran
    # while the hot one still had most of its backlog.
    last_cold = max(i for i, (q, _) in enumerate(ran) if q != hot.name)
    hot_before = sum(1 for q, _ in ran[:last_cold] if q == hot.name)
    assert hot_before < 60, hot_before
    # Order within a partition is kept (one slot per partition, same priority).
    assert [n for q, n in ran if q == hot.name] == list(range(120))


async def test_priority_holds_within_a_partition(client: vr.Client, queue_name: str) -> None:
    sq = vr.ShardedQueue(client, f"prio-{queue_name}", partitions=2)
    p0 = sq.partitions[0]
    await p0.enqueue(Tagged(n=1), priority=vr.Priority.LOW)
    await p0.enqueue(Tagged(n=2), priority=vr.Priority.CRITICAL)
    await p0.enqueue(Tagged(n=3), priority=vr.Priority.NORMAL)
    ran: list[tuple[str, int]] = []
    worker = make_worker(sq, TaggedJob, state=ran, concurrency=1)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert [n for _, n in ran] == [2, 3, 1]


async def test_sharded_queue_plain_echo_end_to_end(client: vr.Client, queue_name: str) -> None:
    sq = vr.ShardedQueue(client, f"e2e-{queue_name}", partitions=3)
    ids = await sq.enqueue_many([Echo(text=f"t{i}") for i in range(30)])
    worker = make_worker([sq], EchoJob, state={})
    with anyio.fail_after(60):
        await worker.run(until_idle=True)
    infos = [await sq.get(i) for i in ids]
    assert all(i is not None and i.state == vr.JobState.COMPLETED for i in infos)


async def test_partitions_use_every_master(redis_cluster: LocalCluster) -> None:
    client = vr.Client.from_url(redis_cluster.url)
    try:
        sq = vr.ShardedQueue(client, f"spread-{uuid.uuid4().hex[:8]}", partitions=6)
        owners = [redis_cluster.owner_of_slot(key_slot(q.name.encode())).port for q in sq.partitions]
        masters = sorted(n.port for n in redis_cluster.master_nodes)
        # Equal slot ranges per master (as redis-cli builds them): two partitions each.
        assert sorted(owners) == sorted(masters * 2)
        await sq.enqueue_many([Echo(text=str(i)) for i in range(60)])
        assert (await sq.counts())["pending"] == 60
    finally:
        await client.aclose()


def test_cli_stats_shows_a_sharded_queue_as_one_row(redis_cluster: LocalCluster) -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    url, name = redis_cluster.url, f"cli-{uuid.uuid4().hex[:8]}"

    async def fill() -> None:
        async with vr.Client.from_url(url) as c:
            sq = vr.ShardedQueue(c, name, partitions=3)
            await sq.enqueue_many([Echo(text=str(i)) for i in range(7)])

    anyio.run(fill)
    res = CliRunner().invoke(app, ["stats", "--redis", url, "--json"])
    # Exit 1 names on stderr a queue that cannot be read: other tests leave
    # deliberately corrupt queues on the shared cluster. Never this one.
    assert res.exit_code in (0, 1), res.output
    assert name not in res.stderr, res.stderr
    rows = {r["queue"]: r for r in json.loads(res.stdout)}
    assert not [q for q in rows if q.startswith(f"{name}.p")]  # no partition rows
    assert sum(rows[name]["pending"].values()) == 7  # every master's partitions found and summed


async def test_a_bad_task_in_any_partition_writes_nothing_anywhere(
    client: vr.Client, queue_name: str
) -> None:
    sq = vr.ShardedQueue(client, f"bad-{queue_name}", partitions=3)
    tasks: list[Any] = [Echo(text=str(i)) for i in range(8)] + ["not a task"]
    with pytest.raises(vr.TaskDefinitionError, match=r"vr\.Task instance"):
        await sq.enqueue_many(tasks)
    assert (await sq.counts())["pending"] == 0


async def test_a_failing_partition_is_reported_with_what_the_others_wrote(
    client: vr.Client, queue_name: str
) -> None:
    sq = vr.ShardedQueue(client, f"part-{queue_name}", partitions=3)
    broken = Keyed(key="k")
    bad = sq.partition_for(broken)
    # Its dedup index is not a hash: that partition's enqueue.lua fails at the
    # keyed task; the other partitions' batches go through.
    await client.redis.set(bad.keys.dedup, b"not a hash")
    tasks: list[vr.Task[Any]] = [Echo(text=str(i)) for i in range(6)]
    tasks.insert(3, broken)
    with pytest.raises(vr.PartialEnqueueError) as caught:
        await sq.enqueue_many(tasks)
    err = caught.value
    assert isinstance(err.__cause__, Exception) and "WRONGTYPE" in str(err.__cause__)
    assert err.unknown == []
    missing = err.not_enqueued
    assert 3 in missing and len(missing) < len(tasks)  # the other partitions wrote theirs
    for i, job_id in enumerate(err.ids):
        if job_id is not None:
            info = await sq.get(job_id)
            assert info is not None and info.payload == {"text": str(i if i < 3 else i - 1)}
    # (Echo tasks routed to the broken partition ahead of the keyed one were
    # written before its script failed: reported in .ids like the others.)
    assert (await sq.counts())["pending"] == len(tasks) - len(missing)
