"""Redis memory of the metrics history per queue·kind (docs/observability.md "Metrics history").

Usage (from the repository root)::

    .venv/bin/python benchmarks/history_memory.py [--kinds 2] [--jobs 20]

Against a redis-server of its own, a queue with its history on and a clocked
client (``venturi_redis.testing.Clock``) writes the history as the scripts do
(``enqueue_many`` of ``--jobs`` jobs of each kind, their claim and their
completion: ``enqueue.lua``, ``claim.lua``, ``complete.lua``): once an hour
for 28 days, then once a minute for the last 48 hours, so that every hour of
30 days and every minute of 48 hours holds each kind's counters (the failed
and dead counters are added with ``HINCRBY`` to the same fields the scripts
write, so each hash holds all five). Minutes older than 48 hours are deleted:
their keys expire then. Then ``MEMORY USAGE ... SAMPLES 0`` summed over the
2,880 minute hashes and the 720 hour hashes: the history's memory, for one
kind and for each more.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import venturi_redis as vr  # noqa: E402
from tests.helpers import claim_raw, claimed_jobs  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis._store.calls_ending import completion  # noqa: E402
from venturi_redis.testing import Clock  # noqa: E402

MINUTE, HOUR = 60_000, 3_600_000


def kind_task(i: int) -> type[vr.Task]:
    class K(vr.Task):
        KIND: ClassVar[str] = f"app.tasks.kind_{i}"

    return K


async def write(queue: vr.Queue, clock: Clock, tasks: list[type[vr.Task]], jobs: int) -> None:
    """One period's counters for every kind, by the scripts, at the clock's time."""
    await queue.enqueue_many([t() for t in tasks for _ in range(jobs)])
    got = claimed_jobs(await claim_raw(queue, len(tasks) * jobs))
    clock.advance(timedelta(seconds=1))  # the runs' time
    await queue.store.send(queue.store.complete_op([completion(j, t, "", b"", b"", b"") for j, t in got]))
    now = clock()
    pipe = queue.client.redis.pipeline(transaction=False)
    for key in (queue.keys.history_minute(now // MINUTE * 60), queue.keys.history_hour(now // HOUR * 3600)):
        for t in tasks:
            pipe.hincrby(key, f"{t.kind()}\tfailed", 3)
            pipe.hincrby(key, f"{t.kind()}\tdead", 1)
    await pipe.execute()


async def measure(url: str, kinds: int, jobs: int) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    start = now_ms - now_ms % HOUR
    clock = Clock(datetime.fromtimestamp(start / 1000, UTC))
    async with vr.Client.from_url(url, clock=clock) as client:
        queue = client.queue("history-memory")
        await queue.set_history(True)
        tasks = [kind_task(i) for i in range(kinds)]
        end = start + 30 * 24 * HOUR
        recent = end - 48 * HOUR
        # Every hour of the 28 days before the last 48 hours: once, at its half.
        for h in range(start, recent, HOUR):
            clock.advance_to(h + 30 * MINUTE)
            await write(queue, clock, tasks, jobs)
        # Every minute of the last 48 hours.
        for m in range(recent, end, MINUTE):
            clock.advance_to(m + 10_000)
            await write(queue, clock, tasks, jobs)
        r = client.redis
        minutes = [queue.keys.history_minute(m // 1000) for m in range(recent, end, MINUTE)]
        hours = [queue.keys.history_hour(h // 1000) for h in range(start, end, HOUR)]
        stale = [queue.keys.history_minute(h // 1000 // 60 * 60 + 1800) for h in range(start, recent, HOUR)]
        await r.delete(*stale)  # expired by then (48 hours after their minute)
        pipe = r.pipeline(transaction=False)
        for key in [*minutes, *hours]:
            pipe.memory_usage(key, samples=0)
        sizes = [int(s or 0) for s in await pipe.execute()]
        fields = await r.hlen(minutes[-1])
    return {
        "minutes": sum(sizes[: len(minutes)]),
        "hours": sum(sizes[len(minutes) :]),
        "minute_keys": sum(1 for s in sizes[: len(minutes)] if s),
        "hour_keys": sum(1 for s in sizes[len(minutes) :] if s),
        "fields": fields,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", type=int, default=2, help="measure 1..N kinds (default 2)")
    ap.add_argument("--jobs", type=int, default=20, help="jobs of each kind per period (default 20)")
    a = ap.parse_args()
    results = []
    for kinds in range(1, a.kinds + 1):
        with RedisServer() as server:
            got = asyncio.run(measure(server.url, kinds, a.jobs))
        results.append(got)
        total = got["minutes"] + got["hours"]
        print(
            f"{kinds} kind(s): {got['minute_keys']} minute hashes {got['minutes'] / 1024:,.0f} KiB "
            f"+ {got['hour_keys']} hour hashes {got['hours'] / 1024:,.0f} KiB = {total / 1024:,.0f} KiB "
            f"({got['fields']} fields a hash)",
            flush=True,
        )
    if len(results) > 1:
        one = results[0]["minutes"] + results[0]["hours"]
        more = (results[-1]["minutes"] + results[-1]["hours"] - one) / (len(results) - 1)
        print(f"per queue·kind: {one / 1024:,.0f} KiB for the first kind, {more / 1024:,.0f} KiB each more")


if __name__ == "__main__":
    main()
