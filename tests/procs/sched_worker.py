"""A worker process for tests/test_schedules_procs.py.

usage: python -m tests.procs.sched_worker URL QUEUE EVERY
Declares the interval schedule ``tick`` (every EVERY seconds) on QUEUE, as
every process of a fleet does, and runs its `Tick` jobs; prints READY once
the worker runs, STOPPED when it stopped.
"""

from __future__ import annotations

import logging
import sys
from typing import ClassVar

import anyio

import venturi_redis as vr


class Tick(vr.Task):
    KIND: ClassVar[str] = "tick"


class TickJob(Tick, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


async def main(url: str, queue: str, every: float) -> None:
    client = vr.Client.from_url(url)
    worker = vr.Worker(
        client.queue(queue),
        lease=1.5,  # the scheduler's peek rides on the reclaim tick (lease / 2)
        shutdown_grace=0.5,
        poll_interval=0.5,
        schedules=[vr.Schedule("tick", Tick(), every=every)],
    )
    worker.register(TickJob)

    async def ready() -> None:
        while not worker._running:
            await anyio.sleep(0.01)
        print("READY", flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ready)
        await worker.run()
    print("STOPPED", flush=True)
    await client.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
