"""Redis's own cost per job, in instructions: repeatable on a noisy machine.

Usage (from the repository root; needs valgrind)::

    .venv/bin/python benchmarks/redis_cost.py [--n 2000] [--batch 100] [--root PATH]

Starts ``redis-server`` under ``valgrind --tool=callgrind`` and drives the
Lua scripts bare, as W8 does (``benchmarks/venturi_only.py``, ``Raw``):
``n`` single enqueues, then a drain in batches of ``batch`` (one claim, then
per round trip complete.lua over the claimed jobs and the next claim). The
counters are zeroed before each phase and dumped after it, and the figure is
the server's instructions per job in that phase: event loop, parsing, Lua and
the commands the scripts call, everything Redis does for the job.

Wall-clock time on this machine drifts by half within minutes; an
instruction count of the same command sequence varies by ~0.1% between runs.
``--root`` takes the scripts from another checkout (``git worktree add``),
for an A/B of a Lua change. ``--keep DIR`` keeps the dumps (``DIR/cg.1``, the
enqueues; ``DIR/cg.2``, the drain) for ``callgrind_annotate --inclusive=yes``.

``--fanin K`` (workflows, docs/workflows.md): the jobs are enqueued as
children of ``n / K`` flows (``enqueue_flow.lua``, K children per call), each
parent also waiting on a gate job that is never eligible, so the drain is the
children alone and each completion releases one dependent: the drain figure
is then the cost per child (claim + complete + the graph step), to compare
with a plain run's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis.exceptions

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _total(path: Path) -> int:
    """A dump's instructions: its ``totals:`` line (with instrumentation switched off and
    on within a dump, as ending_cost.py does, ``summary:`` holds the last stretch only)."""
    text = path.read_text()
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError(f"no instruction total in {path}")
    return int(m.group(1))


@contextlib.contextmanager
def callgrind_server(out: Path) -> Iterator[tuple[int, int]]:
    """A redis-server on a free port under callgrind, dumping to ``out.1``, ``out.2``, ...:
    its port and pid; stopped on the way out."""
    port = _free_port()
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    server = subprocess.Popen(
        [*valgrind, "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield port, server.pid
    finally:
        server.terminate()
        server.wait()


def use_root(root: Path) -> None:
    """Import the package from ``root`` (first on ``sys.path``, with this folder's modules), or stop."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(root.resolve()))
    import venturi_redis

    if not Path(venturi_redis.__file__).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"venturi_redis came from {venturi_redis.__file__}, not from {root}")


async def callgrind_control(pid: int, flag: str) -> None:
    """``callgrind_control FLAG PID``: -z zeroes the server's counters, -d dumps them."""
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control",
        flag,
        str(pid),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    if await proc.wait() != 0:
        raise RuntimeError(f"callgrind_control {flag} {pid} failed")


async def server_up(r: Any) -> None:
    """Wait for the server under valgrind to answer (it takes a few seconds to start)."""
    for _ in range(300):
        try:
            await r.ping()
            return
        except redis.exceptions.ConnectionError:
            await asyncio.sleep(0.1)


async def measure_floor(port: int, pid: int, out: Path, n: int, batch: int, bulk: int = 1) -> dict[str, int]:
    """The storage shape's floor (``redis_cpu.py``'s three minimal scripts), counted the same way."""
    import redis.asyncio as aioredis
    from redis_cpu import Floor

    floor = Floor(f"redis://127.0.0.1:{port}")
    probe = aioredis.Redis(port=port, socket_timeout=None)
    try:
        await server_up(probe)
    finally:
        await probe.aclose()
    await callgrind_control(pid, "-z")
    await floor.enqueue(n, bulk)
    await callgrind_control(pid, "-d")
    await callgrind_control(pid, "-z")
    done = await floor.drain(n, batch)
    await callgrind_control(pid, "-d")
    if done != n:
        raise RuntimeError(f"drained {done} of {n} jobs")
    return {"enqueue": _total(Path(f"{out}.1")) // n, "drain": _total(Path(f"{out}.2")) // n}


async def measure(
    port: int,
    pid: int,
    out: Path,
    n: int,
    batch: int,
    events: int = 0,
    fanin: int = 0,
    bulk: int = 1,
    max_kept: int | None = None,
    history: bool = False,
) -> dict[str, int]:
    """Drive the server on ``port`` (callgrind's pid ``pid``, dumping to ``out``)."""
    from venturi_only import Raw

    from venturi_redis._model.ids import new_job_id

    async def control(flag: str) -> None:
        await callgrind_control(pid, flag)

    raw = Raw(f"redis://127.0.0.1:{port}")
    raw.max_kept = max_kept
    try:
        await server_up(raw.r)
        await raw.load()
        if history:  # the queue's metrics history on (docs/observability.md "Metrics history")
            await raw.r.hset(raw.k.meta, "history", "1")
        if events < 0:
            await raw.r.hset(raw.k.meta, "events", "0")
        if events > 0:  # the queue's event stream on, capped at `events` (docs/observability.md)
            await raw.r.hset(raw.k.meta, "events", str(events))
            await raw.r.xadd(f"{raw.k.prefix}events", {"event": "events_on"})  # the stream must exist
        ids = [new_job_id() for _ in range(n)]
        gate = new_job_id()
        if fanin:
            from venturi_redis._store import calls, calls_flow

            await raw.r.script_load(raw.s["enqueue_flow"].source)
            # The gate: pending an hour from now, so no parent becomes pending.
            gate_call = calls.enqueue(raw.k, "", [_job(raw, gate, 3_600_000)])
            await raw.r.evalsha(raw.s["enqueue"].sha, *_call(gate_call))
        await control("-z")
        if fanin:
            for start in range(0, n, fanin):
                chunk = ids[start : start + fanin]
                jobs = [calls_flow.FlowJob(_job(raw, i), "fail", ()) for i in chunk]
                jobs.append(calls_flow.FlowJob(_job(raw, new_job_id()), "fail", (*chunk, gate)))
                call = calls_flow.enqueue_flow(raw.k, "", jobs)
                await raw.r.evalsha(raw.s["enqueue_flow"].sha, *_call(call))
        else:
            for start in range(0, n, bulk):
                await raw.enqueue(ids[start : start + bulk])
        await control("-d")  # dump 1: the enqueues
        await control("-z")
        done = await raw.drain(batch)
        await control("-d")  # dump 2: the drain
    finally:
        await raw.aclose()
    if done != n:
        raise RuntimeError(f"drained {done} of {n} jobs")
    return {"enqueue": _total(Path(f"{out}.1")) // n, "drain": _total(Path(f"{out}.2")) // n}


def _call(call: Any) -> list[Any]:
    return [len(call.keys), *call.keys, *call.args]


def _job(raw: Any, job_id: str, delay_ms: int = 0) -> Any:
    import venturi_redis as vr
    from venturi_redis._store.prepare import Prepared

    return Prepared(job_id, "noop", vr.Priority.NORMAL, delay_ms, raw.payload, b"", "", "", "", False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="jobs (default 2000)")
    ap.add_argument("--batch", type=int, default=100, help="claim batch (default 100)")
    ap.add_argument("--root", type=Path, default=HERE.parent, help="checkout whose scripts to drive")
    ap.add_argument(
        "--events",
        type=int,
        default=0,
        help="the queue's event stream capped at N (default 0: as the release does, on; -1: off)",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        help="directory to keep callgrind's dumps in (cg.1: enqueues, cg.2: drain), for callgrind_annotate",
    )
    ap.add_argument("--fanin", type=int, default=0, help="children per flow (0: plain jobs)")
    ap.add_argument(
        "--floor", action="store_true", help="drive the storage shape's floor (redis_cpu.py) instead of ours"
    )
    ap.add_argument(
        "--bulk", type=int, default=1, help="jobs per enqueue call (default 1; ours takes <= 500)"
    )
    ap.add_argument(
        "--max-kept",
        type=int,
        default=None,
        help="completed jobs kept (default: all); past it each completion trims the oldest",
    )
    ap.add_argument(
        "--history", action="store_true", help="the queue's metrics history on (default: off, as released)"
    )
    a = ap.parse_args()
    use_root(a.root)
    with tempfile.TemporaryDirectory() as tmp:
        if a.keep is not None:
            a.keep.mkdir(parents=True, exist_ok=True)
        out = (a.keep.resolve() if a.keep is not None else Path(tmp)) / "cg"
        with callgrind_server(out) as (port, pid):
            if a.floor:
                got = asyncio.run(measure_floor(port, pid, out, a.n, a.batch, a.bulk))
            else:
                got = asyncio.run(
                    measure(port, pid, out, a.n, a.batch, a.events, a.fanin, a.bulk, a.max_kept, a.history)
                )
    what = f"enqueue_flow ({a.fanin} children per call)" if a.fanin else "single enqueue"
    if a.bulk > 1 and not a.fanin:
        what = f"enqueue ({a.bulk} jobs per call)"
    print(
        f"{'the floor' if a.floor else a.root}"
        f"{' (events off)' if a.events < 0 else f' (events capped at {a.events})' if a.events else ''}"
        f"{' (history on)' if a.history else ''}: "
        "Redis instructions per job: "
        f"{what} {got['enqueue']:,}; "
        f"claim + complete (batch {a.batch}) {got['drain']:,}"
    )


if __name__ == "__main__":
    main()
