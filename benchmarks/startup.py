"""A worker process's start-up: from spawning ``venturi worker`` to its first claim (issue 42).

usage: python benchmarks/startup.py [ROOT ...] [--runs 15] [--python PY]
                                    [--importtime] [--callgrind] [--floors]

For each checkout ROOT (default: this one; a base to compare with is made by
``git -C /work/main archive main | tar -x -C /tmp/base``), a fresh
redis-server holds one enqueued job, and ``venturi worker startup_app:worker``
is spawned as a user starts it: the ``venturi`` console script next to the
interpreter (``ROOT/.venv/bin/python`` when ROOT has a venv, else ``--python``,
else the one running this), with ``PYTHONPATH=ROOT`` so that ROOT's package is
the one imported (checked), its bytecode compiled first as an installed
package's is. Three figures per run:

- **first claim**: the time, read by the server itself (``MONITOR``), at which
  the worker's first claim script reached Redis (its ``EVALSHA``, or the
  ``EVAL`` of ``claim.lua``), minus the time just before the spawn: the
  interpreter, the imports, the worker's connections, server check and
  registration, and whatever it sends before its first claim;
- **CPU at the claim**: the worker's CPU time (all its threads,
  ``/proc/PID/task/*/schedstat``, nanoseconds) read the moment this process
  sees that claim in the ``MONITOR`` stream: a figure the machine's other load
  moves much less than the wall clock (it includes the few ms the worker runs
  between sending the claim and this read);
- **handler**: the wall clock the job's handler writes into Redis, minus the
  same start (the first claim plus the dispatch).

The checkouts alternate run by run (the machine's speed drifts); medians.
Two floors are timed the same way for scale (wall, and CPU from ``wait4``):
``python -c pass`` and ``python -c "import redis.asyncio, pydantic"`` (what
any worker on redis-py and pydantic imports before its first line).
``--importtime`` adds, per ROOT, one run under ``PYTHONPROFILEIMPORTTIME``:
the self time of every module the worker imported, summed by top-level
package (which packages a start-up spends its imports in; what a worker
imports after its first claim, until it is stopped, is in the sum too).
``--callgrind`` counts instructions instead, the figure this shared machine's
load cannot move: per ROOT, one spawn under ``valgrind --tool=callgrind``
(``PYTHONHASHSEED=0``) whose handler ends the process with ``os._exit(0)``
right after its stamp, so the count runs from exec to the first job's
handler (each run takes a minute or so).
``--floors`` takes the imports of a worker start apart instead, per ROOT:
one interpreter imports, in order, what any worker of ours imports before
its first line (``redis.asyncio``; ``pydantic``; ``pydantic.main`` and a
first model, which builds pydantic's schema machinery; ``anyio`` with its
asyncio backend, ``msgpack``, ``ulid``, ``hiredis``; ``typer``), then the
package (``venturi_redis.cli.worker``, ``venturi_redis._worker.worker``),
each step timed inside the process (medians of ``--runs``); with
``--callgrind``, the instructions from exec to the end of each step
(one process per step under valgrind, ``PYTHONHASHSEED=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

APP = """
import os, time
from typing import ClassVar
import redis
import venturi_redis as vr


class Hello(vr.Task):
    KIND: ClassVar[str] = "startup.hello"


class HelloJob(Hello, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        stamp = time.time()
        redis.Redis.from_url(os.environ["REDIS_URL"]).set("startup:handled", repr(stamp))
        if os.environ.get("STARTUP_EXIT"):  # --callgrind: the count stops here
            os._exit(0)
        return vr.Outcome.completed()


client = vr.Client.from_url(os.environ["REDIS_URL"])
worker = vr.Worker(client.queue("startup"), handle_signals=True)
worker.register(HelloJob)
"""

ENQUEUE = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
import startup_app  # noqa: F401 - its client and task
import venturi_redis as vr

async def main() -> None:
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as c:
        await c.queue("startup").enqueue(startup_app.Hello())

asyncio.run(main())
"""

# Which package a root's interpreter imports, and the SHA of its claim script.
PROBE = """
import venturi_redis
from venturi_redis._store.scripts import scripts
print(venturi_redis.__file__)
print(scripts()["claim"].sha)
"""


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in ns (0 when it is gone)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass
    except FileNotFoundError:
        return 0
    return total


class Root:
    """One checkout: its interpreter, its ``venturi`` script and its claim script's SHA."""

    def __init__(self, root: Path, python: Path, app_dir: Path) -> None:
        self.root = root.resolve()
        own = self.root / ".venv" / "bin" / "python"
        self.python = own if own.exists() else python
        self.venturi = self.python.parent / "venturi"
        # As installed: bytecode compiled once and cached (pip does it at install; this
        # environment sets PYTHONDONTWRITEBYTECODE, which made every run compile the
        # package's ~95 modules from source, ~0.3 s of a start-up).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env = {**env, "PYTHONPATH": f"{self.root}{os.pathsep}{app_dir}"}
        for tree in (self.root / "venturi_redis", app_dir):
            subprocess.run([self.python, "-m", "compileall", "-q", str(tree)], env=self.env, check=True)
        out = subprocess.run(
            [self.python, "-c", PROBE],
            env=self.env,
            cwd=self.root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if not out[0].startswith(str(self.root)):
            raise RuntimeError(f"{self.root}: its interpreter imports venturi_redis from {out[0]}")
        self.claim_sha = out[1]


class Run:
    """One spawn of the worker, watched by MONITOR."""

    claim_at: float | None = None
    claim_cpu: int | None = None

    def __init__(self, root: Root, server: RedisServer, app_dir: Path, importtime: bool) -> None:
        self.root = root
        self.url = server.url
        self.app_dir = app_dir
        self.importtime = importtime
        self.pid = 0
        self.ready = threading.Event()
        self.seen = threading.Event()

    def is_claim(self, command: str) -> bool:
        return command.startswith(f"EVALSHA {self.root.claim_sha} ") or command.startswith("EVAL -- claim:")

    def monitor(self) -> None:
        try:
            with redis.Redis.from_url(self.url).monitor() as m:
                self.ready.set()
                for cmd in m.listen():
                    if self.pid and self.claim_at is None and self.is_claim(cmd["command"]):
                        self.claim_cpu = cpu_ns(self.pid)
                        self.claim_at = float(cmd["time"])
                        self.seen.set()
                        return
        except (redis.RedisError, OSError, ValueError):
            self.ready.set()

    def run(self) -> tuple[float, float, float, str]:
        env = {**self.root.env, "REDIS_URL": self.url}
        subprocess.run([self.root.python, "-c", ENQUEUE, str(self.app_dir)], env=env, check=True)
        if self.importtime:
            env["PYTHONPROFILEIMPORTTIME"] = "1"
        threading.Thread(target=self.monitor, daemon=True).start()
        self.ready.wait(10)
        r = redis.Redis.from_url(self.url)
        start = time.time()
        proc = subprocess.Popen(
            [self.root.venturi, "worker", "startup_app:worker"],
            env=env,
            cwd=self.root.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if self.importtime else subprocess.DEVNULL,
            text=True,
        )
        self.pid = proc.pid
        try:
            deadline = time.monotonic() + 60
            while (stamp := r.get("startup:handled")) is None or not self.seen.is_set():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{self.root.root}: no claim or no job run (exit {proc.poll()})")
                time.sleep(0.005)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert self.claim_at is not None
        assert self.claim_cpu is not None
        return self.claim_at - start, self.claim_cpu / 1e9, float(stamp) - start, err or ""


def one_run(root: Root, app_dir: Path, importtime: bool = False) -> tuple[float, float, float, str]:
    with RedisServer() as server:
        return Run(root, server, app_dir, importtime).run()


def instructions(root: Root, app_dir: Path) -> int:
    """Instructions from exec to the first job's handler, the worker under callgrind."""
    with RedisServer() as server:
        env = {**root.env, "REDIS_URL": server.url, "STARTUP_EXIT": "1"}
        subprocess.run([root.python, "-c", ENQUEUE, str(app_dir)], env=env, check=True)
        n = count_instructions(root, [root.python, root.venturi, "worker", "startup_app:worker"], env)
        if redis.Redis.from_url(server.url).get("startup:handled") is None:
            raise RuntimeError(f"{root.root}: the worker ended without running the job")
        return n


# --floors: what a worker start imports, step by step, third-party first.
FLOOR_STEPS = [
    ("python -c pass", "pass"),
    ("redis.asyncio", "import redis.asyncio"),
    ("pydantic", "import pydantic"),
    (
        "pydantic.main, a first model",
        "import pydantic.main, pydantic.type_adapter\nclass _M(pydantic.BaseModel):\n    a: int",
    ),
    (
        "anyio (asyncio backend), msgpack, ulid, hiredis, zoneinfo",
        "import anyio, anyio.abc, anyio.lowlevel, anyio.from_thread, anyio._backends._asyncio, "
        "msgpack, ulid, hiredis, zoneinfo",
    ),
    ("typer (the CLI)", "import typer"),
    (
        "venturi_redis (cli.worker, _worker.worker)",
        "import venturi_redis.cli.worker, venturi_redis._worker.worker",
    ),
]
_STEP_TIMES = """
import json, sys, time
marks = [time.perf_counter()]
for code in json.loads(sys.argv[1]):
    exec(code, {})
    marks.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(marks, marks[1:])]))
"""


def import_steps(root: Root, runs: int, callgrind: bool) -> None:
    """Each step of FLOOR_STEPS: its own time (median of ``runs``), and with
    ``callgrind`` the instructions from exec to its end."""
    codes = [code for _, code in FLOOR_STEPS[1:]]
    steps: list[list[float]] = [[] for _ in codes]
    passes = []
    for _ in range(runs):
        passes.append(floor(root.python, "pass")[0])
        out = subprocess.run(
            [root.python, "-c", _STEP_TIMES, json.dumps(codes)],
            env=root.env,
            cwd=root.root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for got, t in zip(steps, json.loads(out), strict=True):
            got.append(t)
    counts: list[int | None] = [None] * len(FLOOR_STEPS)
    if callgrind:
        for i in range(len(FLOOR_STEPS)):
            code = "\n".join(c for _, c in FLOOR_STEPS[: i + 1])
            counts[i] = count_instructions(root, [root.python, "-c", code], root.env)
    print(f"{root.root} ({root.python}): the imports of a worker start, step by step")
    for i, (name, _) in enumerate(FLOOR_STEPS):
        t = statistics.median(passes) if i == 0 else statistics.median(steps[i - 1])
        what = "wall, spawn to exit" if i == 0 else "in-process"
        ins = f"  {counts[i]:>15,} instructions to here" if counts[i] is not None else ""
        print(f"  {t * 1000:7.1f} ms ({what})  {name}{ins}", flush=True)


def count_instructions(root: Root, argv: list[str | Path], env: dict[str, str]) -> int:
    """Instructions of one process under callgrind."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
            env={**env, "PYTHONHASHSEED": "0"},
            cwd=root.root,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=900,
        )
        m = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.M)
        assert m, "no totals in the callgrind output"
        return int(m.group(1))


def floor(python: Path, code: str) -> tuple[float, float]:
    start = time.monotonic()
    proc = subprocess.Popen([python, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, code
    return wall, usage.ru_utime + usage.ru_stime


_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def import_summary(stderr: str, top: int = 14) -> str:
    """Self time by top-level package of the imports a run's stderr lists."""
    by_package: dict[str, int] = defaultdict(int)
    total = 0
    for line in stderr.splitlines():
        m = _IMPORT_LINE.match(line)
        if m is None:
            continue
        own, name = int(m.group(1)), m.group(4)
        package = name.split(".")[0]
        if package == "venturi_redis":
            package = ".".join(name.split(".")[:2])
        by_package[package] += own
        total += own
    rows = sorted(by_package.items(), key=lambda kv: -kv[1])
    lines = [f"  imports, self time summed: {total / 1000:.0f} ms over {len(by_package)} packages"]
    lines += [f"  {ms / 1000:7.1f} ms  {name}" for name, ms in rows[:top]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="*", type=Path, default=[ROOT])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--python", type=Path, default=Path(sys.executable))
    ap.add_argument("--importtime", action="store_true", help="one more run per ROOT, imports attributed")
    ap.add_argument("--callgrind", action="store_true", help="instructions, exec to the first handler")
    ap.add_argument("--floors", action="store_true", help="the imports of a worker start, step by step")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app_dir = Path(tmp)
        (app_dir / "startup_app.py").write_text(APP)
        roots = [Root(r, a.python, app_dir) for r in a.roots]
        if a.floors:
            for root in roots:
                import_steps(root, a.runs, a.callgrind)
            return
        if a.callgrind:
            for root in roots:
                n = instructions(root, app_dir)
                print(f"{root.root}: {n:,} instructions, exec to the first job's handler", flush=True)
            return
        for root in roots:  # a first run writes the bytecode caches: not timed
            one_run(root, app_dir)
        results: dict[str, dict[str, list[float]]] = {
            str(r.root): {"first claim": [], "CPU at the claim": [], "handler": []} for r in roots
        }
        floor_code = {
            "python -c pass": "pass",
            "import redis.asyncio, pydantic": "import redis.asyncio, pydantic",
        }
        floors: dict[str, list[tuple[float, float]]] = {name: [] for name in floor_code}
        for _ in range(a.runs):
            for name, code in floor_code.items():
                floors[name].append(floor(roots[0].python, code))
            for root in roots:
                claim, cpu, handled, _ = one_run(root, app_dir)
                got = results[str(root.root)]
                got["first claim"].append(claim)
                got["CPU at the claim"].append(cpu)
                got["handler"].append(handled)
        summaries: dict[str, str] = {}
        if a.importtime:
            for root in roots:
                summaries[str(root.root)] = import_summary(one_run(root, app_dir, importtime=True)[3])

    def ms(xs: list[float]) -> str:
        runs = ", ".join(f"{x * 1000:.0f}" for x in xs)
        return f"median {statistics.median(xs) * 1000:.0f} ms (runs: {runs})"

    for name, pairs in floors.items():
        print(f"{name}: wall {ms([w for w, _ in pairs])}")
        print(f"{' ' * len(name)}  CPU {ms([c for _, c in pairs])}")
    for name, figures in results.items():
        print(name)
        for figure, xs in figures.items():
            print(f"  {figure}: {ms(xs)}")
        if name in summaries:
            print(summaries[name])


if __name__ == "__main__":
    main()
