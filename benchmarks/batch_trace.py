"""Where a batch drain's time goes: Redis idle, worker idle, round trips (issue 40).

Usage (from the repository root; starts its own redis-server; Redis's idle
time needs ``strace``)::

    .venv/bin/python benchmarks/batch_trace.py [ROOT ...] [--n 20000] [--rounds 3]

For each checkout ROOT (default: this one; another made with ``git worktree
add`` or ``git archive``), in rounds alternating between them, one worker
process at concurrency 100 drains ``n`` no-op jobs of a ``vr.BatchHandler``
at ``BATCH_SIZE`` 100 (benchmarks/batch_drain.py's ``batch no-op``), and
prints:

- ``redis idle``: the share of the drain Redis spent waiting for a command
  (``strace -e epoll_wait`` on the redis-server: the time inside the calls
  that blocked), ``worker idle`` the worker's (its event loop's ``select``),
  and ``both busy`` the share when neither waited: how much the two overlap.
  On a loaded machine "busy" also counts waiting for a CPU;
- ``claims``, ``pipelines``: the claim calls, and the completer's pipelines
  (a claim that rides in one is counted in both);
- ``held at claim``: the most jobs the runner held (claimed, running, or
  ended with their ending not yet written) when a claim's reply came: 0 when
  each claim waits for the last claim's completions.

The timings are read by wrapping the worker's internals of that checkout
(``_Runner.claim``, the completer's ``_Batch._send``): a diagnostic, not an
API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _union(iv: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


async def drain(root: str, url: str, n: int, ready: Any) -> dict[str, Any]:
    """One drain: its figures, the worker's idle intervals and the drain's span (``t0``, ``t1``)."""
    sys.path.insert(0, root)
    import redis

    import venturi_redis as vr
    from venturi_redis._worker import completer as completer_module
    from venturi_redis._worker import runner as runner_module

    sys.path.insert(0, str(HERE))
    from batch_drain import BatchJob, Noop

    counts = {"claims": 0, "pipelines": 0, "held_at_claim": 0}
    real_claim = runner_module._Runner.claim
    real_send = completer_module._Batch._send

    async def claim(self: Any, count: int) -> Any:
        got = await real_claim(self, count)
        counts["claims"] += 1
        counts["held_at_claim"] = max(counts["held_at_claim"], len(self.active))
        return got

    async def send(self: Any, ops: Any, completions: Any) -> None:
        counts["pipelines"] += 1
        await real_send(self, ops, completions)

    runner_module._Runner.claim = claim  # type: ignore[method-assign]
    completer_module._Batch._send = send  # type: ignore[method-assign]

    sync = redis.Redis.from_url(url)
    sync.flushall()
    client = vr.Client.from_url(url)
    q = client.queue("bench")
    for start in range(0, n, 1000):
        await q.enqueue_many([Noop(i=i) for i in range(start, min(n, start + 1000))])
    worker = vr.Worker(q, concurrency=100, handle_signals=False)
    worker.register(BatchJob)
    await asyncio.to_thread(ready)  # strace attached
    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
    real_select = selector.select
    worker_idle: list[tuple[float, float]] = []

    def select(timeout: float | None = None) -> Any:
        a = time.time()
        got = real_select(timeout)
        worker_idle.append((a, time.time()))
        return got

    selector.select = select
    info = sync.info("cpu")
    cpu0 = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    t0 = time.time()
    await worker.run(until_idle=True)
    t1 = time.time()
    selector.select = real_select
    info = sync.info("cpu")
    cpu1 = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    await client.aclose()
    return {
        "jobs_s": n / (t1 - t0),
        "redis_us_per_job": (cpu1 - cpu0) / n * 1e6,
        **counts,
        "t0": t0,
        "t1": t1,
        "worker_idle": worker_idle,
    }


def child(root: str, url: str, pid: int, n: int) -> dict[str, Any]:
    """A drain with Redis's idle time read by strace (when there is one)."""
    out_file = f"/tmp/batch_trace.{os.getpid()}.strace"
    tracer = None

    def ready() -> None:
        nonlocal tracer
        if shutil.which("strace"):
            tracer = subprocess.Popen(
                ["strace", "-q", "-tt", "-T", "-e", "trace=epoll_wait", "-p", str(pid), "-o", out_file],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)

    result = asyncio.run(drain(root, url, n, ready))
    t0, t1 = result.pop("t0"), result.pop("t1")
    span = t1 - t0

    def clip(iv: list[tuple[float, float]]) -> list[list[float]]:
        return _union([(max(a, t0), min(b, t1)) for a, b in iv if b > t0 and a < t1])

    w_idle = clip(result.pop("worker_idle"))
    result["worker_idle"] = sum(b - a for a, b in w_idle) / span
    if tracer is not None:
        time.sleep(0.2)
        tracer.terminate()
        tracer.wait()
        lt = time.localtime(t0)
        midnight = t0 - (lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + t0 % 1)
        r_iv = []
        for line in Path(out_file).read_text().splitlines():
            m = re.match(r"(\d+):(\d+):(\d+\.\d+) epoll_wait\(.*<(\d+\.\d+)>", line)
            if m:
                h, mi, s, d = m.groups()
                start = midnight + int(h) * 3600 + int(mi) * 60 + float(s)
                r_iv.append((start, start + float(d)))
        os.unlink(out_file)
        r_idle = clip(r_iv)
        idle = sum(b - a for a, b in r_idle)
        result["redis_idle"] = idle / span
        both_idle = _overlap(r_idle, w_idle)
        result["both_busy"] = (span - idle - result["worker_idle"] * span + both_idle) / span
    return result


def _pct(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:.0%}" if key in r else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("roots", nargs="*")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=4, metavar=("ROOT", "URL", "PID", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        root, url, pid, n = a.child
        print(json.dumps(child(root, url, int(pid), int(n))))
        return
    sys.path.insert(0, str(HERE.parent))
    from tests.servers import RedisServer

    roots = [str(Path(r).resolve()) for r in a.roots] or [str(HERE.parent)]
    print(f"{a.n:,} batch no-op jobs per drain, concurrency 100, BATCH_SIZE 100")
    print(
        "| checkout | jobs/s | Redis CPU µs/job | redis idle | worker idle | both busy | claims | pipelines "
        "| held at claim |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with RedisServer() as server:
        assert server.proc is not None
        for _ in range(a.rounds):
            for root in roots:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", root, server.url, str(server.proc.pid), str(a.n)],
                    check=True,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"| {root} | {r['jobs_s']:,.0f} | {r['redis_us_per_job']:.1f} | {_pct(r, 'redis_idle')} "
                    f"| {_pct(r, 'worker_idle')} | {_pct(r, 'both_busy')} | {r['claims']} | {r['pipelines']} "
                    f"| {r['held_at_claim']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
