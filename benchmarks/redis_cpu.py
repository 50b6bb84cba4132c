"""Redis's own CPU per job: the storage shape's floor, venturi and its peers, in one sitting.

Usage (from the repository root)::

    .venv/bin/python benchmarks/redis_cpu.py                       # floor + venturi (events off and on)
    .venv/bin/python benchmarks/redis_cpu.py --peers taskiq,bullmq # and those peers (their own venvs)
    .venv/bin/python benchmarks/redis_cpu.py --base /tmp/base      # and another checkout of venturi
    .venv/bin/python benchmarks/redis_cpu.py --n 10000 --runs 3 --write-readme

Why this figure: our users scale worker pods against one Redis primary, and
Redis runs every command and script on one thread. Past a few pods, the Redis
CPU spent per job is what decides how many jobs a second the whole fleet can
do, whatever the number of pods: ``1e6 / µs per job`` is the most one primary
can serve (the table's last column).

How: one ``redis-server`` of our own (no persistence); before and after each
phase, ``INFO cpu`` (``used_cpu_user + used_cpu_sys`` of the server process:
everything Redis did, parsing and networking included), divided by the jobs
of the phase. Phases, each from an empty database (FLUSHALL):

- ``single``: ``n`` single enqueues, one after another (the adapter's W1 single);
- ``bulk``: ``n`` jobs by the library's bulk API, 1,000 per call (where it has one);
- ``drain``: ``n`` jobs filled first (untimed), then one worker process at
  concurrency 100 until every job ran; each job's handler makes one ``INCR``
  on Redis (the same for every library, ``peers/_common.py``);
- ``lifecycle``: ``bulk`` (or ``single`` without one) + ``drain``: what one
  job costs Redis from enqueue to completion.

The **floor** is the storage shape itself and nothing else, as three minimal
Lua scripts driven by bare redis-py (``FLOOR_*`` below): a hash per job, a
pending sorted set scored by eligibility, a running set scored by the lease's
expiry with a lease token checked at completion (fencing), a completed index,
and one ``XADD`` per job to its own journal stream. Its drain is the worker's
shape: claim 100, the handlers' ``INCR``s (each its own request on its own
connection, concurrently, as 100 handlers send them: a floor that pipelined
them would charge every library a round trip per job that it does not pay),
then the completions of those 100 and the next claim in one round trip.

Every subject runs each phase ``--runs`` times, in rounds (every subject's
run 1, then every subject's run 2...), and the median is shown: the
machine's speed drifts within minutes, and rounds spread that drift over every
subject. ``--base DIR`` adds another checkout's venturi (its own ``.venv``,
``make install`` there first) as ``venturi@base``: before/after in one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import redis
import redis.asyncio as aioredis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import run as R  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

PHASES = ("single", "bulk", "drain", "lifecycle")

# -- the floor: the shape as three minimal scripts ------------------------------------

FLOOR_ENQUEUE = """
local now = redis.call('TIME')
now = now[1] * 1000 + math.floor(now[2] / 1000)
local prefix, n = ARGV[1], tonumber(ARGV[2])
local members = {}
for i = 0, n - 1 do
  local id, payload = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  redis.call('HSET', prefix .. 'job:' .. id, 'kind', 'noop', 'state', 'pending', 'priority', 'normal',
    'eligible_at', now, 'created_at', now, 'payload', payload)
  members[#members + 1] = now
  members[#members + 1] = id
end
redis.call('ZADD', KEYS[1], unpack(members))
return n
"""

FLOOR_CLAIM = """
local now = redis.call('TIME')
now = now[1] * 1000 + math.floor(now[2] / 1000)
local prefix, count, worker = ARGV[1], ARGV[2], ARGV[3]
local ids = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, count)
if #ids == 0 then return {} end
redis.call('ZREM', KEYS[1], unpack(ids))
local out, running = {}, {}
local expires = now + 30000
for i, id in ipairs(ids) do
  local key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', key, 'kind', 'payload', 'run_count')
  local token = worker .. '.' .. i
  local run = (tonumber(f[3]) or 0) + 1
  redis.call('HSET', key, 'state', 'running', 'run_count', run, 'lease_owner', worker,
    'lease_token', token, 'lease_expires', expires)
  running[#running + 1] = expires
  running[#running + 1] = id
  out[#out + 1] = id
  out[#out + 1] = f[1]
  out[#out + 1] = f[2]
  out[#out + 1] = token
end
redis.call('ZADD', KEYS[2], unpack(running))
return out
"""

FLOOR_COMPLETE = """
local now = redis.call('TIME')
now = now[1] * 1000 + math.floor(now[2] / 1000)
local prefix, n = ARGV[1], tonumber(ARGV[2])
local done, members, out = {}, {}, {}
for i = 0, n - 1 do
  local id, token = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'lease_token', 'run_count')
  if f[1] == 'running' and f[2] == token then
    redis.call('HSET', key, 'state', 'completed', 'finished_at', now)
    redis.call('HDEL', key, 'lease_token', 'lease_expires')
    redis.call('XADD', prefix .. 'journal:' .. id, '*', 'event', 'completed', 'at', now, 'run', f[3])
    done[#done + 1] = id
    members[#members + 1] = now
    members[#members + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #done > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('ZADD', KEYS[2], unpack(members))
end
return out
"""


class Floor:
    """The floor's three scripts, driven by bare redis.asyncio (hiredis)."""

    PREFIX = "floor:{q}:"

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys = [f"{self.PREFIX}{name}" for name in ("pending", "running", "completed")]
        self.payload = msgpack.packb({"i": 0, "t": 0.0})

    async def _open(self) -> tuple[Any, dict[str, str]]:
        r = aioredis.Redis.from_url(self.url)
        shas = {
            name: await r.script_load(src)
            for name, src in (
                ("enqueue", FLOOR_ENQUEUE),
                ("claim", FLOOR_CLAIM),
                ("complete", FLOOR_COMPLETE),
            )
        }
        return r, shas

    def _jobs(self, start: int, count: int) -> list[Any]:
        args: list[Any] = []
        for i in range(start, start + count):
            args += [f"{i:026d}", self.payload]
        return args

    async def enqueue(self, n: int, per_call: int) -> None:
        r, shas = await self._open()
        try:
            for start in range(0, n, per_call):
                count = min(per_call, n - start)
                await r.evalsha(
                    shas["enqueue"], 1, self.keys[0], self.PREFIX, count, *self._jobs(start, count)
                )
        finally:
            await r.aclose()

    async def drain(self, n: int, batch: int = 100) -> int:
        """The worker's shape: claim, the handlers' INCRs, then complete + next claim per round trip."""
        r, shas = await self._open()
        # The handlers' own client, as in every adapter: one connection per concurrent
        # handler, each INCR its own request (a worker's handlers do not pipeline).
        handler = aioredis.Redis.from_url(self.url, max_connections=batch)
        claim_keys = (2, self.keys[0], self.keys[1], self.PREFIX, batch, "w")
        done = 0
        try:
            reply = await r.evalsha(shas["claim"], *claim_keys)
            while reply:
                jobs = [(reply[i], reply[i + 3]) for i in range(0, len(reply), 4)]
                await asyncio.gather(*(handler.incr(R.COUNT) for _ in jobs))
                args: list[Any] = []
                for job_id, token in jobs:
                    args += [job_id, token]
                pipe = r.pipeline(transaction=False)
                pipe.evalsha(shas["claim"], *claim_keys)
                pipe.evalsha(shas["complete"], 2, self.keys[1], self.keys[2], self.PREFIX, len(jobs), *args)
                reply, _ = await pipe.execute()
                done += len(jobs)
        finally:
            await r.aclose()
            await handler.aclose()
        return done


# -- measuring --------------------------------------------------------------------------


def cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def per_job_us(r: redis.Redis, n: int, work: Callable[[], object]) -> float:
    before = cpu(r)
    work()
    return (cpu(r) - before) / n * 1e6


class Subject:
    """One thing measured: ``phase(name)`` returns Redis µs per job, or None when it has no such API."""

    name: str

    def phase(self, name: str, r: redis.Redis, n: int, bulk: int) -> float | None:
        raise NotImplementedError


class FloorSubject(Subject):
    name = "floor"

    def __init__(self, url: str) -> None:
        self.floor = Floor(url)

    def phase(self, name: str, r: redis.Redis, n: int, bulk: int) -> float | None:
        f = self.floor
        if name == "single":
            return per_job_us(r, n, lambda: asyncio.run(f.enqueue(n, 1)))
        if name == "bulk":
            return per_job_us(r, n, lambda: asyncio.run(f.enqueue(n, bulk)))
        asyncio.run(f.enqueue(n, bulk))
        done: list[int] = []
        us = per_job_us(r, n, lambda: done.append(asyncio.run(f.drain(n))))
        if done != [n]:
            raise RuntimeError(f"floor drained {done} of {n}")
        return us


class AdapterSubject(Subject):
    """A library through its benchmark adapter (``peers/<lib>_bench.py``), in its own venv."""

    def __init__(
        self,
        lib: R.Lib,
        url: str,
        timeout: float,
        before_each: Callable[[], None] | None = None,
        *,
        label: str = "",
        root: Path | None = None,
    ) -> None:
        self.lib = lib
        self.name = label or lib.name
        self.adapter_root = root
        self.url = url
        self.timeout = timeout
        self.before_each = before_each

    def phase(self, name: str, r: redis.Redis, n: int, bulk: int) -> float | None:
        if self.before_each is not None:
            self.before_each()
        if name in ("single", "bulk"):
            before = cpu(r)
            res = R.run_adapter(self.lib, "enqueue", self.url, self.timeout, n=n, mode=name, bulk_size=bulk)
            if "unsupported" in res:
                return None
            return (cpu(r) - before) / n * 1e6
        R.run_adapter(self.lib, "fill", self.url, self.timeout, n=n, bulk_size=bulk)
        log = f"redis-cpu-{self.name.replace(' ', '-')}.log"
        w = R.Worker(self.lib, self.url, log, n=n, concurrency=100)
        try:
            R.wait_key(r, R.START, 60, w)
            before = cpu(r)  # after the worker's start-up: the drain alone
            R.wait_key(r, R.END, self.timeout, w)
            return (cpu(r) - before) / n * 1e6
        finally:
            w.stop()


def set_events(python: Path, url: str, on: bool) -> Callable[[], None]:
    """A step run before each venturi phase: the bench queue's event stream switched on or off."""
    code = (
        "import asyncio, sys, venturi_redis as vr\n"
        "async def main():\n"
        "    async with vr.Client.from_url(sys.argv[1]) as c:\n"
        "        await c.queue('bench').set_events(sys.argv[2] == 'on')\n"
        "asyncio.run(main())\n"
    )

    def step() -> None:
        subprocess.run([str(python), "-c", code, url, "on" if on else "off"], check=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bulk-size", type=int, default=1000)
    ap.add_argument("--peers", default="", help="comma-separated peers (taskiq, bullmq, saq, ...)")
    ap.add_argument(
        "--base", type=Path, help="another checkout of venturi (with its .venv) to measure beside"
    )
    ap.add_argument("--no-events", action="store_true", help="skip venturi's events-on rows")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", type=Path, help="write the medians and every run here")
    a = ap.parse_args()

    with RedisServer() as server:
        url = server.url
        r = redis.Redis.from_url(url)
        subjects: list[Subject] = [FloorSubject(url)]
        checkouts = [("venturi", R.ROOT)] + ([("venturi@base", a.base.resolve())] if a.base else [])
        for label, root in checkouts:
            python = root / ".venv" / "bin" / "python"
            for events in (False,) if a.no_events else (False, True):
                lib = R.Lib("venturi", [], "venturi-redis", True, python=python)
                name = label + (" events on" if events else "")
                subjects.append(
                    AdapterSubject(
                        lib, url, a.timeout, set_events(python, url, events), label=name, root=root
                    )
                )
        for peer in filter(None, a.peers.split(",")):
            lib = R.LIBS[peer]
            err = R.setup_lib(lib)
            if err:
                raise SystemExit(f"{peer}: {err}")
            subjects.append(AdapterSubject(lib, url, a.timeout))

        runs: dict[str, dict[str, list[float]]] = {s.name: {p: [] for p in PHASES} for s in subjects}
        for run in range(a.runs):
            order = subjects if run % 2 == 0 else list(reversed(subjects))
            for s in order:
                with _adapter_root(s):
                    got: dict[str, float | None] = {}
                    for phase in ("single", "bulk", "drain"):
                        r.flushall()
                        got[phase] = s.phase(phase, r, a.n, a.bulk_size)
                    enq = got["bulk"] if got["bulk"] is not None else got["single"]
                    drain = got["drain"]
                    if enq is None or drain is None:
                        raise RuntimeError(f"{s.name}: no enqueue or drain figure")
                    got["lifecycle"] = enq + drain
                    for phase, value in got.items():
                        if value is not None:
                            runs[s.name][phase].append(value)
                    R.log(
                        f"run {run + 1} {s.name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items() if v)
                    )
        medians = {
            name: {p: statistics.median(v) if v else None for p, v in phases.items()}
            for name, phases in runs.items()
        }
        print(table(medians, a, server_version(r)))
        if a.json:
            a.json.write_text(json.dumps({"medians": medians, "runs": runs}, indent=1))


class _adapter_root:
    """Run a subject's adapter from its own checkout (``--base``)."""

    def __init__(self, s: Subject) -> None:
        self.root = getattr(s, "adapter_root", None)
        self.saved = R.PEERS_DIR

    def __enter__(self) -> None:
        if self.root is not None:
            R.PEERS_DIR = self.root / "benchmarks" / "peers"

    def __exit__(self, *exc: object) -> None:
        R.PEERS_DIR = self.saved


def server_version(r: redis.Redis) -> str:
    return str(r.info("server")["redis_version"])


def table(medians: dict[str, dict[str, float | None]], a: argparse.Namespace, version: str) -> str:
    floor = medians["floor"]
    head = (
        "| Redis CPU per job (µs) | single enqueue | bulk enqueue | drain (c=100, + handler INCR) "
        "| lifecycle | lifecycle / floor | jobs/s one primary could serve |"
    )
    lines = [
        f"{a.n:,} jobs, median of {a.runs} runs, Redis {version}; "
        "`INFO cpu` user + sys of the server per job.",
        "",
        head,
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in medians.items():
        cells = [
            f"{m[p]:.1f}" if m[p] is not None else "n/a" for p in ("single", "bulk", "drain", "lifecycle")
        ]
        life = m["lifecycle"]
        ratio = f"{life / floor['lifecycle']:.2f}x" if life and floor["lifecycle"] else "-"
        rate = f"{1e6 / life:,.0f}" if life else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} | {rate} |")
    single = medians.get("venturi", {}).get("single")
    if single and floor["single"]:
        lines.append("")
        lines.append(f"venturi single enqueue / the floor's single enqueue: {single / floor['single']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    R.log(f"done in {time.monotonic() - t0:.0f} s")
