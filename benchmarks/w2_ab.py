"""W2 A/B: the benchmark's venturi worker process, two variants, alternating pairs.

Usage (from the repository root)::

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/w2_ab.py --base /tmp/base            # that checkout against this one
    .venv/bin/python benchmarks/w2_ab.py --b-args="--loop uvloop"     # one checkout, two worker options

Against a redis-server of its own, each run is one W2 drain as
``benchmarks/run.py`` does it (10,000 jobs filled, then the adapter's worker
process at concurrency 100, jobs/s from its start until the counter reaches
10,000), followed at once by a W8 ceiling run (``venturi_only.ceiling_once``),
so each drain has a ceiling measured at the same speed of the machine. Also
the worker process's CPU per job (``/proc``, from its start mark to the end
mark) and its busy share. Variant A runs first in each pair, then B; the
machine's speed drifts within minutes, so compare the medians of the pairs.

Variant A is ``--base`` (a checkout put first on ``PYTHONPATH``; default:
this one) with ``--a-args``; variant B is this checkout with ``--b-args``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import venturi_only  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

PEERS = HERE / "peers"
N = 10_000


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tail(log: Any) -> str:
    log.flush()
    log.seek(0)
    return str(log.read().decode(errors="replace")[-800:])


def drain(
    url: str,
    r: redis.Redis,
    pythonpath: str | None,
    args: list[str],
    events: int = 0,
    limit: str = "",
    history: bool = False,
) -> dict[str, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r.flushall()
    if events:  # the queue's event stream on, capped at `events` (docs/observability.md)
        r.hset(f"venturi:{{{venturi_only.QUEUE}}}:meta", "events", str(events))
        r.xadd(f"venturi:{{{venturi_only.QUEUE}}}:events", {"event": "events_on"})  # the stream must exist
    if history:  # the queue's metrics history on (docs/observability.md "Metrics history")
        r.hset(f"venturi:{{{venturi_only.QUEUE}}}:meta", "history", "1")
    if limit:  # KIND=N: a kind-wide concurrency limit (docs/flow-control.md), as limit.lua writes it
        kind, _, cap = limit.partition("=")
        r.hset(f"venturi:{{{venturi_only.QUEUE}}}:limits", kind, f"{int(cap)} 0 0 0 0 0")
        r.hset(f"venturi:{{{venturi_only.QUEUE}}}:meta", "limits", "1")
    adapter = [sys.executable, str(PEERS / "venturi_bench.py")]
    subprocess.run([*adapter, "fill", "--url", url, "--n", str(N)], cwd=PEERS, env=env, check=True)
    worker = [*adapter, "worker", "--url", url, "--n", str(N), "--concurrency", "100", *args]
    # The worker's output goes to a file, read only when it fails.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(worker, cwd=PEERS, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not r.get("bench:start"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not start: {_tail(log)}")
                time.sleep(0.001)
            cpu0 = _proc_cpu(proc.pid)
            while not r.get("bench:end"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not finish: {_tail(log)}")
                time.sleep(0.002)
            cpu = _proc_cpu(proc.pid) - cpu0
            seconds = float(r.get("bench:end") or 0) - float(r.get("bench:start") or 0)
        finally:
            proc.terminate()
            proc.wait(10)
    ceiling = asyncio.run(venturi_only.ceiling_once(url, r, N))
    rate = N / seconds
    return {
        "jobs_s": rate,
        "ceiling": ceiling,
        "ratio": rate / ceiling,
        "cpu_us": cpu / N * 1e6,
        "busy": cpu / seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="checkout for variant A (default: this one)")
    p.add_argument("--a-args", default="", help="extra worker arguments for A")
    p.add_argument("--b-args", default="", help="extra worker arguments for B")
    p.add_argument("--a-events", type=int, default=0, help="A: the event stream on, capped at N")
    p.add_argument("--b-events", type=int, default=0, help="B: the event stream on, capped at N")
    p.add_argument("--a-limit", default="", help="A: KIND=N, a kind-wide concurrency limit (noop: the jobs')")
    p.add_argument("--b-limit", default="", help="B: KIND=N, a kind-wide concurrency limit")
    p.add_argument("--a-history", action="store_true", help="A: the metrics history on")
    p.add_argument("--b-history", action="store_true", help="B: the metrics history on")
    p.add_argument("--pairs", type=int, default=6)
    a = p.parse_args()
    variants = {
        "A": (a.base, shlex.split(a.a_args), a.a_events, a.a_limit, a.a_history),
        "B": (None, shlex.split(a.b_args), a.b_events, a.b_limit, a.b_history),
    }
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        for i in range(a.pairs):
            for name, (path, args, events, limit, history) in variants.items():
                x = drain(server.url, r, path, args, events, limit, history)
                runs[name].append(x)
                print(
                    f"pair {i + 1} {name}: {x['jobs_s']:,.0f} jobs/s, ceiling {x['ceiling']:,.0f}/s, "
                    f"W2/W8 {x['ratio']:.1%}, worker {x['cpu_us']:.0f} µs CPU/job, busy {x['busy']:.0%}",
                    flush=True,
                )
        r.close()

    def med(name: str, key: str) -> Any:
        return statistics.median(x[key] for x in runs[name])

    for name, (path, args, events, limit, history) in variants.items():
        label = f"{path or 'this checkout'} {' '.join(args)}{f' events {events}' if events else ''}"
        label = f"{label}{f' limit {limit}' if limit else ''}{' history on' if history else ''}".strip()
        ratios = ", ".join(f"{x['ratio']:.0%}" for x in runs[name])
        print(
            f"{name} ({label}): median {med(name, 'jobs_s'):,.0f} jobs/s, W2/W8 {med(name, 'ratio'):.1%} "
            f"(runs {ratios}), {med(name, 'cpu_us'):.0f} µs CPU/job, busy {med(name, 'busy'):.0%}"
        )


if __name__ == "__main__":
    main()
