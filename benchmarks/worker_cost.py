"""The worker process's own cost per job, in instructions (callgrind): repeatable on a noisy machine.

Usage (from the repository root; needs valgrind)::

    .venv/bin/python benchmarks/worker_cost.py [ROOT ...] [--concurrency 100] [--incr]

For each checkout ROOT (default: this one; another one made with ``git
worktree add``), a fresh redis-server of its own gets ``small`` then ``large``
no-op jobs, and a worker process drains each under ``valgrind --tool=callgrind``
(``benchmarks/_cg_worker.py``). The figure is the difference of the two
runs' instruction counts over the difference in jobs: the interpreter's
start-up and the imports cancel out, what is left is the worker's cost per
job (claim parsing, the handler call, the completion, asyncio, redis-py).
``--incr``: the handler sends one redis-py ``INCR``, as W2's does (the
worker's ``_cg_worker.py`` runs from this checkout, so a ROOT older than
this option gets it too). ``--logging``: the worker's logging set up as
``venturi worker`` sets it up (INFO, its text lines, ``vr.JobLogFilter``; to
/dev/null); ``--log-runs``: that and ``Worker(log_runs=True)``, one line per
run (docs/observability.md, "Logs": what the line costs is the difference).

Wall-clock CPU per job on this shared 2-core machine swings by 20-30 % between
two runs of the same code minutes apart (``benchmarks/w2_ab.py`` shows it);
this count moves by under 1 %. Compare versions with it; quote jobs/s from
``benchmarks/run.py`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

ENQUEUE = """
import asyncio, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {here!r})
import venturi_redis as vr
from _cg_worker import Noop

async def main():
    c = vr.Client.from_url({url!r})
    await c.queue("bench").enqueue_many([Noop(i=i) for i in range({n})])
    await c.aclose()

asyncio.run(main())
"""


def instructions(root: str, url: str, n: int, concurrency: int, incr: bool = False, logs: str = "") -> int:
    redis.Redis.from_url(url).flushall()
    subprocess.run(
        [sys.executable, "-c", ENQUEUE.format(root=root, here=str(HERE), url=url, n=n)], check=True
    )
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                str(HERE / "_cg_worker.py"),
                root,
                url,
                str(concurrency),
                *(["incr"] if incr else []),
                *([logs] if logs else []),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        m = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.M)
        assert m, "no totals in the callgrind output"
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("roots", nargs="*", default=[str(HERE.parent)])
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=4000)
    ap.add_argument("--incr", action="store_true", help="the handler sends one INCR (W2's), not nothing")
    ap.add_argument("--logging", action="store_true", help="logging set up as venturi worker does")
    ap.add_argument("--log-runs", action="store_true", help="that and Worker(log_runs=True)")
    a = ap.parse_args()
    logs = "logruns" if a.log_runs else "logging" if a.logging else ""
    with RedisServer() as server:
        for root in a.roots:
            lo = instructions(root, server.url, a.small, a.concurrency, a.incr, logs)
            hi = instructions(root, server.url, a.large, a.concurrency, a.incr, logs)
            per_job = (hi - lo) / (a.large - a.small)
            label = f"worker process, c={a.concurrency}" + (", INCR handler" if a.incr else "")
            label += {"logruns": ", --log-runs", "logging": ", logging"}.get(logs, "")
            print(f"{root}: {per_job:,.0f} instructions per job ({label})", flush=True)


if __name__ == "__main__":
    main()
