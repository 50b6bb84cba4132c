"""Resharding: a queue's slot moves to another master while its workers and producers run.

A slot moves as ``redis-cli --cluster reshard`` (and a managed service's
online scaling) moves it: ``CLUSTER SETSLOT IMPORTING`` on the target,
``MIGRATING`` on the source, ``MIGRATE`` of its keys a few at a time, then
``SETSLOT NODE`` everywhere. Meanwhile some of a queue's keys are on one
master and the rest on the other. Redis checks a call's declared KEYS before
it runs it (refused with ``TRYAGAIN``/``ASK`` when one is missing), but not
the keys a script finds as it runs (a claimed job's hash, its journal): such
a key already moved fails the script part-way, after its first writes, or,
read under ``pcall``, looks like a key of the wrong type. So every script but
``enqueue`` declares the queue's scratch key, which never exists between calls
(docs/redis-layout.md): while the slot moves, each is refused before it runs,
and the clients send it again (docs/cluster.md, "Moving a queue's slot").

Asserted: a run that ends while its job's keys are split between the two
masters is completed once, when the move is over, and nothing is taken for
corrupt; under load (a producer and a worker during a whole move), every
acknowledged job completes, none is lost, none is journaled completed twice,
and no script fails part-way. ``VENTURI_LONG=1`` moves a larger queue.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, ClassVar

import anyio
import pytest
from redis.crc import key_slot
from redis.exceptions import RedisError

import venturi_redis as vr
from tests.cluster import ClusterNode, LocalCluster
from tests.helpers import drain, make_worker
from tests.tasks import Tick, TickJob

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]

LONG = os.environ.get("VENTURI_LONG", "") not in ("", "0")


class Hold(vr.Task):
    KIND: ClassVar[str] = "hold"
    n: int


class HoldJob(Hold, vr.Handler[Any]):
    """Starts, says so, and completes when the test lets it."""

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["started"].append(self.n)
        await state["go"].wait()
        return vr.Outcome.completed()


def begin_move(slot: int, src: ClusterNode, dst: ClusterNode) -> None:
    with dst.conn(5) as d:
        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.node_id)
    with src.conn(5) as s:
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.node_id)


def move_keys(src: ClusterNode, dst: ClusterNode, keys: list[str]) -> None:
    with src.conn(5) as s:
        s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)


def end_move(
    cluster: LocalCluster, slot: int, src: ClusterNode, dst: ClusterNode, batch: int, pause: float
) -> int:
    """Move the slot's remaining keys ``batch`` at a time, then give the slot to ``dst``."""
    moved = 0
    with src.conn(5) as s:
        while keys := s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause)
    for n in cluster.master_nodes:
        with n.conn(5) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)
    return moved


def failed_partway(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The log records of scripts that failed part-way: a key they reached had moved."""
    return [
        r.getMessage()
        for r in caplog.records
        if "non local key" in r.getMessage() or (r.exc_info and "non local key" in str(r.exc_info[1]))
    ][:5]


def _ends(cluster: LocalCluster, slot: int) -> tuple[ClusterNode, ClusterNode]:
    src = cluster.owner_of_slot(slot)
    return src, next(n for n in cluster.master_nodes if n is not src)


async def test_a_run_ending_while_its_keys_are_split_completes_once_after_the_move(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two runs end while one job's hash is on the target and the other's on the source."""
    caplog.set_level(logging.WARNING)
    with LocalCluster(masters=2, replicas=0) as cluster:
        client = vr.Client.from_url(cluster.url)
        try:
            q = client.queue("mv")
            slot = key_slot(q.keys.running.encode())
            src, dst = _ends(cluster, slot)
            # Every key the completion declares exists (the meta hash, the
            # completed set), so Redis lets it run on the source: what it finds
            # as it runs is what the move split.
            await q.set_history(True)
            await q.enqueue(Tick(n=0))
            await drain(q, TickJob, retention=None)
            a = await q.enqueue(Hold(n=1))
            b = await q.enqueue(Hold(n=2))
            state: dict[str, Any] = {"started": [], "go": anyio.Event()}
            worker = make_worker(
                q, HoldJob, state=state, concurrency=2, lease=20.0, reclaim_interval=0.5, retention=None
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(10):
                    while len(state["started"]) < 2:
                        await anyio.sleep(0.02)
                await anyio.to_thread.run_sync(begin_move, slot, src, dst)
                await anyio.to_thread.run_sync(move_keys, src, dst, [q.keys.job(b)])
                state["go"].set()
                # The two completions meet the split slot; they are refused
                # before they run and sent again (the completer backs off).
                await anyio.sleep(1.0)
                moved = await anyio.to_thread.run_sync(end_move, cluster, slot, src, dst, 10, 0.0)
                assert moved > 0
                with anyio.fail_after(30):
                    while not await q.is_drained():
                        await anyio.sleep(0.1)
                worker.shutdown()
            for job_id in (a, b):
                info = await q.get(job_id)
                assert info is not None
                assert (info.state, info.run_count) == (vr.JobState.COMPLETED, 1), job_id
                events = [e.event for e in await q.journal(job_id)]
                assert events.count("completed") == 1, (job_id, events)
            stats = await q.stats()
            assert (stats.completed, stats.dead, stats.running) == (3, 0, 0)
        finally:
            await client.aclose()
    assert not failed_partway(caplog)


async def test_a_queue_moved_under_load_loses_nothing_and_runs_each_job_to_one_completion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer and a worker run through a whole move of the queue's slot."""
    caplog.set_level(logging.WARNING)
    before = 5000 if LONG else 1000
    with LocalCluster(masters=2, replicas=0) as cluster:
        producer = vr.Client.from_url(cluster.url)
        consumer = vr.Client.from_url(cluster.url)
        try:
            q = producer.queue("rs")
            slot = key_slot(q.keys.running.encode())
            src, dst = _ends(cluster, slot)
            acked = list(await q.enqueue_many([Tick(n=i) for i in range(before)]))
            refused = 0
            worker = make_worker(
                consumer.queue("rs"),
                TickJob,
                concurrency=10,
                lease=5.0,
                reclaim_interval=0.5,
                retention=None,
            )
            moved, took = 0, 0.0
            done = anyio.Event()

            async def produce() -> None:
                nonlocal refused
                i = before
                while not done.is_set():
                    try:
                        acked.append(await q.enqueue(Tick(n=i)))
                    except RedisError:  # refused while the slot moves: TRYAGAIN, then TTL exhausted
                        refused += 1
                        await anyio.sleep(0.01)
                    i += 1
                    await anyio.sleep(0.002)

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                tg.start_soon(produce)
                await anyio.sleep(0.3)
                began = time.monotonic()
                await anyio.to_thread.run_sync(begin_move, slot, src, dst)
                moved = await anyio.to_thread.run_sync(end_move, cluster, slot, src, dst, 5, 0.005)
                took = time.monotonic() - began
                await anyio.sleep(0.5)
                done.set()
                with anyio.fail_after(60):
                    while not await q.is_drained():
                        await anyio.sleep(0.2)
                worker.shutdown()
            lost, unfinished, twice = [], [], []
            reran = 0
            for job_id in acked:
                info = await q.get(job_id)
                if info is None:
                    lost.append(job_id)
                    continue
                if info.state != vr.JobState.COMPLETED:
                    unfinished.append((job_id, info.state))
                if info.run_count > 1:
                    reran += 1
                    events = [e.event for e in await q.journal(job_id)]
                    if events.count("completed") > 1:
                        twice.append(job_id)
            print(
                f"RESHARD moved={moved} move_s={took:.1f} acked={len(acked)} refused_enqueues={refused} "
                f"lost={len(lost)} unfinished={len(unfinished)} reran={reran} completed_twice={len(twice)}",
                flush=True,
            )
            assert moved > before
            assert not lost and not unfinished and not twice, (lost[:5], unfinished[:5], twice[:5])
            stats = await q.stats()
            assert (stats.completed, stats.dead, stats.running) == (len(acked), 0, 0)
        finally:
            await producer.aclose()
            await consumer.aclose()
    assert not failed_partway(caplog)
