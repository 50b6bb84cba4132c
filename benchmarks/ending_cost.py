"""Redis's own cost of a run's other endings, in instructions per call: retry, pause, release, ...

Usage (from the repository root; needs valgrind and a redis-server with
symbols, e.g. the one built with ``make OPTIMIZATION=-O2`` in /tmp/debug-redis)::

    PATH=/tmp/debug-redis:$PATH .venv/bin/python benchmarks/ending_cost.py [--n 1000]
        [--ending retry,pause,release,suspend,dead,reclaim] [--root PATH] [--keep DIR]

redis_cost.py counts enqueue, claim and complete; a job's other endings are
scripts of their own. For each ending named, the server under ``valgrind
--tool=callgrind`` (as redis_cost.py starts it) runs rounds of 100 jobs,
each on an empty database: the jobs are enqueued and claimed, then each
job's run ends by one call of the ending's script, as a worker sends it, one
round trip each (the handler failed: ``retry.lua``, the job's first failure,
back to pending after the default backoff's 0 ms; paused for 0 ms:
``pause.lua``; a graceful shutdown: ``release.lua``; ``suspend.lua``; a
permanent error: ``dead.lua``). Every reply is checked. A job back to
pending is then drained (claim + complete), so a retry's jobs fail once and
complete on their second run. ``reclaim`` is the worker's sweep of an idle
queue (nothing expired: the usual tick), ``n`` calls.

Only the endings are counted (callgrind's instrumentation is on while they
run, off otherwise), and the figures are per call: all of the server's
instructions (event loop, parsing, Lua and the commands the script runs),
and those inside ``evalShaCommand`` (the script alone: the timers of the
event loop run by the wall clock, ~50x slower under valgrind, so their
share moves with the machine's load). Rounds of 100 keep every sorted set
a listpack: a skiplist's random levels moved the counts by ~1% between runs
of the same code; now they repeat to ~0.3% on a quiet machine (a busy one
moves them by ~1%: dict resizes and rehash steps follow the wall clock's
cron too), so alternate base and branch and read them in one sitting.

Events are on (the default of a queue), history off. ``--root`` takes the
scripts from another checkout (a base made with ``git archive``), for an
A/B of a Lua change. ``--keep DIR`` keeps the dumps (``DIR/cg.<ending>``)
for ``callgrind_annotate --inclusive=yes``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

ENDINGS = ("retry", "pause", "release", "suspend", "dead", "reclaim")
ROUND = 100  # jobs per round (below zset-max-listpack-entries, 128)


def _evalsha(path: Path) -> int:
    """The instructions inside ``evalShaCommand`` (inclusive) in a dump: the scripts alone,
    without the event loop's timers (serverCron runs by the wall clock, ~10x slower
    under valgrind, so its share of a phase moves with the machine's load)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", str(path)], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"^\s*([\d,]+) \([ \d.]+%\)\s+\S*:evalShaCommand ", out, re.M)
    if m is None:
        raise RuntimeError(f"no evalShaCommand in {path}: a redis-server without symbols?")
    return int(m.group(1).replace(",", ""))


async def measure(
    port: int, pid: int, out: Path, n: int, endings: list[str], kept: dict[str, Path]
) -> dict[str, int]:
    """Each ending's instructions per call, on the server on ``port`` (callgrind's ``pid``);
    ``kept`` gets each ending's dump."""
    from redis_cost import _total, callgrind_control, server_up
    from venturi_only import Raw

    import venturi_redis as vr
    from venturi_redis._model.ids import new_job_id
    from venturi_redis._store import calls

    raw = Raw(f"redis://127.0.0.1:{port}")
    k, normal = raw.k, vr.Priority.NORMAL
    got: dict[str, int] = {}
    dumps = 0  # callgrind numbers its dumps: out.1, out.2, ...

    async def count(name: str) -> None:
        nonlocal dumps
        await callgrind_control(pid, "-d")
        dumps += 1
        dump = Path(f"{out}.{dumps}")
        got[name] = _total(dump) // n
        got[f"{name} evalsha"] = _evalsha(dump) // n
        kept[name] = dump

    def call(name: str, job_id: str, token: str) -> Any:
        if name == "retry":
            return calls.retry(
                k,
                "",
                job_id=job_id,
                token=token,
                priority=normal,
                note="boom",
                attachment=b"",
                carry=b"",
                base_ms=1000,
                cap_ms=600_000,
                jitter=0.25,
                max_failures="25",
                error_type="RuntimeError",
                traceback='  File "tasks.py", line 3, in handler\nRuntimeError: boom',
            )
        if name == "pause":
            return calls.pause(
                k,
                "",
                job_id=job_id,
                token=token,
                priority=normal,
                delay_ms=0,
                note="",
                attachment=b"",
                carry=b"",
            )
        if name == "release":
            return calls.release(
                k, "", job_id=job_id, token=token, priority=normal, carry=b"", note="worker shutting down"
            )
        if name == "suspend":
            return calls.suspend(
                k, "", job_id=job_id, token=token, note="", attachment=b"", carry=b"", output=b""
            )
        assert name == "dead", name
        return calls.dead(
            k,
            "",
            job_id=job_id,
            token=token,
            note="bad input",
            attachment=b"",
            carry=b"",
            reason="permanent",
            error_type="ValueError",
            traceback="ValueError: bad input",
        )

    try:
        await server_up(raw.r)
        await raw.load()
        for name in ENDINGS:
            await raw.r.script_load(raw.s[name].source)
        for name in endings:
            await raw.r.flushall()
            if name == "reclaim":
                sweep = calls.reclaim(k, "", batch=100, max_failures="25")
                await callgrind_control(pid, "-z")
                for _ in range(n):
                    reply = await raw.r.evalsha(
                        raw.s["reclaim"].sha, len(sweep.keys), *sweep.keys, *sweep.args
                    )
                    assert calls.reclaimed(reply) == calls.Reclaimed(0, 0, []), reply
                await count(name)
                continue
            # Rounds of ROUND jobs on an empty database, counted only while the
            # endings run: every set stays a listpack (a skiplist's random
            # levels moved the counts by ~1% between runs of the same code).
            await callgrind_control(pid, "--instr=off")
            await callgrind_control(pid, "-z")
            for _ in range(0, n, ROUND):
                await raw.r.flushall()
                await raw.enqueue([new_job_id() for _ in range(ROUND)])
                runs = await raw.claim(ROUND)
                assert len(runs) == ROUND, runs
                await callgrind_control(pid, "--instr=on")
                for job_id, token in runs:
                    c = call(name, job_id, token)
                    reply = await raw.r.evalsha(raw.s[c.name].sha, len(c.keys), *c.keys, *c.args)
                    assert calls.transition(reply).applied, (name, reply)
                await callgrind_control(pid, "--instr=off")
                if name in ("retry", "pause", "release"):  # back to pending: their second run completes
                    done = await raw.drain(ROUND)
                    if done != ROUND:
                        raise RuntimeError(f"{name}: drained {done} of {ROUND} jobs")
            await callgrind_control(pid, "--instr=on")
            await count(name)
    finally:
        await raw.aclose()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--n", type=int, default=1000, help=f"calls per ending, a multiple of {ROUND} (default 1000)"
    )
    ap.add_argument("--ending", default=",".join(ENDINGS), help=f"comma-separated, of {', '.join(ENDINGS)}")
    ap.add_argument("--root", type=Path, default=HERE.parent, help="checkout whose scripts to drive")
    ap.add_argument("--keep", type=Path, help="directory to keep callgrind's dumps in (cg.<ending>)")
    a = ap.parse_args()
    endings = [e for e in a.ending.split(",") if e]
    if a.n < ROUND or a.n % ROUND:
        raise SystemExit(f"--n must be a multiple of {ROUND}")
    if not endings or any(e not in ENDINGS for e in endings):
        raise SystemExit(f"--ending takes some of {', '.join(ENDINGS)}, got {a.ending!r}")
    sys.path.insert(0, str(HERE))
    from redis_cost import callgrind_server, use_root

    use_root(a.root)
    with tempfile.TemporaryDirectory() as tmp:
        if a.keep is not None:
            a.keep.mkdir(parents=True, exist_ok=True)
        out = (a.keep.resolve() if a.keep is not None else Path(tmp)) / "cg"
        kept: dict[str, Path] = {}
        with callgrind_server(out) as (port, pid):
            got = asyncio.run(measure(port, pid, out, a.n, endings, kept))
        for name, dump in kept.items():
            dump.rename(f"{out}.{name}")
    print(
        f"{a.root}: Redis instructions per call (all; in EVALSHA): "
        + "; ".join(f"{e} {got[e]:,}; {got[e + ' evalsha']:,}" for e in endings)
    )


if __name__ == "__main__":
    main()
