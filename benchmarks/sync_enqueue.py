"""A blocking producer's single enqueue (``vr.SyncClient``): the direct path against the loop thread's.

Usage (from the repository root)::

    .venv/bin/python benchmarks/sync_enqueue.py [--n 10000] [--runs 3] [--tls]

Against a redis-server of its own, ``n`` sequential ``SyncQueue.enqueue``
calls per row, the rows taking turns within each run (median of ``runs``):

- ``SyncClient`` as shipped: the enqueue checked, encoded and sent from the
  calling thread on a blocking connection (``venturi_redis/_producer/sync.py``);
- the same with the direct path off: each call handed to the client's event
  loop thread through the anyio portal and back, as before session 15;
- a blocking redis-py ``EVALSHA "return 1"``, the round trip underneath.

Beside the rate, this process's CPU time per call (both threads).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import venturi_bench as VB  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer, make_tls_files  # noqa: E402


def rate(n: int, one: Callable[[int], Any]) -> tuple[float, float]:
    p0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        one(i)
    t1, p1 = time.perf_counter(), time.process_time()
    return n / (t1 - t0), (p1 - p0) / n * 1e6


def main(a: argparse.Namespace) -> None:
    tls = make_tls_files(Path(tempfile.mkdtemp(prefix="venturi-tls-"))) if a.tls else None
    with RedisServer(tls=tls) as server:
        shipped = vr.SyncClient(server.url)
        portal = vr.SyncClient(server.url)
        assert shipped._direct is not None
        portal._direct = None  # every enqueue through the loop thread
        raw = redis.Redis(host="127.0.0.1", port=server.port, **server.connect_kwargs())
        sha = raw.script_load("return 1")
        sq, pq = shipped.queue("b"), portal.queue("b")
        rows: dict[str, Callable[[int], Any]] = {
            "SyncQueue.enqueue, as shipped (the direct path)": lambda i: sq.enqueue(VB.Noop(i=i)),
            "SyncQueue.enqueue through the loop thread (the portal)": lambda i: pq.enqueue(VB.Noop(i=i)),
            'blocking redis-py EVALSHA "return 1"': lambda i: raw.evalsha(sha, 0),
        }
        for one in rows.values():
            one(0)  # connections made, scripts loaded
        results: dict[str, list[tuple[float, float]]] = {label: [] for label in rows}
        for _ in range(a.runs):
            for label, one in rows.items():
                results[label].append(rate(a.n, one))
            raw.flushall()
            raw.script_load("return 1")
        scheme = server.url.split(":", 1)[0]
        print(
            f"| {a.n:,} sequential enqueues, {scheme}://, median of {a.runs} | jobs/s "
            "| µs of client CPU per call |\n|---|---|---|"
        )
        for label, runs in results.items():
            r, cpu = (statistics.median(x[j] for x in runs) for j in range(2))
            print(f"| {label} | {r:,.0f} | {cpu:.1f} |", flush=True)
        shipped.close()
        portal.close()
        raw.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tls", action="store_true", help="rediss:// against a TLS-only redis-server")
    main(ap.parse_args())
