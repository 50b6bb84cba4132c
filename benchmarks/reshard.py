"""A queue's slot moved by ``redis-cli --cluster reshard`` while it works (not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reshard.py [--jobs 20000] [--lease 5]

Starts a two-master Redis Cluster (tests/cluster.py's ``LocalCluster``: real
redis-servers on free ports), names a queue whose slot is the first master's
lowest (the one ``redis-cli --cluster reshard --cluster-slots 1`` moves
first), enqueues ``--jobs`` jobs, then runs a worker (concurrency 10, a
2 ms handler, lease ``--lease`` s) and a producer (an ``enqueue`` every
2 ms) while ``redis-cli --cluster reshard --cluster-pipeline 10`` moves the
slot to the other master. Once the queue drains, every acknowledged job is
looked up. One line: the move's time, the jobs acknowledged, the enqueues
refused meanwhile, the jobs lost, the jobs run more than once, and the
scripts that failed part-way (the worker's log: "non local key").

Only public entry points are used (``Client``, ``Worker``), so with
``PYTHONPATH`` at another checkout the same script measures it
(docs/cluster.md, "Moving a queue's slot", has the figures of both).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import time
from collections import Counter

import anyio
from redis.crc import key_slot
from redis.exceptions import RedisError

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.tasks import Tick, TickJob

failed_partway = 0


class _Log(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        global failed_partway
        exc = record.exc_info[1] if record.exc_info else None
        if "non local key" in record.getMessage() or (exc is not None and "non local key" in str(exc)):
            failed_partway += 1


async def main(a: argparse.Namespace) -> None:
    logging.getLogger().addHandler(_Log())
    with LocalCluster(masters=2, replicas=0) as cluster:
        src, dst = cluster.master_nodes
        assert src.slots is not None
        name = next(f"q{i}" for i in range(10**7) if key_slot(f"q{i}".encode()) == src.slots[0])
        producer, consumer = vr.Client.from_url(cluster.url), vr.Client.from_url(cluster.url)
        q = producer.queue(name)
        acked: list[str] = []
        for start in range(0, a.jobs, 1000):
            acked += await q.enqueue_many([Tick(n=i) for i in range(start, min(a.jobs, start + 1000))])
        worker = vr.Worker(
            consumer.queue(name), concurrency=10, lease=a.lease, handle_signals=False, retention=None
        )
        worker.register(TickJob)
        done = anyio.Event()
        refused = 0

        async def produce() -> None:
            nonlocal refused
            i = a.jobs
            while not done.is_set():
                try:
                    acked.append(await q.enqueue(Tick(n=i)))
                except RedisError:  # TRYAGAIN, then redis-py's "TTL exhausted": the call did not run
                    refused += 1
                    await anyio.sleep(0.01)
                i += 1
                await anyio.sleep(0.002)

        def reshard() -> float:
            began = time.monotonic()
            move = ["--cluster-from", src.node_id, "--cluster-to", dst.node_id, "--cluster-slots", "1"]
            opts = ["--cluster-yes", "--cluster-pipeline", "10"]
            subprocess.run(
                ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{src.port}", *move, *opts],
                check=True,
                capture_output=True,
            )
            return time.monotonic() - began

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            tg.start_soon(produce)
            await anyio.sleep(0.5)
            took = await anyio.to_thread.run_sync(reshard)
            assert cluster.owner_of_slot(src.slots[0]) is dst, "the slot did not move"
            await anyio.sleep(0.5)
            done.set()
            for _ in range(1500):  # up to 300 s
                if await q.is_drained():
                    break
                await anyio.sleep(0.2)
            else:
                raise RuntimeError("the queue did not drain in 300 s")
            worker.shutdown()
        states: Counter[str] = Counter()
        lost = reran = 0
        for job_id in acked:
            info = await q.get(job_id)
            if info is None:
                lost += 1
                continue
            states[info.state.value] += 1
            reran += info.run_count > 1
        await producer.aclose()
        await consumer.aclose()
    print(
        f"jobs={a.jobs} move_s={took:.2f} acked={len(acked)} refused_enqueues={refused} lost={lost} "
        f"reran={reran} failed_partway={failed_partway} states={dict(states)}",
        flush=True,
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=20000, help="jobs enqueued before the move")
    p.add_argument("--lease", type=float, default=5.0, help="the worker's lease, s")
    anyio.run(main, p.parse_args())
