"""A worker process's start-up: from spawning ``venturi worker`` to its first job's handler.

usage: .venv/bin/python benchmarks/startup.py [ROOT ...] [--runs 7]

For each checkout ROOT (default: this one; another made with ``git worktree
add``, with its own ``.venv``), a fresh redis-server holds one enqueued job;
``ROOT/.venv/bin/venturi worker startup_app:worker`` is spawned as a user
starts it, and the handler of that job writes the wall clock into Redis. The
figure is that time minus the time just before the spawn: the interpreter,
the imports, the worker's connections and server check, the first claim and
the dispatch. The checkouts alternate run by run (the machine's speed drifts);
median of runs. Two floors are timed the same way for scale: ``python -c
pass`` and ``python -c "import redis.asyncio, pydantic"`` (what any worker
on redis-py and pydantic imports before its first line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

APP = """
import os, time
from typing import ClassVar
import redis
import venturi_redis as vr


class Hello(vr.Task):
    KIND: ClassVar[str] = "startup.hello"


class HelloJob(Hello, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        stamp = time.time()
        redis.Redis.from_url(os.environ["REDIS_URL"]).set("startup:handled", repr(stamp))
        return vr.Outcome.completed()


client = vr.Client.from_url(os.environ["REDIS_URL"])
worker = vr.Worker(client.queue("startup"), handle_signals=True)
worker.register(HelloJob)
"""

ENQUEUE = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
import startup_app  # noqa: F401 - its client and task
import venturi_redis as vr

async def main() -> None:
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as c:
        await c.queue("startup").enqueue(startup_app.Hello())

asyncio.run(main())
"""


def one_run(root: Path, app_dir: Path) -> float:
    with RedisServer() as server:
        env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(app_dir)}
        python = root / ".venv" / "bin" / "python"
        subprocess.run([python, "-c", ENQUEUE, str(app_dir)], env=env, check=True, cwd=root)
        r = redis.Redis.from_url(server.url)
        start = time.time()
        proc = subprocess.Popen(
            [root / ".venv" / "bin" / "venturi", "worker", "startup_app:worker"],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while (stamp := r.get("startup:handled")) is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{root}: the worker ran no job (exit {proc.poll()})")
                time.sleep(0.005)
        finally:
            proc.terminate()
            proc.wait(30)
        return float(stamp) - start


def floor(python: Path, code: str) -> float:
    start = time.monotonic()
    subprocess.run([python, "-c", code], check=True)
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="*", type=Path, default=[ROOT])
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app_dir = Path(tmp)
        (app_dir / "startup_app.py").write_text(APP)
        results: dict[str, list[float]] = {str(r): [] for r in a.roots}
        floors: dict[str, list[float]] = {"python -c pass": [], "import redis.asyncio, pydantic": []}
        python = a.roots[0] / ".venv" / "bin" / "python"
        for _ in range(a.runs):
            floors["python -c pass"].append(floor(python, "pass"))
            floors["import redis.asyncio, pydantic"].append(floor(python, "import redis.asyncio, pydantic"))
            for root in a.roots:
                results[str(root)].append(one_run(root.resolve(), app_dir))
    for name, xs in {**floors, **results}.items():
        runs = ", ".join(f"{x * 1000:.0f}" for x in xs)
        print(f"{name}: median {statistics.median(xs) * 1000:.0f} ms (runs: {runs})")


if __name__ == "__main__":
    main()
