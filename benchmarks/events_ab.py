"""The event stream's cost (issue 30): W1 single with events off and on, in alternating pairs,
and the idle cost of an ``events()`` follower.

Usage (from the repository root)::

    .venv/bin/python benchmarks/events_ab.py [--n 5000] [--pairs 3] [--idle 20]

Against a redis-server of its own: each pair enqueues ``n`` jobs one at a
time from this process (``queue.enqueue``, W1 single), once with the queue's
event stream off and once on (capped at 10,000), and reports jobs/s, this
process's CPU per job and the server's CPU per job (``/proc``). Then one
``queue.events()`` follower idles on an empty queue for ``--idle`` seconds:
the commands it sent per second (``INFO commandstats``). For W2 (drain) with
events off and on, ``benchmarks/w2_ab.py --b-events 10000``; for Redis's
instructions per job, ``benchmarks/redis_cost.py --events 10000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402


class Noop(vr.Task):
    KIND = "noop"
    i: int = 0


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def w1_single(url: str, server_pid: int, n: int, events: bool) -> dict[str, float]:
    client = vr.Client.from_url(url)
    try:
        await client.redis.flushall()
        q = client.queue("bench")
        await q.set_events(events, maxlen=10_000)
        await q.enqueue(Noop(i=-1))  # connections open, scripts loaded
        cpu0, srv0, t0 = time.process_time(), _proc_cpu(server_pid), time.perf_counter()
        for i in range(n):
            await q.enqueue(Noop(i=i))
        seconds = time.perf_counter() - t0
        cpu, srv = time.process_time() - cpu0, _proc_cpu(server_pid) - srv0
    finally:
        await client.aclose()
    return {"jobs_s": n / seconds, "cpu_us": cpu / n * 1e6, "redis_us": srv / n * 1e6}


async def idle_follower(url: str, seconds: float) -> float:
    client = vr.Client.from_url(url)
    try:
        q = client.queue("idle")
        await q.set_events(True)
        await client.redis.config_resetstat()

        async def follow() -> None:
            async for _ in q.events():
                pass

        task = asyncio.ensure_future(follow())
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stats: dict[str, Any] = await client.redis.info("commandstats")
        sent = sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_xread", "cmdstat_xrevrange"))
    finally:
        await client.aclose()
    return sent / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--idle", type=float, default=20.0, help="seconds of the idle follower (0: skip)")
    a = p.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with RedisServer() as server:
        assert server.proc is not None
        pid = server.proc.pid
        for i in range(a.pairs):
            for events in (False, True):
                x = asyncio.run(w1_single(server.url, pid, a.n, events))
                runs[events].append(x)
                print(
                    f"pair {i + 1} events {'on ' if events else 'off'}: {x['jobs_s']:,.0f} jobs/s, "
                    f"client {x['cpu_us']:.0f} µs CPU/job, redis {x['redis_us']:.1f} µs CPU/job",
                    flush=True,
                )
        for events in (False, True):
            med = {k: statistics.median(x[k] for x in runs[events]) for k in ("jobs_s", "cpu_us", "redis_us")}
            print(
                f"W1 single, events {'on' if events else 'off'}: median {med['jobs_s']:,.0f} jobs/s, "
                f"client {med['cpu_us']:.0f} µs CPU/job, redis {med['redis_us']:.1f} µs CPU/job"
            )
        if a.idle > 0:
            rate = asyncio.run(idle_follower(server.url, a.idle))
            print(f"idle events() follower: {rate:.2f} commands/s")


if __name__ == "__main__":
    main()
