"""What one redriven dead job costs Redis and the redriving client (issue 41; not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/redrive_cost.py [--n 20000] [--runs 3] [--batch 25]
        [--callgrind]

The live p99 during a redrive (``benchmarks/redrive.py``) depends on how long
each ``retry_dead.lua`` call holds Redis (a claim waits behind it) and on how
much CPU the redriving client takes from the two cores: this measures both
without live traffic, so that a noisy machine moves them little. Each run
seeds ``--n`` dead jobs on a fresh database (``redrive.py``'s clones of a job
a worker really killed), then runs ``queue.retry_dead()`` from this process
and reports, per redriven job:

- Redis's time in the commands it ran (``INFO commandstats``, all of them:
  the scripts and the page reads), and in ``EVALSHA``/``FCALL`` alone, with
  the calls made and the µs per call (what one claim may wait behind);
- Redis's process CPU (``INFO cpu``, user + sys: parsing and networking too);
- the client's CPU (``getrusage`` of this process during the redrive: user, system).

``--callgrind`` runs the server under ``valgrind --tool=callgrind`` and gives
Redis's instructions per job instead of its times (repeatable to ~0.1%; with
a smaller ``--n``: the server is ~50x slower). The median of ``--runs`` is
printed. For an A/B, run the same file with ``PYTHONPATH`` set to the other
checkout (its scripts come from there).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import redrive  # noqa: E402
from redis_cost import _free_port, _total, callgrind_control, server_up  # noqa: E402

import venturi_redis as vr  # noqa: E402
from venturi_redis._producer import bulk  # noqa: E402

# The last run's commands: name -> (calls per job, µs per job).
DETAIL: dict[str, tuple[float, float]] = {}


# The callgrind dumps of the runs (``--keep``).
DUMPS: list[Path] = []


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def one_run(url: str, n: int, pid: int | None, out: Path | None) -> dict[str, float]:
    client = vr.Client.from_url(url)
    r = client.redis
    try:
        await r.flushall()
        await redrive.seed(url, n)
        # The script loaded (compiled) first: its EVAL is once per server, not per job.
        await client.queue("dead").store.retry_dead([], "warm-up")
        await r.config_resetstat()
        cpu0 = _cpu(await r.info("cpu"))
        if pid is not None:
            await callgrind_control(pid, "-z")
        u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        moved = await client.queue("dead").retry_dead()
        u1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if pid is not None:
            await callgrind_control(pid, "-d")
        cpu1 = _cpu(await r.info("cpu"))
        stats = await r.info("commandstats")
        assert len(moved) == n, len(moved)
        counts = await client.queue("dead").counts()
        assert counts["dead"] == 0, counts
        assert counts["pending"] == n, counts
    finally:
        await client.aclose()
    script_keys = ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval")
    scripts = [v for k, v in stats.items() if k in script_keys]
    # Every command, the scripts' own included (commandstats counts those too),
    # per job: what a script call is made of.
    skip = {"cmdstat_info", "cmdstat_config|resetstat"}
    DETAIL.clear()
    DETAIL.update(
        {k[8:]: (int(v["calls"]) / n, float(v["usec"]) / n) for k, v in stats.items() if k not in skip}
    )
    script_us = sum(float(v["usec"]) for v in scripts)
    script_calls = sum(int(v["calls"]) for v in scripts)
    got = {
        "wall_s": t1 - t0,
        "script_us_job": script_us / n,
        "script_us_call": script_us / max(script_calls, 1),
        "calls": float(script_calls),
        "redis_cpu_us_job": (cpu1 - cpu0) * 1e6 / n,
        "client_user_us_job": (u1.ru_utime - u0.ru_utime) * 1e6 / n,
        "client_sys_us_job": (u1.ru_stime - u0.ru_stime) * 1e6 / n,
    }
    if out is not None:
        got["instructions_job"] = _total(Path(f"{out}.1")) / n
        dump = out.with_name(f"{out.name}.redrive{len(DUMPS)}")
        out.with_name(out.name + ".1").rename(dump)
        DUMPS.append(dump)
    return got


async def run_all(url: str, n: int, runs: int, pid: int | None, out: Path | None) -> list[dict[str, float]]:
    if pid is not None:
        import redis.asyncio as aioredis

        probe = aioredis.Redis.from_url(url)
        try:
            await server_up(probe)
        finally:
            await probe.aclose()
    return [await one_run(url, n, pid, out) for _ in range(runs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="dead jobs per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, help="jobs per retry_dead.lua call (default: the library's)")
    ap.add_argument("--callgrind", action="store_true", help="Redis's instructions per job (valgrind)")
    ap.add_argument("--keep", type=Path, help="with --callgrind: keep the dumps there (callgrind_annotate)")
    args = ap.parse_args()
    if args.batch is not None:
        bulk.BATCH = args.batch
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg" if args.callgrind else None
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if out is not None:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        try:
            time.sleep(0.3)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
            url = f"redis://127.0.0.1:{port}/0"
            pid = server.pid if out is not None else None
            rows = asyncio.run(run_all(url, args.n, args.runs, pid, out))
        finally:
            server.terminate()
            server.wait(30)
            if args.keep is not None:
                for dump in DUMPS:
                    shutil.move(dump, args.keep / dump.name)
    print(f"{vr.__file__}: {args.n:,} dead jobs, batch {bulk.BATCH}, median of {args.runs}")
    for key in rows[0]:
        vals = [row[key] for row in rows]
        print(f"  {key:18} {statistics.median(vals):10.2f}   ({', '.join(f'{v:.2f}' for v in vals)})")
    print("  the last run's commands (INFO commandstats; a script's own included), per job:")
    for name, (calls, us) in sorted(DETAIL.items(), key=lambda kv: -kv[1][1]):
        print(f"    {name:18} {calls:7.3f} calls  {us:7.2f} µs")


if __name__ == "__main__":
    main()
