"""A worker process for the multi-process fan-in of tests/test_workflows_procs.py.

usage: python -m tests.procs.fanin URL QUEUE LEASE
Runs `Leaf` jobs (sleep a little, return their number) and the `Gather` job
that waits on all of them (returns how many results it saw and their sum).
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import anyio

import venturi_redis as vr


class Leaf(vr.Task):
    KIND: ClassVar[str] = "fanin.leaf"
    i: int
    seconds: float = 0.02


class LeafJob(Leaf, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        await anyio.sleep(self.seconds)
        return vr.Outcome.completed(result={"i": self.i})


class Gather(vr.Task):
    KIND: ClassVar[str] = "fanin.gather"


class GatherJob(Gather, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        results: dict[str, Any] = await ctx.dependency_results()
        numbers = [r["i"] for r in results.values()]
        return vr.Outcome.completed(result={"count": len(numbers), "sum": sum(numbers)})


async def main(url: str, queue: str, lease: float) -> None:
    client = vr.Client.from_url(url)
    worker = vr.Worker(client.queue(queue), lease=lease, concurrency=4, shutdown_grace=2, poll_interval=0.2)
    worker.register(LeafJob, GatherJob)
    print("STARTING", flush=True)
    await worker.run()
    await client.aclose()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
