"""What one redriven dead job costs Redis and the redriving client (issue 41; not run in CI),
and one purged or cancelled job (the other bulk actions, ``--action``).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/redrive_cost.py [--n 20000] [--runs 3] [--batch 25]
        [--callgrind] [--action retry|retry-kind|purge|purge-kind|cancel|cancel-kind]

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

``--action`` picks the bulk action measured, on the same ``--n`` jobs:

- ``retry`` (the default): ``queue.retry_dead()``; ``retry-kind``:
  ``retry_dead(kind="doomed")`` (every candidate's fields read too);
- ``purge``: ``queue.purge("dead")`` (purge.lua's own pages of 100, no
  filter); ``purge-kind``: ``purge("dead", kind="doomed")`` (the pager,
  the fields read, purge.lua given ids ``--batch`` at a time);
- ``cancel``: ``queue.cancel_jobs()`` of ``--n`` pending jobs (clones of one
  enqueued job: its hash, no journal, in ``pending:normal``); ``cancel-kind``:
  ``cancel_jobs(kind="doomed")``.
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
from venturi_redis._model.ids import new_job_ids  # noqa: E402
from venturi_redis._producer import bulk  # noqa: E402

ACTIONS = ("retry", "retry-kind", "purge", "purge-kind", "cancel", "cancel-kind")

# The last run's commands: name -> (calls per job, µs per job).
DETAIL: dict[str, tuple[float, float]] = {}


# The callgrind dumps of the runs (``--keep``).
DUMPS: list[Path] = []

# Clones the template pending job (benchmark-only, as redrive.SEED for dead
# ones): its hash, its place in its pending set. ARGV: prefix, pending set,
# first score, #fields, fields..., ids...
SEED_PENDING = """
local prefix = ARGV[1]
local score = tonumber(ARGV[3])
local nf = tonumber(ARGV[4])
local fields = {}
for i = 1, nf do fields[i] = ARGV[4 + i] end
for i = 5 + nf, #ARGV do
  redis.call('HSET', prefix .. 'job:' .. ARGV[i], unpack(fields))
  redis.call('ZADD', ARGV[2], score, ARGV[i])
  score = score + 1
end
return 1
"""


async def seed_pending(url: str, n: int) -> None:
    """``n`` pending jobs on queue ``dead``: clones of one enqueued ``Doomed`` job."""
    client = vr.Client.from_url(url)
    try:
        q = client.queue("dead")
        (template,) = await q.enqueue_many([redrive.Doomed()])
        r = client.redis
        fields = await r.hgetall(q.keys.job(template))
        assert fields[b"state"] == b"pending"
        pending = q.keys.pending(vr.Priority.NORMAL)
        ((_, base),) = await r.zrange(pending, 0, 0, withscores=True)
        await r.delete(pending, q.keys.job(template), q.keys.journal(template))
        flat = [x for kv in fields.items() for x in kv]
        sha = await r.script_load(SEED_PENDING)
        for done in range(0, n, 2000):
            ids = new_job_ids(min(2000, n - done))
            await r.evalsha(sha, 0, q.keys.prefix, pending, int(base) - n + done, len(flat), *flat, *ids)
    finally:
        await client.aclose()


async def warm_up(client: vr.Client) -> None:
    """Every script the actions call loaded (compiled) first, on another queue: its EVAL is
    once per server, not per job."""
    warm = client.queue("warm")
    await warm.store.retry_dead([], "warm-up")
    await warm.enqueue_many([redrive.Doomed(), redrive.Doomed()])
    await warm.cancel_jobs(limit=1)
    await warm.cancel_jobs(kind="doomed")
    await warm.purge("cancelled", limit=1)
    await warm.purge("cancelled")


async def act(q: vr.Queue, action: str) -> int:
    """Run ``action`` on ``q``: how many jobs it acted on."""
    if action == "retry":
        return len(await q.retry_dead())
    if action == "retry-kind":
        return len(await q.retry_dead(kind="doomed"))
    if action == "purge":
        return await q.purge("dead")
    if action == "purge-kind":
        return await q.purge("dead", kind="doomed")
    if action == "cancel":
        return len(await q.cancel_jobs())
    assert action == "cancel-kind", action
    return len(await q.cancel_jobs(kind="doomed"))


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def one_run(url: str, n: int, pid: int | None, out: Path | None, action: str) -> dict[str, float]:
    client = vr.Client.from_url(url)
    r = client.redis
    try:
        await r.flushall()
        if action.startswith("cancel"):
            await seed_pending(url, n)
        else:
            await redrive.seed(url, n)
        await warm_up(client)
        await r.config_resetstat()
        cpu0 = _cpu(await r.info("cpu"))
        if pid is not None:
            await callgrind_control(pid, "-z")
        u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        done = await act(client.queue("dead"), action)
        u1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if pid is not None:
            await callgrind_control(pid, "-d")
        cpu1 = _cpu(await r.info("cpu"))
        stats = await r.info("commandstats")
        assert done == n, done
        counts = await client.queue("dead").counts()
        assert counts["dead"] == 0, counts
        after = {"retry": ("pending", n), "purge": ("pending", 0), "cancel": ("cancelled", n)}
        state, want = after[action.split("-")[0]]
        assert counts[state] == want, counts
        if action.startswith("purge"):
            assert await r.dbsize() < 20, await r.keys("*")  # the jobs and their journals gone
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


async def run_all(
    url: str, n: int, runs: int, pid: int | None, out: Path | None, action: str
) -> list[dict[str, float]]:
    if pid is not None:
        import redis.asyncio as aioredis

        probe = aioredis.Redis.from_url(url)
        try:
            await server_up(probe)
        finally:
            await probe.aclose()
    return [await one_run(url, n, pid, out, action) for _ in range(runs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="dead (or pending) jobs per run")
    ap.add_argument("--action", default="retry", choices=ACTIONS, help="the bulk action measured")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, help="jobs per script call (default: the library's)")
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
            rows = asyncio.run(run_all(url, args.n, args.runs, pid, out, args.action))
        finally:
            server.terminate()
            server.wait(30)
            if args.keep is not None:
                for dump in DUMPS:
                    shutil.move(dump, args.keep / dump.name)
    print(f"{vr.__file__}: {args.action}, {args.n:,} jobs, batch {bulk.BATCH}, median of {args.runs}")
    for key in rows[0]:
        vals = [row[key] for row in rows]
        print(f"  {key:18} {statistics.median(vals):10.2f}   ({', '.join(f'{v:.2f}' for v in vals)})")
    print("  the last run's commands (INFO commandstats; a script's own included), per job:")
    for name, (calls, us) in sorted(DETAIL.items(), key=lambda kv: -kv[1][1]):
        print(f"    {name:18} {calls:7.3f} calls  {us:7.2f} µs")


if __name__ == "__main__":
    main()
