"""Where W3's pickup latency goes, stage by stage (issue 42's W3 target).

Usage (from the repository root; starts its own redis-server)::

    .venv/bin/python benchmarks/w3_trace.py [ROOT ...] [--runs 3] [--n 1000] [--rate 200]

For each checkout ROOT (default: this one; a copy made with ``git archive``),
in rounds alternating between them, it runs W3 as ``run.py`` does (a worker
process at concurrency 10 idles for 1 s, then a producer process enqueues
``n`` jobs at ``rate``/s, each carrying ``time.time()`` taken just before
its ``enqueue``; the handler is the benchmark's: an ``RPUSH`` of the latency
and an ``INCR``), and stamps each job at every stage, on the one wall clock
both processes share:

- ``sent``: the producer wrote its ``EVALSHA`` to the socket;
- ``enq``: the producer's ``enqueue`` returned (its reply is in);
- ``tok``: the worker read the reply of the idle ``BLPOP`` that woke it;
- ``clm``: it read the claim's reply (pipelined behind the ``BLPOP``);
- ``job``: the claim's reply was parsed into jobs;
- ``run``: the handler started (what W3 measures, from ``t``).

It prints the percentiles of each stage's share, the slowest jobs stage by
stage, the garbage collections each process ran during the run (their
durations, and the jobs whose path overlapped one), the scripts the worker
expanded and when, the p99 without the first 10 jobs (a start-up the
producer's pacing turns into a burst), the jobs a claim took while the
worker was behind (not an idle claim: no ``tok``/``clm`` for them), the
commands Redis itself took 0.5 ms or more to run (``SLOWLOG``), and the
worker's idle claims per job. ``--quiet`` prints each run's p50 and p99 only. With
``W3_GC_CENSUS=1`` each worker collection also lists the types it found in
the generation collected; with ``W3_GC_SAVEALL=1`` (``gc.DEBUG_SAVEALL``),
the types and the frames of the garbage it freed: what made it. With
``W3_WORKER_WRAP="valgrind --tool=callgrind ..."`` the worker runs under that
command (its instructions per job: two runs of different ``--n``). The stamps
are taken by wrapping the checkout's internals (``unpooled_connection``,
``jobs_of``, ``ScriptSet.__getitem__``, the producer's socket writes): a
diagnostic, not an API.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent


def _gc_hook(out: list[tuple[str, int, float]], census: list[Any] | None = None) -> None:
    def hook(phase: str, info: dict[str, Any]) -> None:
        if census is not None and phase == "start" and os.environ.get("W3_GC_CENSUS"):
            objs = gc.get_objects(info["generation"])
            census.append((len(objs), Counter(type(o).__name__ for o in objs).most_common(12)))
            del objs
        if census is not None and phase == "stop" and os.environ.get("W3_GC_SAVEALL") and gc.garbage:
            frames = Counter(
                f"{o.f_code.co_filename.rsplit('/', 2)[-1]}:{o.f_code.co_name}"
                for o in gc.garbage
                if type(o).__name__ == "frame"
            )
            kinds = Counter(type(o).__name__ for o in gc.garbage)
            census.append((len(gc.garbage), kinds.most_common(10), frames.most_common(25)))
            gc.garbage.clear()
        out.append((phase, info["generation"], time.time()))

    gc.callbacks.append(hook)


async def worker(a: argparse.Namespace) -> None:
    sys.path.insert(0, a.root)
    import venturi_redis as vr
    from venturi_redis._worker import runner as runner_module

    gcs: list[tuple[str, int, float]] = []
    stamps: dict[str, dict[str, float]] = {}  # job id -> stage -> time
    reads: list[float] = []  # every read on the idle connection
    arms: list[float] = []
    handled: list[tuple[str, int, float, float]] = []  # id, i, t, run
    sent: list[int] = [0]

    make = runner_module.unpooled_connection

    def unpooled(pool: Any, **kw: Any) -> Any:
        conn = make(pool, **kw)
        read, send = conn.read_response, conn.send_packed_command

        async def read_response(*args: Any, **kwargs: Any) -> Any:
            reply = await read(*args, **kwargs)
            reads.append(time.time())
            return reply

        async def send_packed(*args: Any, **kwargs: Any) -> Any:
            arms.append(time.time())
            return await send(*args, **kwargs)

        conn.read_response, conn.send_packed_command = read_response, send_packed
        return conn

    runner_module.unpooled_connection = unpooled
    jobs_of = runner_module.jobs_of

    stamped_reads = [0]  # how many reads the last idle claim's jobs were stamped with

    def traced_jobs_of(queue: Any, claimed: Any) -> Any:
        jobs = jobs_of(queue, claimed)
        now = time.time()
        # An idle claim's reply was just read on the idle connection; a claim
        # sent while the worker was busy (behind) came through the pool.
        idle = len(reads) >= 2 and len(reads) != stamped_reads[0]
        stamped_reads[0] = len(reads)
        for j in jobs:
            s = stamps[j.id] = {"job": now}
            if idle:
                s["tok"], s["clm"] = reads[-2], reads[-1]
                s["arm"] = arms[-1] if arms else 0.0
        return jobs

    runner_module.jobs_of = traced_jobs_of
    from venturi_redis._store import scripts as scripts_module

    expansions: list[tuple[str, float, float]] = []
    getitem = scripts_module.ScriptSet.__getitem__

    def timed_getitem(self: Any, name: str) -> Any:
        if name in self._scripts:
            return self._scripts[name]
        t0 = time.perf_counter()
        script = getitem(self, name)
        expansions.append((name, (time.perf_counter() - t0) * 1000, time.time()))
        return script

    scripts_module.ScriptSet.__getitem__ = timed_getitem  # type: ignore[method-assign]

    sys.path.insert(0, str(HERE / "peers"))
    import _common

    rec = _common.AsyncRecorder(a.url, a.n)

    class Noop(vr.Task):
        KIND: ClassVar[str] = "noop"
        i: int = 0
        t: float = 0.0

    done = asyncio.Event()

    class NoopJob(Noop, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            now = time.time()
            handled.append((ctx.job_id, self.i, self.t, now))
            await rec.hit(self.t)
            if len(handled) == a.n:
                done.set()
            return vr.Outcome.completed()

    client = vr.Client.from_url(a.url)
    # Every command the worker's client sends (its pool; the idle connection is counted in arms).
    pool_send = client.redis.connection_pool.connection_class.send_packed_command

    async def counting_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return await pool_send(self, *args, **kwargs)

    client.redis.connection_pool.connection_class.send_packed_command = counting_send
    q = client.queue("bench")
    w = vr.Worker(q, concurrency=a.concurrency)
    w.register(NoopJob)
    census: list[Any] = []
    _gc_hook(gcs, census)
    if os.environ.get("W3_GC_SAVEALL"):
        gc.set_debug(gc.DEBUG_SAVEALL)
    async with asyncio.TaskGroup() as tg:
        await rec.mark_start(a.concurrency)  # the benchmark's warm handler pool
        running = tg.create_task(w.run())
        # Every job handled, or the worker stopped (a signal; a handler failing
        # every job): either way the process ends.
        finished = tg.create_task(done.wait())
        await asyncio.wait([running, finished], return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        await asyncio.sleep(0.2)
        w.shutdown()
    Path(a.out).write_text(  # noqa: ASYNC240 - once, after the run
        json.dumps(
            {
                "gcs": gcs,
                "stamps": stamps,
                "handled": handled,
                "arms": len(arms),
                "pool_sends": sent[0],
                "census": census,
                "expansions": expansions,
            }
        )
    )
    await client.aclose()


async def producer(a: argparse.Namespace) -> None:
    sys.path.insert(0, a.root)
    import venturi_redis as vr

    class Noop(vr.Task):
        KIND: ClassVar[str] = "noop"
        i: int = 0
        t: float = 0.0

    gcs: list[tuple[str, int, float]] = []
    _gc_hook(gcs)
    client = vr.Client.from_url(a.url)
    q = client.queue("bench")
    replies: list[tuple[int, float, float, float]] = []
    sends: list[float] = []
    import asyncio.selector_events as se

    write = se._SelectorSocketTransport.write

    def stamped_write(self: Any, data: Any) -> None:
        sends.append(time.time())
        write(self, data)

    se._SelectorSocketTransport.write = stamped_write  # type: ignore[method-assign]
    start = time.perf_counter()
    for i in range(a.n):
        delay = start + i / a.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.time()
        await q.enqueue(Noop(i=i, t=t))
        replies.append((i, t, time.time(), sends[-1] if sends else t))
    await client.aclose()
    Path(a.out).write_text(json.dumps({"gcs": gcs, "replies": replies}))  # noqa: ASYNC240 - after the run


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def one_run(root: str, url: str, a: argparse.Namespace, tag: str) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(url)
    r.flushall()
    # Redis's own view: every command that took it 0.5 ms or more to run.
    r.config_set("slowlog-log-slower-than", 500)
    r.slowlog_reset()
    wout, pout = f"/tmp/w3t-{tag}-w.json", f"/tmp/w3t-{tag}-p.json"
    common = ["--url", url, "--root", root, "--n", str(a.n)]
    env = {**os.environ, "PYTHONPATH": root}
    # W3_WORKER_WRAP: a command the worker runs under (valgrind --tool=callgrind ...).
    wrap = os.environ.get("W3_WORKER_WRAP", "").split()
    wp = subprocess.Popen(
        [
            *wrap,
            sys.executable,
            __file__,
            "_worker",
            *common,
            "--out",
            wout,
            "--concurrency",
            str(a.concurrency),
        ],
        env=env,
        cwd="/tmp",
    )
    deadline = time.monotonic() + (600 if wrap else 60)
    while not r.get("bench:start"):
        if time.monotonic() > deadline or wp.poll() is not None:
            raise RuntimeError("worker did not start")
        time.sleep(0.01)
    time.sleep(1.0)
    subprocess.run(
        [sys.executable, __file__, "_producer", *common, "--out", pout, "--rate", str(a.rate)],
        env=env,
        cwd="/tmp",
        check=True,
    )
    wp.wait(600 if wrap else 60)
    w, p = json.loads(Path(wout).read_text()), json.loads(Path(pout).read_text())
    res = analyse(w, p, a)
    slow = r.slowlog_get(128)
    res["slowlog"] = sorted(
        ((e["duration"] / 1000, (e["command"] or b"")[:40].decode(errors="replace")) for e in slow),
        reverse=True,
    )
    return res


def analyse(w: dict[str, Any], p: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    enq = {i: (t, rep, sent) for i, t, rep, sent in p["replies"]}
    rows = []
    for job_id, i, t, run in w["handled"]:
        s = w["stamps"].get(job_id, {})
        rep = enq[i][1]
        rows.append(
            {
                "i": i,
                "t": t,
                "total": run - t,
                "enq": rep - t,
                "sent": enq[i][2] - t,
                "tok": s.get("tok", float("nan")) - t,
                "clm": s.get("clm", float("nan")) - t,
                "job": s.get("job", float("nan")) - t,
                "armed_before": s.get("arm", 0.0) <= t,
                "busy": "tok" not in s,
                "run": run,
            }
        )
    ms = 1000.0
    totals = [r["total"] * ms for r in rows]
    out: dict[str, Any] = {
        "p50": pct(totals, 50),
        "p99": pct(totals, 99),
        "max": max(totals),
        "rows": rows,
        "w_gcs": w["gcs"],
        "p_gcs": p["gcs"],
        "arms": w["arms"],
        "pool_sends": w["pool_sends"],
        "census": w.get("census"),
        "expansions": w.get("expansions"),
        "p99_after_10": pct([r["total"] * ms for r in rows if r["i"] >= 10], 99),
    }
    return out


def report(name: str, res: dict[str, Any], n: int) -> None:
    ms = 1000.0
    rows = res["rows"]
    print(f"\n## {name}: p50 {res['p50']:.3f} ms, p99 {res['p99']:.3f} ms, max {res['max']:.2f} ms")
    stages = [
        ("producer: t -> EVALSHA written", lambda r: r["sent"]),
        ("producer: t -> reply read", lambda r: r["enq"]),
        ("EVALSHA written -> worker's BLPOP reply read", lambda r: r["tok"] - r["sent"]),
        ("t -> BLPOP reply read", lambda r: r["tok"]),
        ("BLPOP reply -> claim reply read", lambda r: r["clm"] - r["tok"]),
        ("claim reply -> parsed", lambda r: r["job"] - r["clm"]),
        ("parsed -> handler start", lambda r: r["total"] - r["job"]),
        ("total", lambda r: r["total"]),
    ]
    print("| stage | p50 | p90 | p99 | max |")
    print("|---|---|---|---|---|")
    for label, f in stages:
        xs = [f(r) * ms for r in rows if f(r) == f(r)]
        print(f"| {label} | {pct(xs, 50):.3f} | {pct(xs, 90):.3f} | {pct(xs, 99):.3f} | {max(xs):.3f} |")
    unarmed = sum(1 for r in rows if not r["armed_before"] and not r["busy"])
    busy = sum(1 for r in rows if r["busy"])
    print(f"jobs enqueued before the worker's BLPOP+claim that took them was sent: {unarmed}")
    print(f"jobs claimed while the worker was busy (behind), not by an idle claim: {busy}")
    print(
        f"idle BLPOP+claim sends: {res['arms']} ({res['arms'] / n:.2f}/job); pool sends {res['pool_sends']}"
    )
    for who in ("w_gcs", "p_gcs"):
        starts = {}
        durs: dict[int, list[float]] = {0: [], 1: [], 2: []}
        spans = []
        for phase, gen, ts in res[who]:
            if phase == "start":
                starts[gen] = ts
            elif gen in starts:
                durs[gen].append((ts - starts[gen]) * ms)
                spans.append((starts[gen], ts, gen))
        t0 = rows[0]["t"] if rows else 0
        during = [(s, e, g) for s, e, g in spans if s >= t0]
        hit = sum(1 for r in rows if any(s < r["run"] and e > r["t"] for s, e, _ in during))
        desc = ", ".join(
            f"gen{g}: {len([1 for s, e, gg in during if gg == g])} "
            f"(max {max([(e - s) * ms for s, e, gg in during if gg == g], default=0):.2f} ms)"
            for g in (0, 1, 2)
        )
        who_name = "worker" if who == "w_gcs" else "producer"
        print(f"{who_name} collections during the run: {desc}; jobs overlapping one: {hit}")
        print("   durations (gen ms): " + " ".join(f"{g}:{(e - s) * ms:.2f}" for s, e, g in during))
    for c in res.get("census") or []:
        print("   gc census:", c)
    t0 = min(r["t"] for r in rows)
    print(
        "worker script expansions (name, ms, at ms from job 0's t):",
        [(n, round(d, 2), round((at - t0) * 1000, 1)) for n, d, at in res.get("expansions") or []],
    )
    print(f"p99 without the first 10 jobs: {res['p99_after_10']:.3f} ms")
    slow = res.get("slowlog") or []
    print(f"Redis commands that ran 0.5 ms or longer (SLOWLOG): {len(slow)} {slow[:5]}")
    worst = sorted(rows, key=lambda r: -r["total"])[:15]
    print("slowest: i total sent enq tok clm job (ms from t)")
    for r in worst:
        how = "busy" if r["busy"] else f"armed={r['armed_before']}"
        print(
            f"  {r['i']:4d} {r['total'] * ms:7.3f} {r['sent'] * ms:7.3f} {r['enq'] * ms:7.3f} "
            f"{r['tok'] * ms:7.3f} {r['clm'] * ms:7.3f} {r['job'] * ms:7.3f} {how}"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="drive")
    p.add_argument("roots", nargs="*")
    p.add_argument("--url")
    p.add_argument("--root")
    p.add_argument("--out")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quiet", action="store_true", help="only the summary lines")
    a = p.parse_args()
    if a.mode == "_worker":
        asyncio.run(worker(a))
        return
    if a.mode == "_producer":
        asyncio.run(producer(a))
        return
    roots = [a.mode] if a.mode != "drive" else []
    roots = [str(Path(x).resolve()) for x in roots + a.roots] or [str(HERE.parent)]
    sys.path.insert(0, str(HERE.parent))
    from tests.servers import RedisServer

    summary: dict[str, list[tuple[float, float]]] = {root: [] for root in roots}
    with RedisServer() as server:
        for run in range(a.runs):
            for root in roots if run % 2 == 0 else roots[::-1]:
                res = one_run(root, server.url, a, f"{run}-{abs(hash(root))}")
                summary[root].append((res["p50"], res["p99"]))
                if not a.quiet:
                    report(f"{root} run {run + 1}", res, a.n)
                print(f"{root} run {run + 1}: p50 {res['p50']:.3f} p99 {res['p99']:.3f}", flush=True)
    for root, xs in summary.items():
        p99s = sorted(x[1] for x in xs)
        p50s = [round(x[0], 3) for x in xs]
        print(
            f"{root}: p50s {p50s} p99s {[round(x[1], 3) for x in xs]} median p99 {p99s[len(p99s) // 2]:.3f}"
        )


if __name__ == "__main__":
    main()
