"""The worker process tests/test_flow_processes.py starts (``python -m tests.procs.flowworker``).

Reads ``REDIS_URL`` and ``VENTURI_QUEUE``. Each ``Timed`` job records
``[key, pid, start, end]`` (wall-clock seconds) on the list ``flowlog:<queue>``
when its run ends, and sleeps ``seconds`` (``first_seconds`` on its first run:
a run the test kills).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, ClassVar

import anyio
import redis.asyncio as aioredis

import venturi_redis as vr


class Timed(vr.Task):
    KIND: ClassVar[str] = "timed"
    key: str | None = None
    seconds: float = 0.05
    first_seconds: float | None = None

    def limit_key(self) -> str | None:
        return self.key


class Rated(Timed):
    KIND: ClassVar[str] = "rated"


class TimedJob(Timed, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
        start = time.time()
        await state.rpush(LOG, json.dumps(["start", self.key, os.getpid(), start, ctx.job_id]))
        seconds = (
            self.first_seconds if self.first_seconds is not None and ctx.run_count == 1 else self.seconds
        )
        await anyio.sleep(seconds)
        await state.rpush(LOG, json.dumps(["run", self.key, os.getpid(), start, time.time()]))
        return vr.Outcome.completed()


class RatedJob(Rated, TimedJob):
    pass


LOG = "flowlog:" + os.environ.get("VENTURI_QUEUE", "")


async def main() -> None:
    url, name = os.environ["REDIS_URL"], os.environ["VENTURI_QUEUE"]
    async with vr.Client.from_url(url) as client:
        state = aioredis.Redis.from_url(url)
        worker = vr.Worker(
            client.queue(name), state=state, concurrency=8, lease=1.0, poll_interval=0.5, reclaim_interval=0.3
        )
        worker.register(TimedJob, RatedJob)
        print(f"ready {os.getpid()}", flush=True)
        await worker.run()


if __name__ == "__main__":
    anyio.run(main)
