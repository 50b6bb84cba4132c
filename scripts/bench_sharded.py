"""Benchmark: one sharded queue on a 1-master vs a 3-master local Redis Cluster.

Usage::

    .venv/bin/python scripts/bench_sharded.py                 # 30,000 jobs, 6 partitions, 2+2 processes
    .venv/bin/python scripts/bench_sharded.py --jobs 60000 --partitions 12 --procs 3 --runs 3

For each cluster size it starts a fresh local cluster (tests/cluster.py: real
``redis-server`` processes on free ports, no replicas), then

1. enqueue: ``--procs`` producer processes each ``enqueue_many`` their share
   of ``--jobs`` no-op jobs in batches of ``--batch`` onto one
   ``ShardedQueue(--partitions)``; timed from start until every producer exits;
2. drain: ``--procs`` worker processes (``Worker(sharded_queue)``,
   ``--concurrency`` per partition, ``run(until_idle=True)``); timed until
   every worker exits, i.e. every partition is drained.

Every client, worker and redis-server shares this machine's cores: on a small
machine the Python processes, not Redis, are the bottleneck, and three masters
mostly add context switches. The figures say what this machine does, not what
a cluster of separate hosts would. ``os.cpu_count()`` is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import venturi_redis as vr  # noqa: E402

START_DELAY = 3.0  # seconds for the child interpreters to import and connect


class Noop(vr.Task):
    KIND: ClassVar[str] = "bench_noop"
    n: int


class NoopJob(Noop, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def _produce(
    url: str, name: str, partitions: int, start: int, count: int, batch: int, go: float
) -> None:
    async with vr.Client.from_url(url) as client:
        sq = vr.ShardedQueue(client, name, partitions=partitions)
        await asyncio.sleep(max(0.0, go - time.time()))
        for i in range(start, start + count, batch):
            await sq.enqueue_many([Noop(n=j) for j in range(i, min(i + batch, start + count))])


async def _consume(url: str, name: str, partitions: int, concurrency: int, go: float) -> None:
    await asyncio.sleep(max(0.0, go - time.time()))
    async with vr.Client.from_url(url) as client:
        sq = vr.ShardedQueue(client, name, partitions=partitions)
        worker: vr.Worker[None] = vr.Worker(
            sq, concurrency=concurrency, handle_signals=False, poll_interval=0.2, retention=None
        )
        worker.register(NoopJob)
        await worker.run(until_idle=True)


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT)


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a benchmark process failed (exit {p.returncode})")


def one_run(masters: int, opts: argparse.Namespace, run: int) -> tuple[float, float]:
    from tests.cluster import LocalCluster

    with LocalCluster(masters=masters) as cluster:
        url, name = cluster.url, f"bench{run}"
        share = opts.jobs // opts.procs
        # Every process starts at the same wall-clock instant, once its
        # interpreter and imports are up: start-up time is not measured.
        go = time.time() + START_DELAY
        common = [url, name, str(opts.partitions)]
        _wait_all(
            [
                _spawn(["produce", *common, str(i * share), str(share), str(opts.batch), str(go)])
                for i in range(opts.procs)
            ]
        )
        enq = time.time() - go
        go = time.time() + START_DELAY
        _wait_all([_spawn(["consume", *common, str(opts.concurrency), str(go)]) for _ in range(opts.procs)])
        drain = time.time() - go

        async def check() -> int:
            async with vr.Client.from_url(url) as client:
                return (await vr.ShardedQueue(client, name, partitions=opts.partitions).counts())["completed"]

        done = asyncio.run(check())
        if done != share * opts.procs:
            raise SystemExit(f"only {done} of {share * opts.procs} jobs completed")
        return share * opts.procs / enq, share * opts.procs / drain


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "produce":
        url, name, parts, start, count, batch, go = sys.argv[2:9]
        asyncio.run(_produce(url, name, int(parts), int(start), int(count), int(batch), float(go)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "consume":
        url, name, parts, conc, go = sys.argv[2:7]
        asyncio.run(_consume(url, name, int(parts), int(conc), float(go)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=30_000)
    ap.add_argument("--partitions", type=int, default=6, help="a multiple of 3 spreads evenly")
    ap.add_argument("--procs", type=int, default=2, help="producer processes, then worker processes")
    ap.add_argument("--concurrency", type=int, default=16, help="handlers per partition per worker")
    ap.add_argument("--batch", type=int, default=200, help="jobs per enqueue_many")
    ap.add_argument("--runs", type=int, default=1, help="median of this many runs")
    ap.add_argument("--masters", default="1,3")
    opts = ap.parse_args()
    print(
        f"sharded queue: {opts.jobs} no-op jobs, {opts.partitions} partitions, {opts.procs} producer "
        f"then {opts.procs} worker processes (concurrency {opts.concurrency}/partition), batch {opts.batch}; "
        f"machine: {os.cpu_count()} cores, redis-server "
        f"{subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2]}"
    )
    print(f"{'masters':>8} {'enqueue jobs/s':>15} {'drain jobs/s':>13}  (median of {opts.runs})")
    for masters in (int(m) for m in opts.masters.split(",")):
        figs = [one_run(masters, opts, r) for r in range(opts.runs)]
        enq = statistics.median(f[0] for f in figs)
        drain = statistics.median(f[1] for f in figs)
        print(f"{masters:>8} {enq:>15,.0f} {drain:>13,.0f}", flush=True)


if __name__ == "__main__":
    main()
