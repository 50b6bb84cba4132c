"""Failover: a master of a real cluster is SIGKILLed under load.

Three masters with a replica each, ``cluster-node-timeout`` 1 s. Producers
enqueue round-robin over six queues (two per master) while one worker drains
all six; once a few hundred enqueues were acknowledged the master serving the
first queue is killed. Producers and the worker are never told: they must
follow the new topology by themselves. Afterwards every acknowledged job is
looked up.

Asserted: the clients recover (enqueues on the failed master's queues succeed
again, through the promoted replica, from the same client objects), every job
that survived completes, nothing is left running; in durable mode
(``Durability(replicas=1)``: WAIT after every transition) no acknowledged
enqueue is lost. Without WAIT a loss is possible (asynchronous replication)
and is reported, not asserted. Each run prints one ``FAILOVER`` line (pytest
``-s``); docs/cluster.md quotes them. ``VENTURI_LONG=1`` runs longer.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar

import anyio
import pytest
from redis.crc import key_slot
from redis.exceptions import RedisError

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.helpers import make_worker

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]

LONG = os.environ.get("VENTURI_LONG", "") not in ("", "0")
BEFORE, AFTER = (3000, 3000) if LONG else (400, 400)  # acknowledged enqueues before / after the kill
QUEUES = 6
PRODUCERS = 8


class Tick(vr.Task):
    KIND: ClassVar[str] = "tick"
    n: int
    pad: str = ""  # ballast, to fill the replication stream in the stalled-replica run


class TickJob(Tick, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(0.001)
        return vr.Outcome.completed()


async def _run(durable: bool, stall: float = 0.0) -> dict[str, Any]:
    """One failover run; ``stall`` > 0: SIGSTOP the victim's replica that long before the kill."""
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        opts: dict[str, Any] = {"durable": vr.Durability(replicas=1, timeout=0.5)} if durable else {}
        producer = vr.Client.from_url(cluster.url, **opts)
        consumer = vr.Client.from_url(cluster.url, **opts)
        # Two queues per master, so a third of the load is on the killed one.
        names: list[str] = []
        per_master: dict[int, int] = {}
        i = 0
        while len(names) < QUEUES:
            port = cluster.owner_of_slot(key_slot(f"fo{i}".encode())).port
            if per_master.get(port, 0) < QUEUES // 3:
                per_master[port] = per_master.get(port, 0) + 1
                names.append(f"fo{i}")
            i += 1
        queues = [producer.queue(n) for n in names]
        slot = key_slot(queues[0].keys.running.encode())
        victim = cluster.owner_of_slot(slot)
        on_victim = {q.name for q in queues if cluster.owner_of_slot(key_slot(q.name.encode())) is victim}
        acked: dict[str, str] = {}  # job id -> queue name
        errors = 0
        killed_at = recovered_at = 0.0
        # retention=None: the default keeps at most 10,000 completed jobs per
        # queue and removes the oldest beyond that, which the lookup at the
        # end could not tell from jobs the failover lost.
        worker = make_worker(
            [consumer.queue(n) for n in names],
            TickJob,
            concurrency=8,
            lease=2.0,
            poll_interval=0.5,
            reclaim_interval=0.5,
            retention=None,
        )
        failed_over: list[bool] = []

        async def operator() -> None:
            # Like an orchestrator: once a replica took over, start the dead
            # node again; it rejoins as the new master's replica (durable mode
            # needs one: a master without replicas cannot satisfy WAIT 1).
            new = await anyio.to_thread.run_sync(cluster.wait_for_failover, victim)
            failed_over.append(new.port != victim.port)
            await anyio.to_thread.run_sync(cluster.restart, victim)

        fault_started: list[bool] = []
        replica = next(n for n in cluster.nodes if n.master_of is victim)
        # 50 kB per job while the replica is stalled: far more than the kernel's
        # socket buffers hold, so what the master acknowledged meanwhile is still
        # in its own memory (its replica output buffer) when it is killed.
        pad = ""

        async def fault() -> None:
            nonlocal killed_at, pad
            if stall:
                assert replica.server.proc is not None
                replica.server.proc.send_signal(signal.SIGSTOP)  # a replica cut off / lagging
                pad = "x" * 50_000
                await anyio.sleep(stall)
            cluster.kill(victim)
            killed_at = time.monotonic()
            pad = ""
            if stall:
                assert replica.server.proc is not None
                replica.server.proc.send_signal(signal.SIGCONT)
            tg.start_soon(operator)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                deadline = time.monotonic() + 90
                counter = iter(range(10**9))

                async def produce(start: int) -> None:
                    # PRODUCERS of these run at once, so several enqueues are in
                    # flight on the victim when it dies (the window WAIT closes).
                    # Each walks the queues in turn by its own count, so each
                    # meets the victim's queues every third enqueue and waits
                    # there while it is down. (Picked by the shared counter,
                    # queues[(start + n) % 6], the six producers left while two
                    # waited on the victim drew six consecutive numbers a
                    # round, coalesced into one batch: each drew the same queue
                    # every round, and they enqueued on that surviving queue
                    # alone, at full speed, for the whole outage: one CI run
                    # acked 15,902, most on one queue, whose oldest completed
                    # jobs a default retention then removed, counted as lost.)
                    nonlocal errors, killed_at, recovered_at
                    turn = start
                    while len(acked) < BEFORE + AFTER or not recovered_at:
                        assert time.monotonic() < deadline, f"producers stuck at {len(acked)} acks"
                        if len(acked) >= BEFORE and not fault_started:
                            fault_started.append(True)
                            tg.start_soon(fault)
                        n = next(counter)
                        q = queues[turn % QUEUES]
                        turn += 1
                        began = time.monotonic()
                        try:
                            job_id = await q.enqueue(Tick(n=n, pad=pad))
                        except (RedisError, OSError):
                            errors += 1
                            await anyio.sleep(0.05)
                            continue
                        acked[job_id] = q.name
                        if killed_at and began > killed_at and not recovered_at and q.name in on_victim:
                            recovered_at = time.monotonic()

                async with anyio.create_task_group() as producers:
                    for k in range(PRODUCERS):
                        producers.start_soon(produce, k)
                # Drain: every surviving job completes, nothing stays running.
                with anyio.fail_after(60):
                    while not all([await q.is_drained() for q in queues]):
                        await anyio.sleep(0.2)
                worker.shutdown()
            found: dict[str, vr.JobInfo] = {}
            for job_id, name in acked.items():
                info = await producer.queue(name).get(job_id)
                if info is not None:
                    found[job_id] = info
            lost = [j for j in acked if j not in found]
            # Only the killed master can lose acknowledged writes: a loss on a
            # queue of a surviving master is a bug, whatever the counts say.
            lost_elsewhere = [f"{acked[j]}/{j}" for j in lost if acked[j] not in on_victim]
            unfinished = [j for j, i in found.items() if i.state != vr.JobState.COMPLETED]
            reruns = sum(1 for i in found.values() if i.run_count > 1)
            return {
                "mode": ("durable(WAIT 1)" if durable else "default")
                + (f"+replica-stalled-{stall}s" if stall else ""),
                "acked": len(acked),
                "acked_on_victim": sum(1 for name in acked.values() if name in on_victim),
                "lost": len(lost),
                "lost_ids": lost,
                "lost_elsewhere": len(lost_elsewhere),
                "lost_elsewhere_ids": lost_elsewhere,
                "unfinished": len(unfinished),
                "reran": reruns,
                "producer_errors": errors,
                "recovery_s": round(recovered_at - killed_at, 2),
                "new_master": failed_over == [True],
            }
        finally:
            await producer.aclose()
            await consumer.aclose()


def _report(fig: dict[str, Any]) -> None:
    shown = {k: v for k, v in fig.items() if not k.endswith("_ids")}
    print("FAILOVER " + " ".join(f"{k}={v}" for k, v in shown.items()), flush=True)


async def test_master_killed_under_load_clients_follow_the_new_topology() -> None:
    fig = await _run(durable=False)
    _report(fig)
    assert fig["new_master"]
    assert fig["recovery_s"] > 0  # enqueues on the failed master's queues succeeded again
    assert fig["unfinished"] == 0
    # Asynchronous replication: an acknowledged enqueue may be lost (reported);
    # never more than those in flight on the killed master, never elsewhere.
    assert fig["lost_elsewhere"] == 0, fig["lost_elsewhere_ids"]
    assert fig["lost"] <= fig["acked_on_victim"]


async def test_durable_mode_loses_no_acknowledged_enqueue() -> None:
    fig = await _run(durable=True)
    _report(fig)
    assert fig["new_master"]
    assert fig["recovery_s"] > 0
    assert fig["unfinished"] == 0
    assert fig["lost"] == 0, fig["lost_ids"]


async def test_stalled_replica_then_master_killed_default_mode_reports_loss() -> None:
    # The replica stops reading (SIGSTOP) for 1 s, the master keeps
    # acknowledging, then dies: whatever it had not handed to the kernel is
    # gone. Without WAIT that is acknowledged work lost; reported, not asserted.
    fig = await _run(durable=False, stall=1.0)
    _report(fig)
    assert fig["new_master"]
    assert fig["unfinished"] == 0
    assert fig["lost_elsewhere"] == 0, fig["lost_elsewhere_ids"]
    assert fig["lost"] <= fig["acked_on_victim"]


async def test_stalled_replica_then_master_killed_durable_mode_loses_nothing() -> None:
    fig = await _run(durable=True, stall=1.0)
    _report(fig)
    assert fig["new_master"]
    assert fig["unfinished"] == 0
    assert fig["lost"] == 0, fig["lost_ids"]
