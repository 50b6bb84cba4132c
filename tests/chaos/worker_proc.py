"""A chaos worker process: ``python -m tests.chaos.worker_proc URL QUEUE [options]``.

Runs one ``vr.Worker`` with the chaos handlers until SIGTERM (graceful) or
SIGKILL (the point of the exercise). Logs go to stderr, which the driver
sends to a file per process so a failing run can be read afterwards.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import anyio
import redis.asyncio as aioredis

import venturi_redis as vr
from tests.chaos.chaos_tasks import HANDLERS, ChaosState


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("queue")
    p.add_argument("--name", default=f"chaos-{os.getpid()}")
    p.add_argument("--evidence-url", default="", help="where handlers record runs (default: url)")
    p.add_argument("--lease", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-failures", type=int, default=0, help="0 = no backstop")
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--reclaim-interval", type=float, default=0.25)
    p.add_argument(
        "--retention",
        choices=("default", "none"),
        default="default",
        help="none: keep every finished job, for a run that reads them all back afterwards",
    )
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    client = vr.Client.from_url(args.url)
    # A separate connection for the evidence the handlers write.
    evidence = aioredis.Redis.from_url(args.evidence_url or args.url)
    try:
        worker: vr.Worker[ChaosState] = vr.Worker(
            client.queue(args.queue),
            state=ChaosState(evidence, args.name, args.queue),
            concurrency=args.concurrency,
            lease=args.lease,
            max_failures=args.max_failures or None,
            backoff=vr.Backoff.fibonacci(0.01, 0.1),
            poll_interval=args.poll_interval,
            reclaim_interval=args.reclaim_interval,
            retention=None if args.retention == "none" else vr.Retention(),
            shutdown_grace=2.0,
            handle_signals=True,
            name=args.name,
        )
        worker.register(*HANDLERS)
        print("ready", flush=True)
        await worker.run()
    finally:
        await evidence.aclose()
        await client.aclose()


if __name__ == "__main__":
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    anyio.run(_main, _args(sys.argv[1:]))
