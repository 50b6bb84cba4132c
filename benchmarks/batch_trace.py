"""Where a batch drain's time goes: Redis idle, worker idle, round trips (issue 40).

Usage (from the repository root, on Linux; starts its own redis-server)::

    .venv/bin/python benchmarks/batch_trace.py [ROOT ...] [--n 20000] [--rounds 3]

For each checkout ROOT (default: this one; another made with ``git worktree
add`` or ``git archive``), in rounds alternating between them, one worker
process at concurrency 100 drains ``n`` no-op jobs of a ``vr.BatchHandler``
at ``BATCH_SIZE`` 100 (benchmarks/batch_drain.py's ``batch no-op``), and
prints, for Redis (its main thread) and for the worker (its event loop's
thread), from ``/proc/.../schedstat`` across the drain:

- ``CPU µs/job``: time on a CPU;
- ``runq``: the share of the drain it was ready to run but waited for a CPU
  (the machine's other load; about 0 on a quiet machine);
- ``idle``: the rest, the share it had nothing to do: Redis waiting for the
  worker's next command, the worker for Redis's replies. A drain in which
  the two take turns shows both idle a good part of the time; one that
  overlaps them leaves Redis, the side with more work per job, near 0;

and ``claims``, ``pipelines`` (the claim calls, and the completer's
pipelines: a claim that rides in one is counted in both) and ``held at
claim``: the most jobs the runner held (claimed, running, or ended with
their ending not yet written) when a claim's reply came, 0 when each claim
waits for the last claim's completions. The counts are read by wrapping
the checkout's worker internals (``_Runner.claim``, the outbox's
``Outbox._send``): a diagnostic, not an API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _sched(path: str) -> tuple[float, float]:
    """A thread's time on a CPU and waiting for one, in seconds (``/proc/.../schedstat``)."""
    on_cpu, waiting, _ = Path(path).read_text().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


async def drain(root: str, url: str, pid: int, n: int) -> dict[str, Any]:
    """One drain of the checkout at ``root``: its figures (see the module docstring)."""
    sys.path.insert(0, root)

    import venturi_redis as vr
    from venturi_redis._worker import outbox as outbox_module
    from venturi_redis._worker import runner as runner_module

    sys.path.insert(0, str(HERE))
    from batch_drain import BatchJob, fill

    counts = {"claims": 0, "pipelines": 0, "held_at_claim": 0}
    real_claim = runner_module._Runner.claim
    real_send = outbox_module.Outbox._send

    async def claim(self: Any, count: int) -> Any:
        got = await real_claim(self, count)
        counts["claims"] += 1
        counts["held_at_claim"] = max(counts["held_at_claim"], len(self.active))
        return got

    async def send(self: Any, ops: Any, completions: Any) -> None:
        counts["pipelines"] += 1
        await real_send(self, ops, completions)

    runner_module._Runner.claim = claim  # type: ignore[method-assign]
    outbox_module.Outbox._send = send  # type: ignore[method-assign]

    _, client, q = await fill(url, n)
    worker = vr.Worker(q, concurrency=100, handle_signals=False)
    worker.register(BatchJob)
    redis_stat = f"/proc/{pid}/schedstat"  # redis-server's main thread: the one that runs commands
    own_stat = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"  # the event loop's
    r0, w0 = _sched(redis_stat), _sched(own_stat)
    t0 = time.perf_counter()
    await worker.run(until_idle=True)
    span = time.perf_counter() - t0
    r1, w1 = _sched(redis_stat), _sched(own_stat)
    await client.aclose()
    out: dict[str, Any] = {"jobs_s": n / span, **counts}
    for side, before, after in (("redis", r0, r1), ("worker", w0, w1)):
        on_cpu, waiting = after[0] - before[0], after[1] - before[1]
        out[f"{side}_us_per_job"] = on_cpu / n * 1e6
        out[f"{side}_runq"] = waiting / span
        out[f"{side}_idle"] = max(0.0, span - on_cpu - waiting) / span
    return out


def _pct(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("roots", nargs="*")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=4, metavar=("ROOT", "URL", "PID", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        root, url, pid, n = a.child
        print(json.dumps(asyncio.run(drain(root, url, int(pid), int(n)))))
        return
    sys.path.insert(0, str(HERE.parent))
    from tests.servers import RedisServer

    roots = [str(Path(r).resolve()) for r in a.roots] or [str(HERE.parent)]
    print(f"{a.n:,} batch no-op jobs per drain, concurrency 100, BATCH_SIZE 100")
    print(
        "| checkout | jobs/s | Redis CPU µs/job | Redis idle | Redis runq | worker CPU µs/job | worker idle "
        "| worker runq | claims | pipelines | held at claim |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
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
                    f"| {_pct(r, 'redis_runq')} | {r['worker_us_per_job']:.1f} | {_pct(r, 'worker_idle')} "
                    f"| {_pct(r, 'worker_runq')} | {r['claims']} | {r['pipelines']} | {r['held_at_claim']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
