"""What the workers' queue gauges cost Redis on many queues, per refresh (not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/metrics_refresh.py [--queues 1000] [--pods 5]

Starts a throwaway redis-server, makes ``--queues`` queues with one job each,
then has ``--pods`` ``PrometheusMetrics`` (one per simulated pod, each on all
the queues, as ``venturi worker --metrics-port`` builds it) refresh once
each, for every ``--metrics-gauges`` choice: ``all`` (every pod reads every
queue: the behaviour before ``elected`` existed, and still the default),
``elected`` and ``none``. Prints, per refresh round of all the pods: the
Redis commands (``INFO commandstats``, so MULTI/EXEC count), the round trips
(calls of ``execute_command`` and of a pipeline's ``execute``, counted in the
client) and the wall time. A refresh runs every 5 s: commands / 5 is the
load per second the gauges put on Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from redis.asyncio.client import Pipeline, Redis

import venturi_redis as vr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from dashboard_screenshots import redis_server


class Item(vr.Task):
    KIND: ClassVar[str] = "item"
    n: int


TRIPS = [0]


def count_round_trips() -> None:
    plain, piped = Redis.execute_command, Pipeline.execute

    async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        if not isinstance(self, Pipeline):
            TRIPS[0] += 1
        return await plain(self, *args, **options)

    async def execute(self: Any, *args: Any, **options: Any) -> Any:
        TRIPS[0] += 1
        return await piped(self, *args, **options)

    Redis.execute_command = execute_command  # type: ignore[method-assign]
    Pipeline.execute = execute  # type: ignore[method-assign]


async def run(url: str, queues: int, pods: int) -> None:
    client = vr.Client.from_url(url)
    try:
        names = [f"tenant-{i:05}" for i in range(queues)]
        for n in names:
            await client.queue(n).enqueue(Item(n=1))
        qs = [client.queue(n) for n in names]
        count_round_trips()
        print(f"{queues:,} queues, {pods} pods, one refresh of each pod")
        head = ("pods", "commands", "round trips", "exporting", "wall")
        print(f"{'--metrics-gauges':18} {head[0]:>4} {head[1]:>10} {head[2]:>12} {head[3]:>10} {head[4]:>8}")
        for gauges, n in (("all", 1), ("all", pods), ("elected", pods), ("none", pods)):
            metrics = [vr.PrometheusMetrics(gauges=gauges) for _ in range(n)]  # type: ignore[arg-type]
            await client.redis.config_resetstat()
            TRIPS[0] = 0
            started = time.perf_counter()
            for m in metrics:
                await m.refresh(qs)
            took = time.perf_counter() - started
            trips = TRIPS[0]
            stats = await client.redis.info("commandstats")
            commands = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config|resetstat")
            exporting = sum(m.exporting or gauges == "all" for m in metrics)
            print(f"{gauges:18} {n:>4} {commands:>10,} {trips:>12,} {exporting:>10} {took * 1000:>6.0f} ms")
            for m in metrics:
                if m.exporting and gauges == "elected":
                    await m.resign(qs)
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1_000)
    ap.add_argument("--pods", type=int, default=5)
    args = ap.parse_args()
    with redis_server() as url:
        asyncio.run(run(url, args.queues, args.pods))


if __name__ == "__main__":
    main()
