"""Redriving N dead jobs while a worker serves live traffic (issue 41; not run in CI).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/redrive.py --dead 100000 [--baseline 10] [--batch 50]
        [--filter kind]

1. Starts a throwaway redis-server. Kills one job for real (a worker runs a
   handler that raises ``TaskError.permanent``: ``dead.lua`` writes it), and
   clones it ``--dead`` times: the same hash, the same journal (compacted to
   its exact size as ``dead.lua`` leaves it), each id in the dead set one
   millisecond after the last, the newest when the template died. Cloning
   is a benchmark-only Lua loop (a million deaths through workers would take
   minutes).
2. Live traffic, W3's shape (benchmarks/README.md): a worker process
   (concurrency 10) on queue ``live``, a producer process enqueueing 200
   jobs/s there, each carrying ``time.time()`` taken just before its
   enqueue; the handler RPUSHes ``now - t``. ``--baseline`` seconds alone
   first, then the same during the redrive.
3. The redrive: ``queue.retry_dead()`` on queue ``dead`` (``--filter kind``:
   ``retry_dead(kind="doomed")``, which reads every job's kind too), from this
   process, reporting its progress. Then checks every job is pending.

Prints the seeding time, the redrive's time and rate, Redis's CPU per
redriven job (``INFO cpu`` over the redrive, and the same less the live
traffic's rate measured over the baseline), and the live jobs' p50 / p99
latency before and during it. The target: 1,000,000 redriven in
60 s or less, with the live p99 no worse than twice the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import redis as redis_sync

import venturi_redis as vr
from venturi_redis._model.ids import new_job_ids
from venturi_redis._producer import bulk

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from dashboard_screenshots import redis_server

LAT = "bench:redrive:lat"  # "<t> <latency>" per live job

# Clones the template job: its hash, its journal's entries (written to a
# scratch stream and COPYed to its name, at its exact size, as journal.lua's
# compact_journal leaves a dead job's), its place in the dead set. ARGV:
# prefix, first score, #fields, fields..., #entries, (#fields, fields...)..., ids...
SEED = """
local prefix = ARGV[1]
local score = tonumber(ARGV[2])
local nf = tonumber(ARGV[3])
local fields = {}
for i = 1, nf do fields[i] = ARGV[3 + i] end
local at = 4 + nf
local entries = {}
for e = 1, tonumber(ARGV[at]) do
  local n = tonumber(ARGV[at + 1])
  local entry = {}
  for i = 1, n do entry[i] = ARGV[at + 1 + i] end
  entries[e] = entry
  at = at + 1 + n
end
local scratch = prefix .. 'seed-scratch'
for i = at + 1, #ARGV do
  local id = ARGV[i]
  redis.call('HSET', prefix .. 'job:' .. id, unpack(fields))
  redis.call('DEL', scratch)
  for _, entry in ipairs(entries) do
    redis.call('XADD', scratch, '*', unpack(entry))
  end
  redis.call('COPY', scratch, prefix .. 'journal:' .. id)
  redis.call('ZADD', prefix .. 'dead', score, id)
  score = score + 1
end
redis.call('DEL', scratch)
return 1
"""


class Doomed(vr.Task):
    KIND: ClassVar[str] = "doomed"


class DoomedJob(Doomed, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise vr.TaskError.permanent("upstream said 410")


class Ping(vr.Task):
    KIND: ClassVar[str] = "ping"
    t: float


_lat_client: Any = None


class PingJob(Ping, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        lat = time.time() - self.t
        await _lat_client.rpush(LAT, f"{self.t} {lat}")
        return vr.Outcome.completed()


# -- the live processes -------------------------------------------------------------------


async def serve(url: str) -> None:
    global _lat_client
    client = vr.Client.from_url(url)
    _lat_client = client.redis
    worker = vr.Worker(client.queue("live"), concurrency=10)
    worker.register(PingJob)
    await worker.run()


async def produce(url: str, rate: float) -> None:
    client = vr.Client.from_url(url)
    q = client.queue("live")
    step = 1.0 / rate
    nxt = time.perf_counter()
    while True:
        nxt += step
        await q.enqueue(Ping(t=time.time()))
        pause = nxt - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)


# -- seeding and the redrive ------------------------------------------------------------------


async def seed(url: str, n: int) -> None:
    client = vr.Client.from_url(url)
    try:
        q = client.queue("dead")
        (template,) = await q.enqueue_many([Doomed()])
        w = vr.Worker(q, handle_signals=False)
        w.register(DoomedJob)
        await w.run(until_idle=True)
        r = client.redis
        fields = await r.hgetall(q.keys.job(template))
        assert fields[b"state"] == b"dead"
        entries = await r.xrange(q.keys.journal(template))
        assert q.keys.job("x") == q.keys.prefix + "job:x"  # as SEED builds them
        assert q.keys.journal("x") == q.keys.prefix + "journal:x"
        flat_fields = [x for kv in fields.items() for x in kv]
        flat_entries: list[Any] = [len(entries)]
        for _, entry in entries:
            flat_entries += [2 * len(entry), *(x for kv in entry.items() for x in kv)]
        ((_, base),) = await r.zrange(q.keys.dead, 0, 0, withscores=True)
        await r.delete(q.keys.dead, q.keys.job(template), q.keys.journal(template))
        sha = await r.script_load(SEED)
        started = time.perf_counter()
        chunk = 2000
        done = 0
        while done < n:
            ids = new_job_ids(min(chunk, n - done))
            await r.evalsha(
                sha, 0, q.keys.prefix, int(base) - n + done, len(flat_fields), *flat_fields,
                *flat_entries, *ids,
            )  # fmt: skip
            done += len(ids)
        took = time.perf_counter() - started
        mem = (await r.info("memory"))["used_memory_human"]
        print(f"seeded {n:,} dead jobs in {took:.1f} s (Redis used_memory {mem})", flush=True)
    finally:
        await client.aclose()


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def redrive(url: str, n: int, by_kind: bool) -> tuple[float, float, float, float]:
    client = vr.Client.from_url(url)
    try:
        q = client.queue("dead")
        last = [0.0]
        start = time.time()

        def show(p: vr.BulkProgress) -> None:
            now = time.time()
            if p.finished or now - last[0] >= 5:
                last[0] = now
                print(f"  {now - start:5.1f} s: {p.done:,} of {p.total:,} moved", flush=True)

        cpu0 = _cpu(await client.redis.info("cpu"))
        t0 = time.time()
        moved = await q.retry_dead(kind="doomed" if by_kind else None, on_progress=show)
        t1 = time.time()
        cpu = _cpu(await client.redis.info("cpu")) - cpu0
        counts = await q.counts()
        assert len(moved) == n, (len(moved), counts)
        assert counts["dead"] == 0, counts
        assert counts["pending"] == n, counts
        return t0, t1, t1 - t0, cpu
    finally:
        await client.aclose()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dead", type=int, default=100_000)
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of live traffic alone first")
    ap.add_argument("--rate", type=float, default=200.0, help="live jobs enqueued per second")
    ap.add_argument("--batch", type=int, default=bulk.BATCH, help="jobs per retry_dead.lua call")
    ap.add_argument("--filter", choices=["none", "kind"], default="none")
    ap.add_argument("--role", choices=["main", "worker", "producer"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "worker":
        asyncio.run(serve(args.url))
        return
    if args.role == "producer":
        asyncio.run(produce(args.url, args.rate))
        return
    bulk.BATCH = args.batch
    with redis_server() as url:
        asyncio.run(seed(url, args.dead))
        me = [sys.executable, __file__, "--url", url, "--rate", str(args.rate)]
        env = {**os.environ}
        worker = subprocess.Popen([*me, "--role", "worker"], env=env)
        time.sleep(2.0)  # the worker reaches its idle wait
        producer = subprocess.Popen([*me, "--role", "producer"], env=env)
        try:
            r = redis_sync.Redis.from_url(url)
            cpu_b, tb = _cpu(r.info("cpu")), time.time()
            time.sleep(args.baseline)
            live_rate = (_cpu(r.info("cpu")) - cpu_b) / (time.time() - tb)  # Redis CPU s/s, live alone
            r.close()
            t0, t1, took, cpu = asyncio.run(redrive(url, args.dead, args.filter == "kind"))
            time.sleep(1.0)
        finally:
            producer.terminate()
            producer.wait(10)
            worker.terminate()
            worker.wait(20)
        r = redis_sync.Redis.from_url(url)
        rows = [tuple(map(float, x.split())) for x in r.lrange(LAT, 0, -1)]
        r.close()
    before = [lat for t, lat in rows if t < t0]
    during = [lat for t, lat in rows if t0 <= t <= t1]
    print(f"redrove {args.dead:,} dead jobs in {took:.1f} s ({args.dead / took:,.0f}/s), batch {args.batch}")
    own = (cpu - live_rate * took) * 1e6 / args.dead
    print(f"Redis CPU: {cpu * 1e6 / args.dead:.1f} µs a redriven job, {own:.1f} µs less the live traffic's")
    for name, lat in (("live before", before), ("live during", during)):
        if lat:
            print(
                f"{name}: {len(lat):5} jobs  p50 {statistics.median(lat) * 1000:6.2f} ms  "
                f"p99 {pct(lat, 99):6.2f} ms  max {max(lat) * 1000:6.2f} ms"
            )
    if before and during:
        print(f"p99 during / before: {pct(during, 99) / pct(before, 99):.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
