"""What an idle worker costs Redis with N schedules defined, none due (issue 27).

    .venv/bin/python benchmarks/schedules_idle.py --schedules 1000 --seconds 60
    .venv/bin/python benchmarks/schedules_idle.py --schedules 0 --root /path/to/base/checkout

Starts its own redis-server, defines the schedules on queue ``idle`` (cron
``0 3 1 1 *``: once a year, none due), starts one worker process with the
default settings on that queue, waits for it to settle, then counts every
command Redis runs over ``--seconds`` (``INFO commandstats``: the commands
inside scripts included, as W7 counts them; the budget is 2 commands/s).
``--root``: the checkout whose ``venturi_redis`` the worker imports (an A/B
against a base without schedules; ``--schedules 0`` there).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RedisServer  # noqa: E402

WORKER = """
import asyncio, sys
from typing import ClassVar
import venturi_redis as vr

class Nop(vr.Task):
    KIND: ClassVar[str] = "nop"

class NopJob(Nop, vr.Handler[None]):
    async def handle(self, ctx, state):
        return vr.Outcome.completed()

async def main():
    client = vr.Client.from_url(sys.argv[1])
    worker = vr.Worker(client.queue("idle")).register(NopJob)
    print("STARTED", vr.__file__, flush=True)
    await worker.run()

asyncio.run(main())
"""


async def define(url: str, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    import venturi_redis as vr
    from tests.tasks import Echo

    async with vr.Client.from_url(url) as client:
        q = client.queue("idle")
        for i in range(n):
            await q.schedule(f"s{i:05d}", Echo(text=str(i)), cron="0 3 1 1 *", tz="Europe/Berlin")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--root", type=Path, default=ROOT, help="checkout the worker imports venturi_redis from")
    p.add_argument("--monitor", type=Path, help="also write what MONITOR shows over the window here")
    cfg = p.parse_args()
    server = RedisServer()
    server.start()
    try:
        asyncio.run(define(server.url, cfg.schedules))
        r = redis.Redis.from_url(server.url)
        env = {**os.environ, "PYTHONPATH": str(cfg.root)}
        # `python -c` puts its working directory first on sys.path: the root's, so
        # the worker imports the root's venturi_redis (and says which).
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cfg.root,
        )
        try:
            assert proc.stdout is not None
            started = proc.stdout.readline().split()
            assert started[:1] == ["STARTED"], started
            print(f"worker imports {started[1]}")
            time.sleep(5.0)  # start-up: server checks, registration, first rounds
            mon = subprocess.Popen(
                ["redis-cli", "-p", str(server.port), "MONITOR"],
                stdout=cfg.monitor.open("w") if cfg.monitor else subprocess.DEVNULL,
            )
            r.config_resetstat()
            time.sleep(cfg.seconds)
            info = r.info("commandstats")
            mon.terminate()
            mon.wait(5)
        finally:
            proc.terminate()
            proc.wait(10)
        stats = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}
        for cmd in ("info", "config|resetstat"):
            stats.pop(cmd, None)
        total = sum(stats.values())
        detail = ", ".join(f"{k} {v / cfg.seconds:.3f}" for k, v in sorted(stats.items()))
        print(
            f"root={cfg.root} schedules={cfg.schedules} seconds={cfg.seconds:.0f}: "
            f"{total / cfg.seconds:.2f} commands/s ({detail})"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
