"""A bulk enqueue's preparation with encryption: ``prepare_many`` of 100 1 KiB tasks, on minus off.

Usage (from the repository root; no Redis: the client's CPU-bound half alone)::

    .venv/bin/python benchmarks/seal_bulk.py [--base /tmp/base] [--pairs 5]
    .venv/bin/python benchmarks/seal_bulk.py --instructions [--base /tmp/base]   # needs valgrind

Each tree (this one, and ``--base``, an export of another commit) runs in a
process of its own, the trees alternating, ``--pairs`` times. In it, rounds
of 200 ``prepare_many`` calls alternate encryption off and on, and it prints
the medians over 21 rounds of the CPU per job (``getrusage``: user and
system apart) with encryption on, and on minus off: what encryption costs a
bulk job before anything is sent. ``--instructions`` counts user-space
instructions per job instead (callgrind, 10 then 110 calls, on and off):
steady, but blind to system calls, so the system CPU is the clock's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
CALL = 100  # tasks per prepare_many call, as encryption.py's W1 bulk


def child(mode: str, calls: int) -> None:
    from typing import ClassVar

    import venturi_redis as vr
    from venturi_redis._store.prepare import prepare_many

    class Blob(vr.Task):
        KIND: ClassVar[str] = "bench.blob"
        i: int
        data: str

    data = ("0123456789abcdef" * 64)[: 1024 - 20]
    tasks = [Blob(i=i, data=data) for i in range(CALL)]
    enc = vr.Encryption(keys=[bytes(range(32))])
    if mode == "count-on" or mode == "count-off":
        e = enc if mode == "count-on" else None
        for _ in range(calls):
            prepare_many(tasks, 1 << 20, e)
        return

    def run(e: vr.Encryption | None) -> tuple[float, float]:
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(200):
            prepare_many(tasks, 1 << 20, e)
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        n = 200 * CALL
        return (t1.ru_utime - t0.ru_utime) / n * 1e6, (t1.ru_stime - t0.ru_stime) / n * 1e6

    for _ in range(100):
        prepare_many(tasks, 1 << 20, enc)
        prepare_many(tasks, 1 << 20, None)
    diff, user, system = [], [], []
    for r in range(21):
        if r % 2:
            off, on = run(None), run(enc)
        else:
            on, off = run(enc), run(None)
        diff.append(sum(on) - sum(off))
        user.append(on[0])
        system.append(on[1])
    m = statistics.median
    print(f"{m(diff):.3f} {m(user):.3f} {m(system):.3f}")


def spawn(tree: Path, *args: str, valgrind: bool = False) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(HERE), "--child", *args]
    if not valgrind:
        return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        subprocess.run([*vg, *cmd], env=env, check=True, capture_output=True)
        m = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.M)
        assert m, "no totals in the callgrind output"
        return m.group(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--base", type=Path, help="another tree (e.g. git archive of main) to run beside this one"
    )
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]))
        return
    trees = {"this": HERE.parent.parent, **({"base": a.base.resolve()} if a.base else {})}
    if a.instructions:
        for name, tree in trees.items():
            per = {}
            for mode in ("off", "on"):
                lo, hi = (int(spawn(tree, f"count-{mode}", str(n), valgrind=True)) for n in (10, 110))
                per[mode] = (hi - lo) / (100 * CALL)
            print(
                f"{name}: off {per['off']:,.0f}, on {per['on']:,.0f} instructions a job, "
                f"on - off {per['on'] - per['off']:+,.0f}",
                flush=True,
            )
        return
    got: dict[str, list[list[float]]] = {name: [] for name in trees}
    for p in range(a.pairs):
        for name in trees if p % 2 == 0 else reversed(list(trees)):
            got[name].append([float(x) for x in spawn(trees[name], "time", "0").split()])
            print(f"pair {p + 1} {name}: on - off {got[name][-1][0]:.3f} us a job", flush=True)
    for name, runs in got.items():
        diff, user, system = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{name}: on - off {diff:.2f} us a job; on: user {user:.2f}, system {system:.2f} us a job")


if __name__ == "__main__":
    main()
