"""Process CPU per job of venturi's hot paths, in one process: a steadier figure than jobs/s.

Usage (from the repository root)::

    .venv/bin/python benchmarks/cpu.py [--n 20000] [--root PATH]

On a shared 2-core machine, jobs/s moves with whatever else runs; the CPU time
this process spends per job moves much less, so it is the figure to compare
two versions by. ``--root`` runs the same measurement against another checkout
of the project (``git worktree add /tmp/base <commit>``), with this script's
own task definitions, in the same sitting::

    git worktree add /tmp/base 21c7719
    .venv/bin/python benchmarks/cpu.py --root /tmp/base
    .venv/bin/python benchmarks/cpu.py

Each row: a fresh redis-server of the script's own, then ``n`` jobs (the
median of 3 rounds for the enqueue rows; one drain per concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def setup(root: Path) -> None:
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(HERE / "peers"))


async def timed(n: int, body: object) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    await body  # type: ignore[misc]
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e6


async def main(a: argparse.Namespace) -> None:
    import _common as c
    import venturi_bench as VB

    import venturi_redis as vr
    from tests.servers import RedisServer

    print(f"venturi_redis from {Path(vr.__file__).parent}")
    print(f"| {a.n:,} jobs | jobs/s | µs of CPU per job (this process) |\n|---|---|---|")

    async def single(q: vr.Queue) -> None:
        for i in range(a.n):
            await q.enqueue(VB.Noop(i=i))

    async def bulk(q: vr.Queue) -> None:
        for s in range(0, a.n, 1000):
            await q.enqueue_many([VB.Noop(i=i) for i in range(s, s + 1000)])

    for label, body in (("single enqueue, sequential", single), ("enqueue_many, 1,000 per call", bulk)):
        with RedisServer() as server:
            client = vr.Client.from_url(server.url)
            q = client.queue("bench")
            await q.enqueue_many([VB.Noop(i=i) for i in range(300)])  # warm-up
            rounds = [await timed(a.n, body(q)) for _ in range(3)]
            await client.aclose()
        rate = statistics.median(r for r, _ in rounds)
        cpu = statistics.median(u for _, u in rounds)
        print(f"| {label} | {rate:,.0f} | {cpu:.1f} |", flush=True)

    # The W2 handler (one INCR from its own client), and an empty one that
    # counts in-process (W8's "worker with an empty handler"): the difference
    # is what the handler costs inside the worker's process.
    for conc, recorder in ((10, c.AsyncRecorder), (100, c.AsyncRecorder), (100, c.EmptyRecorder)):
        with RedisServer() as server:
            client = vr.Client.from_url(server.url)
            q = client.queue("bench")
            await bulk(q)
            rec = recorder(server.url, a.n)
            w = vr.Worker(q, state=rec, concurrency=conc, handle_signals=False)
            w.register(VB.NoopJob)
            rate, cpu = await timed(a.n, w.run(until_idle=True))
            handler = "one INCR" if recorder is c.AsyncRecorder else "empty"
            label = f"worker drain, concurrency {conc} (handler: {handler})"
            print(f"| {label} | {rate:,.0f} | {cpu:.1f} |", flush=True)
            await rec.r.aclose()
            await client.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--root", type=Path, default=HERE.parent, help="project checkout to measure")
    args = ap.parse_args()
    setup(args.root.resolve())
    asyncio.run(main(args))
