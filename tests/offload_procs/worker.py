"""A worker process: consumes the queue named on the command line until SIGTERM.

Usage: VENTURI_MP_QUEUE=name python -m tests.offload_procs.worker REDIS_URL
"""

from __future__ import annotations

import sys

import anyio

import venturi_redis as vr
from tests.offload_procs.reports import QUEUE, build_monthly


async def main(url: str) -> None:
    async with vr.Client.from_url(url) as client:
        worker: vr.Worker[None] = vr.Worker(client.queue(QUEUE), poll_interval=0.5, shutdown_grace=2)
        worker.register(build_monthly)
        print("ready", flush=True)
        await worker.run()  # SIGTERM: graceful shutdown


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
