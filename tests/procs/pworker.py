"""The worker that tests/test_processes.py runs under ``venturi worker ... --processes N``.

``make_worker`` reads ``REDIS_URL`` and ``VENTURI_QUEUE``; its ``Stamp`` jobs
complete with the pid of the process that ran them, after ``seconds``.
"""

from __future__ import annotations

import os
from typing import ClassVar

import anyio

import venturi_redis as vr


class Stamp(vr.Task):
    KIND: ClassVar[str] = "stamp"
    seconds: float = 0.0


class StampJob(Stamp, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        await anyio.sleep(self.seconds)
        return vr.Outcome.completed(result=os.getpid())


def make_worker() -> vr.Worker:
    client = vr.Client.from_url(os.environ["REDIS_URL"])
    worker = vr.Worker(client.queue(os.environ["VENTURI_QUEUE"]), shutdown_grace=20.0, poll_interval=0.5)
    return worker.register(StampJob)
