"""Many queues (a queue per tenant): a producer, a worker and the operator's views, measured.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/many_queues.py                 # everything (~20 min)
    PYTHONPATH=$PWD .venv/bin/python benchmarks/many_queues.py --only producer --names 100000
    PYTHONPATH=$PWD .venv/bin/python benchmarks/many_queues.py --only worker --queues 200,1000 --idle 30
    PYTHONPATH=$PWD .venv/bin/python benchmarks/many_queues.py --only views --view-queues 5000
    PYTHONPATH=$PWD .venv/bin/python benchmarks/many_queues.py --root /tmp/base   # another checkout

Starts its own redis-server (tests/servers.py, on a free port) and runs every
measured part in a child process that imports ``venturi_redis`` from
``--root`` (default: this checkout), so an A/B against a base checkout
(``git -C /work/main archive main | tar -x -C /tmp/base``) is two runs.
Prints one table per part:

- **producer**: one long-lived ``vr.Client`` (then ``vr.SyncClient``)
  enqueues one job to each of ``--names`` distinct queue names. The child's
  RSS (``/proc/self/status``) at 5,000 names, half way and at the end, the
  growth per 1,000 names over the second half, what the client keeps (queues, names in
  the registry's memo) and the time of an enqueue: to one queue, to a new
  name each time, and round-robin over 2,000 names (past the 1,024 queues a
  client keeps).
- **worker**: for each count in ``--queues`` (and each ``--poll``), one worker
  process (``concurrency=16``, ``poll_interval`` from ``--poll``, the defaults
  otherwise) on that many queues, one job
  already enqueued on its last queue. Start-up: from the spawn to that job
  run, and to the worker registered on every queue. Then ``--idle`` seconds
  of idleness: Redis's commands a second (``INFO commandstats``, the
  commands scripts run included, as W7 counts them), the connections
  (``connected_clients``), the worker's RSS and asyncio tasks (its own
  report), RSS per queue against a worker on one queue. Pickup: 20 jobs,
  one at a time, each on another queue, from the enqueue to its handler's
  start (one clock: both processes on this host). Fairness: 2,000 jobs of
  20 ms on one queue, then one job on each of 50 other queues: their pickup
  while the flood runs, and the flood's jobs done by then.
- **views**: ``--view-queues`` queues with one pending job each; then, each
  timed and counted (Redis's commands, and the bytes of the answer):
  ``venturi stats --json`` and ``venturi workers --json`` (the CLI, a
  process each), the dashboard's overview as JSON (``GET /api/queues``) and
  as HTML (``GET /``), the first request and the next (what it keeps), and
  the scale route of one queue, through the ASGI app (httpx).

Timings are wall clock on a shared machine: read them as orders of
magnitude. Counts (commands, connections, tasks, objects kept) do not
depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RedisServer  # noqa: E402

TASKS = """
import asyncio, json, os, sys, time, random
from typing import ClassVar
import venturi_redis as vr

class Ping(vr.Task):
    KIND: ClassVar[str] = "ping"
    sent: float = 0.0
    sleep: float = 0.0

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0
"""

PRODUCER = (
    TASKS
    + """
async def run_async(url, names):
    out = {}
    async with vr.Client.from_url(url) as c:
        q = c.queue("one")
        for _ in range(200):
            await q.enqueue(Ping())
        t = time.perf_counter()
        for _ in range(1000):
            await q.enqueue(Ping())
        out["one_us"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        for i in range(names):
            await c.queue(f"tenant-{i}").enqueue(Ping())
            if i == CHECK - 1:
                out["rss_check"] = rss_mib()
            if i == names // 2 - 1:
                out["rss_half"] = rss_mib()
        out["new_us"] = (time.perf_counter() - t) / names * 1e6
        out["rss_end"] = rss_mib()
        out["kept_queues"] = len(c._queues)
        recorded = c._recorded
        out["memo"] = len(getattr(recorded, "_until", {}))
        t = time.perf_counter()
        for i in range(4000):
            await c.queue(f"rr-{i % 2000}").enqueue(Ping())
        out["rr_us"] = (time.perf_counter() - t) / 4000 * 1e6
    return out

def run_sync(url, names):
    out = {}
    with vr.SyncClient(url) as sc:
        q = sc.queue("one")
        for _ in range(200):
            q.enqueue(Ping())
        t = time.perf_counter()
        for _ in range(1000):
            q.enqueue(Ping())
        out["one_us"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        for i in range(names):
            sc.queue(f"tenant-{i}").enqueue(Ping())
            if i == CHECK - 1:
                out["rss_check"] = rss_mib()
            if i == names // 2 - 1:
                out["rss_half"] = rss_mib()
        out["new_us"] = (time.perf_counter() - t) / names * 1e6
        out["rss_end"] = rss_mib()
        out["kept_queues"] = len(sc._queues) + len(sc.client._queues)
        out["memo"] = len(getattr(sc.client._recorded, "_until", {}))
        t = time.perf_counter()
        for i in range(4000):
            sc.queue(f"rr-{i % 2000}").enqueue(Ping())
        out["rr_us"] = (time.perf_counter() - t) / 4000 * 1e6
    return out

url, kind, names = sys.argv[1], sys.argv[2], int(sys.argv[3])
CHECK = min(5000, names // 2)  # past the queues a client keeps
out = asyncio.run(run_async(url, names)) if kind == "async" else run_sync(url, names)
print(json.dumps(out), flush=True)
"""
)

WORKER = (
    TASKS
    + """
import redis.asyncio as aioredis

class PingJob(Ping, vr.Handler[None]):
    async def handle(self, ctx, state):
        started = time.time()
        if self.sleep:
            await asyncio.sleep(self.sleep)
        await STAMPS.rpush("bench:picked", json.dumps(["", started - self.sent, self.sleep]))
        return vr.Outcome.completed()

async def report(url):
    r = aioredis.Redis.from_url(url)
    while True:
        await r.set("bench:worker", json.dumps({"rss": rss_mib(), "tasks": len(asyncio.all_tasks())}))
        await asyncio.sleep(1)

async def main(url, n, concurrency, poll):
    global STAMPS
    STAMPS = aioredis.Redis.from_url(url)
    client = vr.Client.from_url(url)
    names = [f"t{i}" for i in range(n)]
    queues = [client.queue(q) for q in names]
    worker = vr.Worker(queues, concurrency=concurrency, poll_interval=poll).register(PingJob)
    asyncio.get_running_loop().create_task(report(url))
    await worker.run()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
"""
)


CLI = "from venturi_redis.cli import main; main()"


def child_env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


def commands(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    for k in ("info", "config|resetstat", "flushall"):
        out.pop(k, None)
    return {k: v for k, v in out.items() if v}


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        line = [c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))]
        print("  " + "  ".join(line))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


# -- producer ---------------------------------------------------------------------------------


def producer(server: RedisServer, root: Path, names: int) -> None:
    rows = []
    for kind in ("async", "sync"):
        redis.Redis(port=server.port).flushall()
        got = subprocess.run(
            [sys.executable, "-c", PRODUCER, server.url, kind, str(names)],
            env=child_env(root),
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
        d = json.loads(got.stdout.strip().splitlines()[-1])
        per_k = (d["rss_end"] - d["rss_half"]) / max(1, (names - names // 2) / 1000)
        rows.append(
            [
                "vr.Client" if kind == "async" else "vr.SyncClient",
                f"{d['rss_check']:.1f}",
                f"{d['rss_half']:.1f}",
                f"{d['rss_end']:.1f}",
                f"{per_k * 1024:.1f} KiB",
                d["kept_queues"],
                d["memo"],
                f"{d['one_us']:.0f}",
                f"{d['new_us']:.0f}",
                f"{d['rr_us']:.0f}",
            ]
        )
    table(
        f"producer: one job to each of {names:,} queue names (root {root})",
        [
            "client",
            f"RSS at {min(5000, names // 2):,} names MiB",
            f"at {names // 2:,} MiB",
            f"at {names:,} MiB",
            "growth per 1k names, 2nd half",
            "queues kept",
            "names in memo",
            "enqueue, one queue µs",
            "new name µs",
            "2,000 names round-robin µs",
        ],
        rows,
    )


# -- worker -----------------------------------------------------------------------------------


def _stamps(r: redis.Redis, n: int, timeout: float = 30.0) -> list[list[Any]]:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        got = r.blpop(["bench:picked"], 1)
        if got:
            out.append(json.loads(got[1]))
    return out


def _enqueue(url: str, root: Path, jobs: list[tuple[str, float]]) -> None:
    """Enqueue (queue, sleep) jobs from a child, each stamped with its send time."""
    code = TASKS + textwrap.dedent(
        """
        async def main(url, jobs, spaced):
            async with vr.Client.from_url(url) as c:
                await c.queue("warm").enqueue(Ping())  # connected before the first stamp
                for q, sleep in jobs:
                    await c.queue(q).enqueue(Ping(sent=time.time(), sleep=sleep))
                    if spaced:
                        await asyncio.sleep(spaced)
        asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])))
        """
    )
    spaced = 0.2 if len(jobs) <= 20 else 0.0
    subprocess.run(
        [sys.executable, "-c", code, url, json.dumps(jobs), str(spaced)],
        env=child_env(root),
        cwd=root,
        check=True,
    )


def _p50_max(values: list[float], fmt: str) -> str:
    """``p50 / max`` of sorted ``values`` ("-" for none)."""
    if not values:
        return "-"
    return f"{fmt.format(values[len(values) // 2])} / {fmt.format(values[-1])}"


def worker(server: RedisServer, root: Path, counts: list[int], idle: float, poll: float) -> None:
    rows = []
    base_rss = None
    for n in [1, *counts]:
        r = redis.Redis(port=server.port)
        r.flushall()
        # One job waiting on the last queue before the worker starts (its start-up's end).
        _enqueue(server.url, root, [(f"t{n - 1}", 0.0)])
        r.delete("bench:picked")
        log = Path(f"/tmp/many_queues_worker_{n}.log")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url, str(n), "16", str(poll)],
            env=child_env(root),
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        try:
            first = _stamps(r, 1, timeout=120)
            started = time.monotonic() - t0 if first else float("nan")
            while True:
                pipe = r.pipeline(transaction=False)
                for i in range(n):
                    pipe.exists(f"venturi:{{t{i}}}:workers")
                if all(pipe.execute()) or time.monotonic() - t0 > 120:
                    break
                time.sleep(0.05)
            registered = time.monotonic() - t0
            time.sleep(5)  # the first reclaim sweep, schedule rounds and claims are behind it
            before = commands(r)
            time.sleep(idle)
            spent = delta(before, commands(r))
            conns = int(r.info("clients")["connected_clients"]) - 2  # ours: this and the reporter's
            report = json.loads(r.get("bench:worker") or b"{}")
            rss = float(report.get("rss", 0.0))
            if n == 1:
                base_rss = rss
                continue
            # Pickup: one job at a time on queues spread over the worker's.
            _enqueue(server.url, root, [(f"t{(k * 7919) % n}", 0.0) for k in range(20)])
            picks = sorted(1000 * p[1] for p in _stamps(r, 20))
            # Fairness: a flood on t0, then one job on each of 50 other queues.
            flood = [("t0", 0.02)] * 2000
            others = [(f"t{1 + (k * 31) % (n - 1)}", 0.0) for k in range(50)]
            _enqueue(server.url, root, flood + others)
            got = _stamps(r, 2050, timeout=300)
            order = [p[2] == 0.0 for p in got]
            last_other = max((i for i, other in enumerate(order) if other), default=-1)
            flood_before = sum(1 for p in got[:last_other] if p[2] > 0)
            other_waits = sorted(1000 * p[1] for p in got if p[2] == 0.0)
            cmds = sum(spent.values())
            busiest = sorted(spent.items(), key=lambda kv: -kv[1])[:6]
            top = ", ".join(f"{k} {v / idle:.0f}" for k, v in busiest)
            rows.append(
                [
                    n,
                    f"{started:.1f}",
                    f"{registered:.1f}",
                    f"{cmds / idle:.0f}",
                    top,
                    conns,
                    f"{rss:.0f}",
                    f"{(rss - (base_rss or rss)) * 1024 / n:.0f}",
                    report.get("tasks", "?"),
                    _p50_max(picks, "{:.1f}"),
                    _p50_max(other_waits, "{:.0f}"),
                    f"{flood_before} of 2000",
                    sum(1 for line in log.read_text().splitlines() if "failed" in line),
                ]
            )
        finally:
            proc.terminate()
            proc.wait(60)
    table(
        f"worker: concurrency 16, poll_interval {poll:g} s, idle {idle:.0f} s (root {root}; "
        f"a worker on 1 queue: {base_rss:.0f} MiB)",
        [
            "queues",
            "start s",
            "registered s",
            "idle cmds/s",
            "of which /s",
            "connections",
            "RSS MiB",
            "KiB/queue",
            "tasks",
            "pickup p50/max ms",
            "50 others in a flood p50/max ms",
            "flood jobs run before the last other",
            "'failed' log lines",
        ],
        rows,
    )


# -- the operator's views ----------------------------------------------------------------------


def views(server: RedisServer, root: Path, count: int) -> None:
    r = redis.Redis(port=server.port)
    r.flushall()
    code = TASKS + textwrap.dedent(
        """
        async def main(url, n):
            async with vr.Client.from_url(url) as c:
                sem = asyncio.Semaphore(50)
                async def one(i):
                    async with sem:
                        await c.queue(f"tenant-{i:05d}").enqueue(Ping())
                await asyncio.gather(*(one(i) for i in range(n)))
        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
        """
    )
    env = child_env(root)
    subprocess.run([sys.executable, "-c", code, server.url, str(count)], env=env, cwd=root, check=True)
    rows = []
    for args in (["stats", "--json"], ["workers", "--json"], ["stats"]):
        before = commands(r)
        t = time.perf_counter()
        got = subprocess.run(
            [sys.executable, "-c", CLI, *args, "--redis", server.url],
            env=env,
            cwd=root,
            capture_output=True,
        )
        took = time.perf_counter() - t
        spent = sum(delta(before, commands(r)).values())
        label = f"venturi {' '.join(args)}"
        rows.append([label, f"{took:.2f}", spent, f"{len(got.stdout):,}", got.returncode])
    code = textwrap.dedent(
        """
        import asyncio, json, sys, time
        import httpx, redis
        import venturi_redis as vr
        from venturi_redis.dashboard import create_app

        def commands(r):
            return sum(int(v["calls"]) for k, v in r.info("commandstats").items() if k != "cmdstat_info")

        async def main(url, port):
            r = redis.Redis(port=port)
            client = vr.Client.from_url(url)
            app = create_app(client, read_only=True)
            out = []
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as h:
                    scale = "/api/queues/tenant-00000/scale"
                    for label, path in (("GET /api/queues", "/api/queues"), ("  again", "/api/queues"),
                                        ("GET / (HTML)", "/"), ("  again", "/"), (f"GET {scale}", scale)):
                        before = commands(r)
                        t = time.perf_counter()
                        resp = await h.get(path, timeout=600)
                        took = time.perf_counter() - t
                        spent = commands(r) - before
                        out.append([label, round(took, 2), spent, len(resp.content), resp.status_code])
            await client.aclose()
            print(json.dumps(out))

        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
        """
    )
    got = subprocess.run(
        [sys.executable, "-c", code, server.url, str(server.port)],
        env=child_env(root),
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    for label, took, spent, size, status in json.loads(got.stdout.strip().splitlines()[-1]):
        rows.append([label, f"{took:.2f}", spent, f"{size:,}", status])
    table(
        f"operator's views of {count:,} queues, one pending job each (root {root})",
        ["view", "seconds", "Redis commands", "bytes out", "exit / status"],
        rows,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["producer", "worker", "views"], action="append")
    p.add_argument("--names", type=int, default=100_000, help="distinct queue names the producer writes to")
    p.add_argument("--queues", default="200,1000", help="queue counts of the worker runs")
    p.add_argument("--idle", type=float, default=30.0, help="seconds of idleness counted")
    p.add_argument("--poll", default="5", help="the workers' poll_interval, or several: 5,30")
    p.add_argument("--view-queues", type=int, default=5_000)
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose venturi_redis is measured")
    cfg = p.parse_args()
    parts = cfg.only or ["producer", "worker", "views"]
    with RedisServer("--maxclients", "20000") as server:
        if "producer" in parts:
            producer(server, cfg.root, cfg.names)
        if "worker" in parts:
            for poll in cfg.poll.split(","):
                worker(server, cfg.root, [int(n) for n in cfg.queues.split(",")], cfg.idle, float(poll))
        if "views" in parts:
            views(server, cfg.root, cfg.view_queues)


if __name__ == "__main__":
    main()
