"""A sync handler that never returns, and a worker for ``venturi worker`` to run it.

``python -m venturi_redis.cli worker tests.procs.sync_stuck:make`` consumes the
queue named by ``STUCK_QUEUE`` on ``REDIS_URL``; ``STUCK_GRACE`` is its
``shutdown_grace``. The handler writes ``STUCK_FILE`` once it runs, then
blocks in ``time.sleep`` for an hour, never looking at its context.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import venturi_redis as vr


class Stuck(vr.Task):
    KIND: ClassVar[str] = "stuck"


class StuckJob(Stuck, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        Path(os.environ["STUCK_FILE"]).write_text(ctx.job_id)
        time.sleep(3600)
        return vr.Outcome.completed()


def make() -> vr.Worker[Any]:
    client = vr.Client.from_url()
    queue = client.queue(os.environ["STUCK_QUEUE"])
    grace = float(os.environ["STUCK_GRACE"])
    return vr.Worker(queue, poll_interval=0.2, shutdown_grace=grace).register(StuckJob)
