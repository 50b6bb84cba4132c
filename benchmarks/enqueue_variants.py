"""Where a single enqueue's time goes: venturi as shipped vs. two variants.

Usage: ``.venv/bin/python benchmarks/enqueue_variants.py [--n 10000] [--runs 3] [--loop uvloop] [--tls]``

Each row is ``n`` sequential single enqueues in this process against the
script's own redis-server (median of ``runs``):

- venturi as shipped (``Client.from_url``: the enqueue lane, a connection the
  client keeps aside for the enqueue script, ``venturi_redis/_transport/lane.py``);
- the lane reading its replies through redis-py (``read_response``), as the
  lane did before session 14, and over TLS or on uvloop until session 15;
- the same client with the lane switched off: redis-py's per-command path
  (pool hand-off, retry wrapper, reply callbacks), as before session 4;
- enqueue.lua by bare EVALSHA (W8's figure), and ``EVALSHA "return 1"``.

The rows take turns within each run (run 1 of every row, then run 2, ...),
so a drift of the machine's speed falls on all of them alike. ``--loop
uvloop`` runs it all on uvloop (a web app under uvicorn enqueues there);
``--tls`` against a redis-server that speaks only TLS (``rediss://``, a
throwaway CA made by ``openssl``). Beside the
rate, the CPU time per call of this process (``time.process_time``) and of
the server (``INFO cpu``, user + system): on this machine the two take turns
on a sequential round trip, and their sum is steadier than the wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import venturi_bench as VB  # noqa: E402
import venturi_only as VO  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer, make_tls_files  # noqa: E402
from venturi_redis._model.ids import new_job_id  # noqa: E402
from venturi_redis._transport.lane import Lane  # noqa: E402


class RedisPyRead(Lane):
    """The lane, reading its replies through redis-py instead of its own protocol."""

    reads_own_replies = False


async def server_cpu(r: object) -> float:
    info = await r.info("cpu")  # type: ignore[attr-defined]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def rate(n: int, one: object, r: object) -> tuple[float, float, float]:
    """Calls/s, then µs of this process's CPU and of the server's per call."""
    s0, p0, t0 = await server_cpu(r), time.process_time(), time.perf_counter()
    for i in range(n):
        await one(i)  # type: ignore[operator]
    t1, p1, s1 = time.perf_counter(), time.process_time(), await server_cpu(r)
    return n / (t1 - t0), (p1 - p0) / n * 1e6, (s1 - s0) / n * 1e6


async def main(a: argparse.Namespace) -> None:
    tls = make_tls_files(Path(tempfile.mkdtemp(prefix="venturi-tls-"))) if a.tls else None
    with RedisServer(tls=tls) as server:
        url = server.url
        loop = type(asyncio.get_running_loop())
        print(f"{loop.__module__}.{loop.__name__}, {url.split(':', 1)[0]}://", flush=True)
        shipped = vr.Client.from_url(url)
        redis_py_read = vr.Client.from_url(url)
        redis_py_read._lane = RedisPyRead(redis_py_read.redis.connection_pool.make_connection())
        no_lane = vr.Client.from_url(url)
        no_lane._lane = None  # the pool path
        raw = VO.Raw(url)
        await raw.load()
        sha1 = await raw.r.script_load("return 1")
        rows = {
            "venturi Queue.enqueue, as shipped (the enqueue lane)": lambda i: shipped.queue("b").enqueue(
                VB.Noop(i=i)
            ),
            "venturi Queue.enqueue, the lane reading through redis-py": lambda i: redis_py_read.queue(
                "b"
            ).enqueue(VB.Noop(i=i)),
            "venturi Queue.enqueue, lane off (redis-py's pool path)": lambda i: no_lane.queue("b").enqueue(
                VB.Noop(i=i)
            ),
            "enqueue.lua by bare EVALSHA (ids made beforehand)": None,
            'bare EVALSHA "return 1"': lambda i: raw.r.evalsha(sha1, 0),
        }
        results: dict[str, list[tuple[float, float, float]]] = {label: [] for label in rows}
        for _ in range(a.runs):
            for label, fn in rows.items():
                await raw.r.flushall()
                await raw.load()
                if fn is None:
                    ids = [new_job_id() for _ in range(a.n)]
                    results[label].append(await rate(a.n, lambda i, ids=ids: raw.enqueue([ids[i]]), raw.r))
                else:
                    results[label].append(await rate(a.n, fn, raw.r))
        print(
            f"| {a.n:,} sequential single enqueues, median of {a.runs} | jobs/s "
            "| µs of client CPU per call | µs of Redis CPU per call |\n|---|---|---|---|"
        )
        for label, runs in results.items():
            rate_, client, redis_ = (statistics.median(r[j] for r in runs) for j in range(3))
            print(f"| {label} | {rate_:,.0f} | {client:.1f} | {redis_:.1f} |", flush=True)
        lane = shipped.sender.lane
        if lane is None or not lane.direct:
            raise SystemExit("the shipped client's lane did not take the direct path")
        await shipped.aclose()
        await redis_py_read.aclose()
        await no_lane.aclose()
        await raw.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    ap.add_argument("--tls", action="store_true", help="rediss:// against a TLS-only redis-server")
    args = ap.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
