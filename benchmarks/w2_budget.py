"""W2 against W8, taken apart: where a drained job's time goes in the worker's process.

Usage (from the repository root)::

    .venv/bin/python benchmarks/w2_budget.py [--n 20000] [--rounds 4]

The target "W2 ≥ 50% of W8" gives the worker's process 2 / ceiling seconds
per job. This script measures, in one sitting and against a redis-server of
its own, what that process spends them on. Each round, in this order (the
machine's speed drifts within minutes, so a round's figures are read
together):

1. the W8 ceiling: venturi's claim and complete scripts driven by bare
   redis-py, 100 per round trip (``venturi_only.ceiling_once``);
2. the W2 handler alone: its ``INCR`` from the adapters' recorder
   (``peers/_common.AsyncRecorder``), 100 at a time, no queue;
3. venturi's drain in this process at concurrency 100 with an empty handler,
   then 4. with the ``INCR`` handler (``drain_loop.py``).

For each: jobs/s, the process's CPU per job, and its busy share (CPU time
over wall time). The handler and venturi share the worker's one event loop,
while Redis runs the scripts on the other core; so the drain can reach the
target only if the worker spends at most the budget per job: the handler's
CPU, venturi's own, and the time it waits, together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import drain_loop  # noqa: E402
import venturi_only  # noqa: E402

from tests.servers import RedisServer  # noqa: E402


def one_round(url: str, r: redis.Redis, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ceiling_jobs_s": asyncio.run(venturi_only.ceiling_once(url, r, n))}
    out["handler_alone"] = asyncio.run(venturi_only.handler_alone(url, n))
    for name, incr in (("drain_empty", False), ("drain_incr", True)):
        res = asyncio.run(drain_loop.main(url, n, incr))
        res["busy"] = res["jobs_s"] * res["cpu_us_per_job"] / 1e6
        out[name] = res
    return out


def report(rounds: list[dict[str, Any]]) -> str:
    lines = [
        "| round | ceiling jobs/s | budget µs/job (50%) | handler alone: jobs/s, CPU µs/job "
        "| empty handler: jobs/s, CPU µs/job, busy | INCR handler: jobs/s, CPU µs/job, busy "
        "| W2/W8 | venturi's CPU µs/job (INCR drain minus handler alone) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, x in enumerate(rounds, 1):
        ceiling, alone = x["ceiling_jobs_s"], x["handler_alone"]
        empty, incr = x["drain_empty"], x["drain_incr"]
        lines.append(
            f"| {i} | {ceiling:,.0f} | {2e6 / ceiling:.1f} "
            f"| {alone['jobs_s']:,.0f}, {alone['cpu_us_per_job']:.1f} "
            f"| {empty['jobs_s']:,.0f}, {empty['cpu_us_per_job']:.1f}, {empty['busy']:.0%} "
            f"| {incr['jobs_s']:,.0f}, {incr['cpu_us_per_job']:.1f}, {incr['busy']:.0%} "
            f"| {incr['jobs_s'] / ceiling:.0%} "
            f"| {incr['cpu_us_per_job'] - alone['cpu_us_per_job']:.1f} |"
        )
    ratios = [x["drain_incr"]["jobs_s"] / x["ceiling_jobs_s"] for x in rounds]
    median = statistics.median(ratios)
    lines.append(f"\nW2/W8 (in-process INCR drain over the ceiling of its round): median {median:.0%}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="jobs per measurement")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", type=Path, help="also write every figure here")
    a = p.parse_args()
    rounds = []
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        for i in range(a.rounds):
            rounds.append(one_round(server.url, r, a.n))
            print(f"round {i + 1}: {json.dumps(rounds[-1])}", file=sys.stderr)
        r.close()
    print(report(rounds))
    if a.json:
        a.json.write_text(json.dumps(rounds, indent=2))


if __name__ == "__main__":
    main()
