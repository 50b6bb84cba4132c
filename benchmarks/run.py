"""venturi_redis benchmarks, side by side with the peers, in one run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/run.py                 # everything, 10,000 jobs, median of 3
    .venv/bin/python benchmarks/run.py --quick         # 2,000 jobs, 1 run: a smoke test
    .venv/bin/python benchmarks/run.py --only venturi,arq --workloads W1,W2
    .venv/bin/python benchmarks/run.py --workloads W5 --w5-sizes 10000,100000,1000000

The runner starts its own redis-server on a free port (never the machine's
6379), installs each peer into its own virtualenv under ``benchmarks/.venvs/``
(never a project dependency), runs every workload as separate producer and
worker processes, prints markdown tables and writes JSON to
``benchmarks/results/``. ``--write-readme`` replaces the results section of
``benchmarks/README.md`` with the tables just measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RedisServer, version_of  # noqa: E402

VENVS = HERE / ".venvs"
RESULTS = HERE / "results"
PEERS_DIR = HERE / "peers"
# venturi's own interpreter: .venv, or VENTURI_BENCH_PYTHON (e.g. .venv-oldest/bin/python
# to measure the package on the oldest redis-py it supports: docs/operations.md).
PROJECT_PY = Path(os.environ.get("VENTURI_BENCH_PYTHON") or ROOT / ".venv" / "bin" / "python")

COUNT, START, END, LAT = "bench:count", "bench:start", "bench:end", "bench:lat"


@dataclass
class Lib:
    name: str
    packages: list[str]  # pip requirements for its own venv; [] = the project venv
    dist: str  # distribution whose version is reported
    is_async: bool
    note: str = ""
    python: Path = field(default=PROJECT_PY)


LIBS: dict[str, Lib] = {
    lib.name: lib
    for lib in [
        Lib("venturi", [], "venturi-redis", True),
        Lib("arq", ["arq", "hiredis"], "arq", True),
        Lib("saq", ["saq[hiredis]", "typing_extensions"], "saq", True),
        Lib("taskiq", ["taskiq", "taskiq-redis", "hiredis"], "taskiq", True),
        Lib("streaq", ["streaq", "redis", "hiredis"], "streaq", True),
        Lib("bullmq", ["bullmq", "hiredis"], "bullmq", True),
        Lib("rq", ["rq", "hiredis"], "rq", False),
        Lib("dramatiq", ["dramatiq[redis]", "hiredis"], "dramatiq", False),
        Lib("huey", ["huey", "redis", "hiredis"], "huey", False),
        Lib("celery", ["celery[redis]", "hiredis"], "celery", False),
    ]
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- virtualenvs ------------------------------------------------------------------


def setup_lib(lib: Lib) -> str | None:
    """Make sure the library's venv exists; returns an error text or None."""
    if not lib.packages:
        lib.python = PROJECT_PY
        return None
    venv = VENVS / lib.name
    py = venv / "bin" / "python"
    stamp = venv / ".bench-installed"
    want = " ".join(lib.packages)
    if not (stamp.exists() and stamp.read_text() == want):
        log(f"installing {want} into {venv}")
        VENVS.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if out.returncode:
            return f"venv creation failed: {out.stderr.strip()[-500:]}"
        out = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *lib.packages], capture_output=True, text=True
        )
        if out.returncode:
            return f"pip install {want} failed: {out.stderr.strip()[-800:]}"
        stamp.write_text(want)
    lib.python = py
    return None


def lib_version(lib: Lib) -> str:
    out = subprocess.run(
        [str(lib.python), "-c", f"import importlib.metadata as m; print(m.version({lib.dist!r}))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "?"


# -- processes ----------------------------------------------------------------------


class AdapterError(RuntimeError):
    pass


class DrainTimeout(AdapterError):
    pass


class Unsupported(AdapterError):
    pass


def adapter_cmd(lib: Lib, action: str, url: str, **opts: Any) -> list[str]:
    cmd = [str(lib.python), str(PEERS_DIR / f"{lib.name}_bench.py"), action, "--url", url]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def run_adapter(lib: Lib, action: str, url: str, timeout: float, **opts: Any) -> dict[str, Any]:
    cmd = adapter_cmd(lib, action, url, **opts)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(PEERS_DIR))
    except subprocess.TimeoutExpired as exc:
        raise AdapterError(f"{lib.name} {action} timed out after {timeout:.0f}s") from exc
    if out.returncode:
        raise AdapterError(f"{lib.name} {action} exited {out.returncode}: {out.stderr.strip()[-1500:]}")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            res: dict[str, Any] = json.loads(line[7:])
            return res
    return {}


class Worker:
    """An adapter worker process in its own process group (so it can be stopped whole)."""

    def __init__(self, lib: Lib, url: str, logname: str, **opts: Any) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.logpath = RESULTS / "logs" / logname
        self.logpath.parent.mkdir(parents=True, exist_ok=True)
        self.logfile = self.logpath.open("w")
        self.proc = subprocess.Popen(
            adapter_cmd(lib, "worker", url, **opts),
            stdout=self.logfile,
            stderr=subprocess.STDOUT,
            cwd=str(PEERS_DIR),
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        self.logfile.flush()
        return self.logpath.read_text()[-1500:]

    def stop(self) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        # Children (prefork pools) may outlive a leader that exited by itself.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.logfile.close()


def wait_key(r: redis.Redis, key: str, timeout: float, worker: Worker | None = None) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        v = r.get(key)
        if v is not None:
            return v
        if worker is not None and not worker.alive():
            for line in worker.tail().splitlines():
                if line.startswith("RESULT ") and "unsupported" in line:
                    raise Unsupported(json.loads(line[7:])["unsupported"])
            raise AdapterError(f"worker exited early: {worker.tail()}")
        if time.monotonic() > deadline:
            got = r.get(COUNT)
            raise DrainTimeout(f"timed out after {timeout:.0f}s waiting for {key} (count={got!r})")
        time.sleep(0.005)


# -- workloads W1..W3 (every library) ----------------------------------------------------


def nth(cfg: argparse.Namespace, run: int) -> int:
    """A run's number in the log: its round's, when the runner runs one per round."""
    return run + 1 + int(getattr(cfg, "round", 0))


def w1(lib: Lib, url: str, r: redis.Redis, cfg: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    modes = ["single", "concurrent", "bulk"] if lib.is_async else ["single", "bulk"]
    if lib.name == "venturi":
        modes.append("blocking")  # vr.SyncClient's single enqueue, beside the synchronous peers
    for mode in modes:
        rates: list[float] = []
        # venturi's single enqueue is compared with a bare EVALSHA round trip (the
        # targets table). The adapter times that reference in its own process right
        # beside its enqueue loop, after it in odd runs and before it in even ones:
        # the machine's speed drifts too much over minutes to take it from W8.
        paired = lib.name == "venturi" and mode == "single"
        bare_rates: list[float] = []
        bare_first: list[bool] = []
        for run in range(cfg.runs):
            r.flushall()
            opts: dict[str, Any] = {"n": cfg.n, "mode": mode, "bulk_size": cfg.bulk_size}
            if paired:
                opts["bare_evalsha"] = "before" if (run + getattr(cfg, "round", 0)) % 2 else "after"
            res = run_adapter(lib, "enqueue", url, cfg.timeout, **opts)
            if "unsupported" in res:
                out[mode] = {"unsupported": res["unsupported"]}
                break
            rates.append(res["n"] / res["seconds"])
            if paired:
                bare_rates.append(res["n"] / res["bare_evalsha_seconds"])
                bare_first.append(res["bare"] == "before")
                log(
                    f"  {lib.name} W1 {mode} run {nth(cfg, run)}: {rates[-1]:,.0f} jobs/s; bare EVALSHA "
                    f"{bare_rates[-1]:,.0f}/s {'before' if bare_first[-1] else 'after'} it "
                    f"({bare_rates[-1] / rates[-1]:.2f}x)"
                )
            else:
                log(f"  {lib.name} W1 {mode} run {nth(cfg, run)}: {rates[-1]:,.0f} jobs/s")
        else:
            out[mode] = {"median": statistics.median(rates), "runs": rates}
            if bare_rates:
                ratios = [b / v for b, v in zip(bare_rates, rates, strict=True)]
                out[f"{mode}_bare_evalsha"] = {
                    "median": statistics.median(bare_rates),
                    "runs": bare_rates,
                    "bare_first": bare_first,
                }
                out[f"{mode}_paired_ratios"] = {"median": statistics.median(ratios), "runs": ratios}
    if not lib.is_async:
        out["concurrent"] = {"unsupported": "synchronous library"}
    return out


def drain_once(
    lib: Lib, url: str, r: redis.Redis, cfg: argparse.Namespace, conc: int, logname: str, **opts: Any
) -> float:
    """One W2 run: fill ``cfg.n`` jobs (untimed), start a worker, jobs/s from its start to END."""
    r.flushall()
    run_adapter(lib, "fill", url, cfg.timeout, n=cfg.n, bulk_size=cfg.bulk_size)
    r.config_resetstat()  # the fill is not part of what the caller reads from commandstats
    w = Worker(lib, url, logname, n=cfg.n, concurrency=conc, **opts)
    try:
        end = float(wait_key(r, END, cfg.drain_timeout, w))
        return cfg.n / (end - float(r.get(START) or 0))
    finally:
        w.stop()


def w2(lib: Lib, url: str, r: redis.Redis, cfg: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for conc in cfg.concurrency:
        if conc in getattr(cfg, "w2_skip", {}).get(lib.name, ()):
            continue  # failed or timed out in an earlier round: not run again
        rates: list[float] = []
        # venturi's drain against its W8 ceiling (the targets table): the
        # ceiling is measured right after each drain, at the same speed of the
        # machine, as W1 single's bare EVALSHA is.
        ceilings: list[float] = []
        err = None
        for run in range(cfg.runs):
            try:
                rates.append(drain_once(lib, url, r, cfg, conc, f"{lib.name}-w2-c{conc}-{run}.log"))
                if lib.name == "venturi":
                    import venturi_only

                    ceilings.append(asyncio.run(venturi_only.ceiling_once(url, r, cfg.n)))
                    log(
                        f"  {lib.name} W2 c={conc} run {nth(cfg, run)}: {rates[-1]:,.0f} jobs/s; W8 ceiling "
                        f"right after it {ceilings[-1]:,.0f}/s ({rates[-1] / ceilings[-1]:.0%})"
                    )
                else:
                    log(f"  {lib.name} W2 c={conc} run {nth(cfg, run)}: {rates[-1]:,.0f} jobs/s")
            except DrainTimeout:
                start = float(r.get(START) or time.time())
                done = int(r.get(COUNT) or 0)
                slow = done / (time.time() - start)
                err = (
                    f"only {done:,} of {cfg.n:,} jobs done after {cfg.drain_timeout:.0f} s "
                    f"(about {slow:,.0f} jobs/s); stopped"
                )
                log(f"  {lib.name} W2 c={conc}: {err}")
                break
            except Unsupported as exc:
                out[str(conc)] = {"unsupported": str(exc)}
                break
            except AdapterError as exc:
                err = str(exc)
                log(f"  {lib.name} W2 c={conc}: {err[:300]}")
                break
        if str(conc) not in out:
            out[str(conc)] = {"median": statistics.median(rates), "runs": rates} if rates else {"error": err}
        if ceilings:
            ratios = [d / c for d, c in zip(rates, ceilings, strict=False)]
            out[f"{conc}_paired_ceiling"] = {"median": statistics.median(ceilings), "runs": ceilings}
            out[f"{conc}_paired_ratios"] = {"median": statistics.median(ratios), "runs": ratios}
    ok = {k: v["median"] for k, v in out.items() if k.isdigit() and "median" in v}
    if ok:
        best = max(ok, key=lambda k: ok[k])
        out["best"] = {"concurrency": int(best), "median": ok[best]}
    return out


def w3(lib: Lib, url: str, r: redis.Redis, cfg: argparse.Namespace) -> dict[str, Any]:
    p50s: list[float] = []
    p99s: list[float] = []
    conc = cfg.lat_concurrency
    run = 0
    while run < cfg.runs:
        r.flushall()
        w = Worker(lib, url, f"{lib.name}-w3-{run}.log", n=cfg.lat_n, concurrency=conc)
        try:
            wait_key(r, START, 60, w)
            time.sleep(1.0)  # let the worker reach its idle wait
            if not w.alive():
                wait_key(r, "bench:never", 0, w)  # raises with the reason it stopped
            run_adapter(lib, "latency", url, cfg.timeout, n=cfg.lat_n, rate=cfg.rate)
            wait_key(r, END, cfg.drain_timeout, w)
        except Unsupported:
            if conc == 1:
                raise
            conc = 1  # a library with a single execution slot (rq)
            continue
        except AdapterError as exc:
            log(f"  {lib.name} W3: {str(exc)[:300]}")
            return {"error": str(exc)}
        finally:
            w.stop()
        lat = sorted(float(x) * 1000 for x in r.lrange(LAT, 0, -1))
        p50s.append(percentile(lat, 50))
        p99s.append(percentile(lat, 99))
        log(
            f"  {lib.name} W3 run {nth(cfg, run)}: p50 {p50s[-1]:.2f} ms, p99 {p99s[-1]:.2f} ms "
            f"({len(lat)} jobs)"
        )
        run += 1
    return {
        "p50": statistics.median(p50s),
        "p99": statistics.median(p99s),
        "runs": {"p50": p50s, "p99": p99s},
        "concurrency": conc,
    }


def percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * pct / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# -- tables -------------------------------------------------------------------------------


def fmt_rate(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    if "median" in cell:
        return f"{cell['median']:,.0f}"
    if "unsupported" in cell:
        return "n/a"
    return "error"


def peer_table(results: dict[str, Any], cfg: argparse.Namespace) -> str:
    concs = [str(c) for c in cfg.concurrency]
    head = (
        ["library", "version", "W1 single", "W1 concurrent", "W1 bulk"]
        + [f"W2 c={c}" for c in concs]
        + ["W2 best", "W3 p50 ms", "W3 p99 ms"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, res in results.items():
        if "skipped" in res:
            lines.append(f"| {name} | - | " + " | ".join(["skipped"] * (len(head) - 2)) + " |")
            continue
        row = [name, res.get("version", "?")]
        W1 = res.get("W1", {})
        row += [fmt_rate(W1.get(m)) for m in ("single", "concurrent", "bulk")]
        W2 = res.get("W2", {})
        row += [fmt_rate(W2.get(c)) for c in concs]
        best = W2.get("best")
        row.append(f"{best['median']:,.0f} (c={best['concurrency']})" if best else "-")
        W3 = res.get("W3", {})
        if "p50" in W3:
            row += [f"{W3['p50']:.2f}", f"{W3['p99']:.2f}"]
        else:
            row += ["error" if W3 else "-"] * 2
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def paired_lines(results: dict[str, Any]) -> str:
    """Under the W1-W3 table: the bare EVALSHA rate measured beside each W1 single run,
    and venturi's blocking producer (``vr.SyncClient``) beside the synchronous peers."""
    lines = []
    blocking = ((results.get("venturi") or {}).get("W1") or {}).get("blocking") or {}
    if "median" in blocking:
        sync_peers = [
            f"{name} {res['W1']['single']['median']:,.0f}"
            for name, res in results.items()
            if name in LIBS
            and not LIBS[name].is_async
            and "median" in ((res.get("W1") or {}).get("single") or {})
        ]
        lines.append(
            f"- venturi W1 single through `vr.SyncClient` (a blocking producer: Django, Flask, scripts): "
            f"{blocking['median']:,.0f} jobs/s"
            + (f"; the synchronous peers' single enqueue: {', '.join(sync_peers)}" if sync_peers else "")
        )
    for name, res in results.items():
        W1 = res.get("W1") or {}
        bare, ratios = W1.get("single_bare_evalsha"), W1.get("single_paired_ratios")
        if not (bare and ratios and "median" in (W1.get("single") or {})):
            continue
        runs = ", ".join(f"{x:.2f}" for x in ratios["runs"])
        lines.append(
            f"- {name} W1 single {W1['single']['median']:,.0f} jobs/s; a bare redis-py EVALSHA "
            f"`return 1` round trip timed beside it in the same producer process (order alternating): "
            f"{bare['median']:,.0f}/s, {ratios['median']:.2f}x (runs: {runs})"
        )
    return "\n".join(lines)


def brief(text: str) -> str:
    """The gist of an error: its last line (a traceback's exception), shortened."""
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    gist = lines[-1] if lines else ""
    if len(lines) > 1 and not lines[0].startswith("Traceback"):
        gist = f"{lines[0][:120]} … {gist}"
    return gist[:300]


def notes_table(results: dict[str, Any]) -> str:
    lines = []
    for name, res in results.items():
        if "skipped" in res:
            lines.append(f"- **{name}**: not measured: {res['skipped']}")
        for w in ("W1", "W2", "W3"):
            for key, cell in (res.get(w) or {}).items():
                if isinstance(cell, dict) and ("error" in cell or "unsupported" in cell):
                    why = cell.get("error") or cell.get("unsupported")
                    lines.append(
                        f"- {name} {w} c={key}: {brief(why)}"
                        if key.isdigit()
                        else f"- {name} {w} {key}: {brief(why)}"
                    )
            cell = res.get(w) or {}
            if "error" in cell and isinstance(cell["error"], str):
                lines.append(f"- {name} {w}: {brief(cell['error'])}")
    return "\n".join(lines)


def machine_line(server_version: str) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"The machine has {os.cpu_count()} cores ({platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, {server_version.split(' sha=')[0]}; "
        f"load average {load} when this table was printed)."
    )


# -- main ------------------------------------------------------------------------------------


def merge_rounds(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One library's results of one workload, a dict per round, as one: every run kept, medians over them.

    A figure that has runs in some round keeps them; one that has none (an API
    the library lacks, an error, a timeout) keeps the first round's reason.
    """
    out: dict[str, Any] = {}
    for part in parts:
        for key, val in part.items():
            if key == "runs" and isinstance(val, dict):  # W3: {"p50": [...], "p99": [...]}
                runs = out.setdefault("runs", {})
                for q, values in val.items():
                    runs.setdefault(q, []).extend(values)
            elif isinstance(val, dict) and isinstance(val.get("runs"), list):
                slot = out.get(key)
                if not isinstance(slot, dict) or "runs" not in slot:
                    slot = out[key] = {**val, "runs": []}
                    slot.pop("bare_first", None)
                slot["runs"].extend(val["runs"])
                if "bare_first" in val:
                    slot.setdefault("bare_first", []).extend(val["bare_first"])
                slot["median"] = statistics.median(slot["runs"])
            elif key not in out and key != "best":
                out[key] = val
    if isinstance(out.get("runs"), dict):
        for q in ("p50", "p99"):
            out[q] = statistics.median(out["runs"][q])
    ok = {k: v["median"] for k, v in out.items() if k.isdigit() and isinstance(v, dict) and "median" in v}
    if ok:
        best = max(ok, key=lambda k: ok[k])
        out["best"] = {"concurrency": int(best), "median": ok[best]}
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2,000 jobs, 1 run, 200 latency jobs")
    p.add_argument("--only", default="", help="comma-separated libraries (default: all)")
    p.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6,W7,W8")
    p.add_argument("--n", type=int, default=10_000, help="jobs per W1/W2 run")
    p.add_argument("--runs", type=int, default=3, help="runs per figure (the median is reported)")
    p.add_argument("--concurrency", default="1,10,100", help="W2 worker concurrency settings")
    p.add_argument("--bulk-size", type=int, default=1000, help="jobs per bulk enqueue call")
    p.add_argument("--lat-n", type=int, default=1000, help="W3 jobs")
    p.add_argument("--rate", type=float, default=200.0, help="W3 enqueue rate (jobs/s)")
    p.add_argument("--lat-concurrency", type=int, default=10, help="W3 worker concurrency")
    p.add_argument("--w5-sizes", default="10000,100000,1000000", help="W5 pending-set sizes")
    p.add_argument(
        "--w5-rounds", type=int, default=7, help="W5 rounds (each measures every size; ratios within a round)"
    )
    p.add_argument("--idle-seconds", type=float, default=30.0, help="W7 idle window")
    p.add_argument("--timeout", type=float, default=600.0, help="per-process timeout (s)")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="W2/W3 give-up time per run (s)")
    p.add_argument("--write-readme", action="store_true", help="put the tables into benchmarks/README.md")
    p.add_argument(
        "--readme-section",
        default="results",
        help="README block to replace (<!-- NAME:begin --> ... <!-- NAME:end -->), for partial runs",
    )
    cfg = p.parse_args()
    if cfg.quick:
        cfg.n, cfg.runs, cfg.lat_n = 2000, 1, 200
        cfg.w5_sizes = "2000,20000"
        cfg.w5_rounds = 2
        cfg.idle_seconds = 10.0
    cfg.concurrency = [int(x) for x in cfg.concurrency.split(",")]
    cfg.w5_sizes = [int(x) for x in cfg.w5_sizes.split(",")]
    cfg.workloads = [w.strip().upper() for w in cfg.workloads.split(",") if w.strip()]
    only = [x.strip() for x in cfg.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in LIBS]
    if unknown:
        p.error(f"unknown libraries {unknown}; known: {', '.join(LIBS)}")
    cfg.libs = only or list(LIBS)
    return cfg


def main() -> None:
    cfg = parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    server_version = version_of()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report: dict[str, Any] = {
        "when": stamp,
        "command": " ".join(["benchmarks/run.py", *sys.argv[1:]]),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "redis": server_version},
        "config": {k: v for k, v in vars(cfg).items() if k not in ("write_readme", "readme_section")},
        "venturi_commit": git_state(),
        "libraries": {},
    }
    sections: list[str] = []
    with RedisServer() as server:
        url = server.url
        r = redis.Redis.from_url(url)
        peer_workloads = [w for w in cfg.workloads if w in ("W1", "W2", "W3")]
        if peer_workloads:
            libs: list[Lib] = []
            for name in cfg.libs:
                lib = LIBS[name]
                err = setup_lib(lib)
                if err:
                    log(f"{name}: {err}")
                    report["libraries"][name] = {"skipped": err}
                    continue
                libs.append(lib)
                report["libraries"][name] = {"version": lib_version(lib), "load_before": os.getloadavg()}
            # Rounds: run 1 of every library, then run 2 of every library, ... The
            # machine's speed drifts by half within the half hour a run takes; in
            # rounds, each library's median is taken over three slots spread across
            # it, instead of one library measured in a fast stretch, another in a
            # slow one. Within a round, workload by workload (every library's W1,
            # then every library's W2, then W3), the order of the libraries
            # reversed in odd rounds: two libraries' W1 are seconds apart, not the
            # minutes of every W2 and W3 between them.
            one = argparse.Namespace(**vars(cfg))
            one.runs, one.w2_skip = 1, {}
            parts: dict[str, dict[str, list[dict[str, Any]]]] = {lib.name: {} for lib in libs}
            for rnd in range(cfg.runs):
                one.round = rnd
                order = libs if rnd % 2 == 0 else libs[::-1]
                for w, fn in (("W1", w1), ("W2", w2), ("W3", w3)):
                    if w not in peer_workloads:
                        continue
                    log(f"{w} (round {rnd + 1} of {cfg.runs})")
                    for lib in order:
                        res = report["libraries"][lib.name]
                        if "error" in res.get(w, {}):
                            continue
                        try:
                            part = fn(lib, url, r, one)
                        except AdapterError as exc:
                            log(f"  {lib.name} {w}: {str(exc)[:500]}")
                            res[w] = {"error": str(exc)}
                            continue
                        if w == "W2":
                            failed = {int(c) for c, v in part.items() if c.isdigit() and "median" not in v}
                            one.w2_skip.setdefault(lib.name, set()).update(failed)
                        parts[lib.name].setdefault(w, []).append(part)
                        res[w] = merge_rounds(parts[lib.name][w])
                        res["load_after"] = os.getloadavg()
                        save(report, stamp)
            table = peer_table(report["libraries"], cfg)
            paired = paired_lines(report["libraries"])
            notes = notes_table(report["libraries"])
            sections.append(
                f"### W1-W3: every library ({cfg.n:,} jobs, median of {cfg.runs}; jobs/s unless ms)\n\n"
                f"{machine_line(server_version)}\n\n{table}\n"
                + (f"\n{paired}\n" if paired else "")
                + (f"\n{notes}\n" if notes else "")
            )
        venturi_workloads = [w for w in cfg.workloads if w in ("W4", "W5", "W6", "W7", "W8")]
        if venturi_workloads and "venturi" in cfg.libs:
            import venturi_only

            extra = asyncio.run(venturi_only.run_all(url, r, cfg, venturi_workloads, log))
            report["venturi_only"] = extra
            sections.append(venturi_only.tables(extra, cfg, machine_line(server_version)))
        r.flushall()
        r.close()
    if "venturi" in report["libraries"] or "venturi_only" in report:
        sections.append(targets_section(report))
    text = "\n".join(sections)
    report["markdown"] = text
    save(report, stamp)
    print(text)
    if cfg.write_readme:
        write_readme(text, report["command"], cfg.readme_section)


def git_state() -> str:
    """The commit measured, and whether the package or its scripts had local changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "venturi_redis", "lua"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def save(report: dict[str, Any], stamp: str) -> None:
    data = json.dumps(report, indent=2, default=str)
    (RESULTS / f"{stamp}.json").write_text(data)
    (RESULTS / "latest.json").write_text(data)


def targets_section(report: dict[str, Any]) -> str:
    import venturi_only

    return venturi_only.targets(report)


def write_readme(text: str, command: str, section: str = "results") -> None:
    readme = HERE / "README.md"
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    body = readme.read_text() if readme.exists() else f"# Benchmarks\n\n{begin}\n{end}\n"
    if begin not in body:
        body += f"\n{begin}\n{end}\n"
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block = (
        f"{begin}\nProduced by `.venv/bin/python {command}` on {when}, venturi at {git_state()}.\n\n"
        f"{text}\n{end}"
    )
    readme.write_text(head + block + tail)
    log(f"wrote {readme}")


if __name__ == "__main__":
    main()
