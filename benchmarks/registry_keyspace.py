"""Listing the queues on a Redis shared with everything else (issue 46; not run in CI).

    .venv/bin/python benchmarks/registry_keyspace.py [--foreign 10000000] [--jobs 1000000]
        [--url URL] [--runs 5] [--idle 65]

Fills a Redis with ``--foreign`` keys that are not ours and ``--jobs`` pending
jobs of queue ``big``, then measures what an operator meets:

- ``venturi stats`` without ``-q``: the whole command in a fresh process
  (``python -m venturi_redis.cli stats``: the interpreter's start and the
  imports included; ``--version`` alone is printed for reference), and the
  command's own work, run in this process by typer's ``CliRunner`` after a
  first run (median of ``--runs``);
- the dashboard's overview (``GET /`` through its ASGI app, in this process):
  the first request of a fresh app, then the median of ``--runs`` more;
- an idle open overview: ``GET /`` every 5 s, as the page's htmx does, for
  ``--idle`` seconds (over 30 s: the old overview re-read the queue names
  every 30 s), and the commands the server ran meanwhile (INFO commandstats,
  every command, INFO itself left out) per second and per queue shown.

The foreign keys are made by the server itself, ``DEBUG POPULATE N foreign
16`` (ten million in about ten seconds; filling them from a client would take
many minutes on the 2-core machine); the jobs by ``enqueue_many`` in batches
of 10,000. Without ``--url`` the script starts a throwaway redis-server
(``--enable-debug-command yes``, no persistence) and stops it at the end.
With ``--url`` it uses that server, fills it only if it holds fewer keys
than asked, and leaves it as it is: so a checkout from before the registry
can be measured on the same data (the registry key the fill wrote is simply
unused there):

    PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/registry_keyspace.py --url URL

Only public entry points are used (``Client``, the CLI, ``create_app``), so
the same script runs against either checkout. Nothing here is a test: timings
vary with the machine's load; benchmarks/README.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import httpx
import redis.asyncio
from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis.cli.commands import app  # noqa: E402
from venturi_redis.dashboard import create_app  # noqa: E402

QUEUE = "big"
REFRESH = 5.0  # the overview's htmx polling period (templates/overview.html)


class Item(vr.Task):
    KIND: ClassVar[str] = "item"
    n: int


@contextmanager
def server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer("--enable-debug-command", "yes") as s:
        yield s.url


async def fill(url: str, foreign: int, jobs: int) -> None:
    client = vr.Client.from_url(url)
    try:
        have = int(await client.redis.dbsize())
        if have >= foreign + jobs:
            print(f"{have:,} keys there already: not filled", file=sys.stderr)
            return
        t = time.perf_counter()
        # Its own connection, with no socket timeout: the command takes longer than the client's.
        # POPULATE skips the keys that exist, so an interrupted fill is simply run again.
        populate = redis.asyncio.Redis.from_url(url, socket_timeout=600)
        try:
            await populate.execute_command("DEBUG", "POPULATE", foreign, "foreign", 16)
        finally:
            await populate.aclose()
        print(
            f"{foreign:,} foreign keys by DEBUG POPULATE in {time.perf_counter() - t:.1f} s", file=sys.stderr
        )
        q = client.queue(QUEUE)
        t = time.perf_counter()
        for start in range(0, jobs, 10_000):
            await q.enqueue_many([Item(n=i) for i in range(start, min(jobs, start + 10_000))])
        print(f"{jobs:,} jobs by enqueue_many in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    finally:
        await client.aclose()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def cli_process(url: str, *args: str) -> float:
    command = [sys.executable, "-m", "venturi_redis.cli", *args]
    if args != ("--version",):
        command += ["--redis", url]
    t = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=os.environ)
    return time.perf_counter() - t


def cli_in_process(url: str) -> float:
    t = time.perf_counter()
    res = CliRunner().invoke(app, ["stats", "--redis", url])
    took = time.perf_counter() - t
    assert res.exit_code == 0, res.output
    assert QUEUE in res.stdout, res.output
    return took


async def commands(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


async def dashboard(url: str, runs: int, idle: float) -> tuple[float, float, float, int]:
    client = vr.Client.from_url(url)
    try:
        web = create_app(client)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash", timeout=600) as h:
            t = time.perf_counter()
            r = await h.get("/")
            first = time.perf_counter() - t
            assert r.status_code == 200, r.status_code
            assert f'data-queue="{QUEUE}"' in r.text
            samples = []
            for _ in range(runs):
                t = time.perf_counter()
                await h.get("/")
                samples.append(time.perf_counter() - t)
            shown = (await h.get("/api/queues")).json()["queues"]
            before = await commands(client.redis)
            started = time.monotonic()
            while time.monotonic() - started < idle:
                await asyncio.sleep(REFRESH)
                await h.get("/")
            elapsed = time.monotonic() - started
            per_second = (await commands(client.redis) - before) / elapsed
    finally:
        await client.aclose()
    return first, statistics.median(samples), per_second, len(shown)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--foreign", type=int, default=10_000_000)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--url", default=None, help="use this Redis (filled only if it holds fewer keys)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle", type=float, default=65.0)
    args = ap.parse_args()
    with server(args.url) as url:
        asyncio.run(fill(url, args.foreign, args.jobs))
        print(f"package: {Path(vr.__file__).parent}")
        version = statistics.median(cli_process(url, "--version") for _ in range(args.runs))
        whole = statistics.median(cli_process(url, "stats") for _ in range(args.runs))
        cli_in_process(url)  # imports, connection pool, script loads: not the command's own work
        own = statistics.median(cli_in_process(url) for _ in range(args.runs))
        print(f"venturi --version, a fresh process:          {ms(version)}")
        print(f"venturi stats, a fresh process:               {ms(whole)}")
        print(f"venturi stats, its work (in this process):    {ms(own)}")
        first, later, per_second, shown = asyncio.run(dashboard(url, args.runs, args.idle))
        print(f"dashboard overview, first request:            {ms(first)}")
        print(f"dashboard overview, next requests (median):   {ms(later)}")
        print(
            f"idle open overview: {per_second:,.1f} commands/s for {shown} queue(s) shown "
            f"({per_second / max(shown, 1):,.1f} per queue), over {args.idle:g} s"
        )


if __name__ == "__main__":
    main()
