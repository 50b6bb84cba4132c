"""A worker process for tests that kill or signal workers.

usage: python -m tests.procs.worker URL QUEUE LEASE
Runs `Hang` jobs: each records its pid in the carry, prints READY <job id>, then
sleeps for an hour (unless cancelled, when it checkpoints and pauses).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import ClassVar

import anyio
from pydantic import BaseModel

import venturi_redis as vr


class HangCarry(BaseModel):
    pids: list[int] = []


class Hang(vr.Task[HangCarry]):
    KIND: ClassVar[str] = "hang"
    cooperative: bool = False


class HangJob(Hang, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[HangCarry], state: None) -> vr.Outcome:
        ctx.carry.pids.append(os.getpid())
        print(f"READY {ctx.job_id}", flush=True)
        if self.cooperative:
            await ctx.cancelled()
            return vr.Outcome.pause_in_with(0, "checkpointed on shutdown")
        await anyio.sleep(3600)
        return vr.Outcome.completed()


async def main(url: str, queue: str, lease: float) -> None:
    client = vr.Client.from_url(url)
    worker = vr.Worker(client.queue(queue), lease=lease, shutdown_grace=0.5, poll_interval=0.2)
    worker.register(HangJob)
    await worker.run()
    print("STOPPED", flush=True)
    await client.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
