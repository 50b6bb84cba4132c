"""Redis time of venturi's scripts per job (``INFO commandstats``), enqueue and drain apart.

Usage (against a Redis of your own; it is flushed and its stats reset)::

    PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/lua_cost.py redis://127.0.0.1:7101/0 20000
    PYTHONPATH=. .venv/bin/python benchmarks/lua_cost.py redis://127.0.0.1:7101/0 20000

Each checkout's ``venturi_redis`` loads its own ``lua/``; alternate the two
several times and compare medians.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import redis.asyncio as aioredis
from drain_loop import Noop, NoopJob  # the same no-op task (state None: no INCR)

import venturi_redis as vr


def script_usec(info: dict[str, Any]) -> float:
    return float(sum(v["usec"] for k, v in info.items() if k.startswith("cmdstat_eval")))


async def main(url: str, n: int) -> dict[str, float]:
    r = aioredis.Redis.from_url(url)
    q = vr.Client.from_url(url).queue("ab")
    for i in range(200):  # load the scripts
        await q.enqueue(Noop(i=i))
    await r.flushall()
    await r.config_resetstat()
    for s in range(0, n, 100):
        await asyncio.gather(*(q.enqueue(Noop(i=i)) for i in range(s, s + 100)))
    enqueue = script_usec(await r.info("commandstats"))
    await r.config_resetstat()
    w = vr.Worker(q, state=None, concurrency=100)
    w.register(NoopJob)
    await w.run(until_idle=True)
    drain = script_usec(await r.info("commandstats"))
    return {"enqueue_us_per_job": round(enqueue / n, 2), "drain_us_per_job": round(drain / n, 2)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
