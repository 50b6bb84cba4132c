"""Claim cost with many jobs waiting behind busy order keys, against none: Redis instructions.

Usage (from the repository root; needs valgrind)::

    .venv/bin/python benchmarks/order_cost.py [--waiting 1000000] [--keys 1000] [--n 2000] [--batch 100]

Ordered keys (docs/semantics.md, "Ordered keys") keep a key's later jobs out
of every pending set, so a claim never reads them: its cost must not depend
on how many wait (issue 40's target: at most 1.2x with 1,000,000 waiting).
Two fresh ``redis-server`` processes run under ``valgrind --tool=callgrind
--instr-atstart=no``. In the second, ``--keys`` jobs with an order key are
enqueued and claimed (their keys are busy: running, never completed), then
``--waiting`` more jobs of those keys are enqueued behind them (500 per
enqueue call), all uninstrumented. In both, ``n`` jobs without a key are
enqueued, then instrumentation is switched on and they are drained as
``redis_cost.py`` drains (one claim, then per round trip complete.lua over
the claimed jobs and the next claim, ``batch`` a claim). The figure is the
server's instructions per drained job; the ratio is the second's over the
first's. ``--root`` takes the scripts from another checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_one(waiting: int, keys: int, n: int, batch: int) -> tuple[int, float]:
    """One server under callgrind: (instructions per drained job, seconds spent filling)."""
    from redis_cost import _free_port, _total

    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg"
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        server = subprocess.Popen(
            [*valgrind, "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            filled = asyncio.run(fill_and_drain(port, server.pid, waiting, keys, n, batch))
        finally:
            server.terminate()
            server.wait()
        return _total(Path(f"{out}.1")) // n, filled


async def fill_and_drain(port: int, pid: int, waiting: int, keys: int, n: int, batch: int) -> float:
    """Fill the server uninstrumented, then drain ``n`` plain jobs instrumented; the filling's seconds."""
    from redis_cost import callgrind_control, server_up
    from venturi_only import Raw

    import venturi_redis as vr
    from venturi_redis._model.ids import new_job_id
    from venturi_redis._store import calls
    from venturi_redis._store.prepare import Prepared

    raw = Raw(f"redis://127.0.0.1:{port}")
    try:
        await server_up(raw.r)
        await raw.load()
        started = time.monotonic()

        def ordered(ids: list[str], first: int) -> list[Prepared]:
            return [
                Prepared(j, "noop", vr.Priority.NORMAL, 0, raw.payload, b"", "", "", "", False)._replace(
                    order_key=f"key-{(first + i) % keys}"
                )
                for i, j in enumerate(ids)
            ]

        async def enqueue(jobs: list[Prepared]) -> None:
            call = calls.enqueue(raw.k, "", jobs)
            await raw.r.evalsha(raw.s["enqueue"].sha, len(call.keys), *call.keys, *call.args)

        if waiting:
            # The holders, claimed: every key busy (running, a 30 s lease, never completed).
            for s in range(0, keys, 500):
                await enqueue(ordered([new_job_id() for _ in range(min(500, keys - s))], s))
            held = 0
            while held < keys:
                got = await raw.claim(1000)
                if not got:
                    raise RuntimeError(f"claimed {held} of {keys} holders")
                held += len(got)
            for s in range(0, waiting, 500):
                await enqueue(ordered([new_job_id() for _ in range(min(500, waiting - s))], s))
            counted = await raw.r.zcard(raw.k.order_queue)
            if counted != waiting:
                raise RuntimeError(f"{counted} jobs wait on their keys, not {waiting}")
        filled = time.monotonic() - started
        plain = [new_job_id() for _ in range(n)]
        for s in range(0, n, 500):
            await raw.enqueue(plain[s : s + 500])
        # Instrumentation on: the drain alone is counted.
        proc = await asyncio.create_subprocess_exec(
            "callgrind_control",
            "-i",
            "on",
            str(pid),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        if await proc.wait() != 0:
            raise RuntimeError("callgrind_control -i on failed")
        await callgrind_control(pid, "-z")
        done = await raw.drain(batch)
        await callgrind_control(pid, "-d")
        if done != n:
            raise RuntimeError(f"drained {done} of {n} jobs")
        if waiting and await raw.r.zcard(raw.k.order_queue) != waiting:
            raise RuntimeError("a waiting job moved")
    finally:
        await raw.aclose()
    return filled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiting", type=int, default=1_000_000, help="jobs waiting behind busy keys")
    ap.add_argument("--keys", type=int, default=1_000, help="busy order keys")
    ap.add_argument("--n", type=int, default=2_000, help="jobs drained while measured")
    ap.add_argument("--batch", type=int, default=100, help="claim batch")
    ap.add_argument("--root", type=Path, default=HERE.parent, help="checkout whose scripts to drive")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(a.root.resolve()))
    none, _ = run_one(0, a.keys, a.n, a.batch)
    many, filled = run_one(a.waiting, a.keys, a.n, a.batch)
    print(
        f"{a.root}: Redis instructions per job, claim + complete (batch {a.batch}): "
        f"none waiting {none:,}; {a.waiting:,} waiting behind {a.keys:,} busy keys {many:,} "
        f"({many / none:.3f}x; filled in {filled:.0f} s, uninstrumented)"
    )


if __name__ == "__main__":
    main()
