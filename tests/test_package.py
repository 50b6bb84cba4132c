"""The package face: exports, the producer/worker split, and the built wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import redis

import venturi_redis as vr
from tests.servers import RedisServer
from venturi_redis._store.scripts import ScriptSet

ROOT = Path(__file__).resolve().parent.parent


def test_all_is_sorted_and_exact() -> None:
    assert vr.__all__ == sorted(vr.__all__)
    public = {name for name in dir(vr) if not name.startswith("_")} | {"Worker"}
    # every exported name exists; nothing public is left out of __all__ except modules
    assert set(vr.__all__) <= public
    leaked = {n for n in public - set(vr.__all__) if not isinstance(getattr(vr, n), type(vr))}
    assert leaked == set()


def test_errors_form_one_tree() -> None:
    for name in vr.__all__:
        obj = getattr(vr, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, vr.VenturiError), name
            assert obj.__doc__, name


def test_producer_modules_never_import_the_worker() -> None:
    code = (
        "import sys; import venturi_redis as vr; vr.Client, vr.Task, vr.Queue, vr.offload; "
        "bad = [m for m in sys.modules if m in ('venturi_redis._worker.worker', "
        "'venturi_redis._worker.metrics', 'prometheus_client', 'typer', 'rich')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_side_names_load_on_first_use() -> None:
    """``vr.PrometheusMetrics`` (the docs' import) and ``vr.Worker`` load the worker side only when named."""
    code = (
        "import sys; import venturi_redis as vr; "
        "assert {'Worker', 'PrometheusMetrics', 'WorkerObserver'} <= set(dir(vr)); "
        "before = 'venturi_redis._worker.metrics' in sys.modules; "
        "from venturi_redis._worker.metrics import PrometheusMetrics; "
        "print(before, vr.PrometheusMetrics is PrometheusMetrics)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_log_filter_loads_without_the_worker() -> None:
    """A web process's LOGGING names ``venturi_redis.JobLogFilter``: that loads its module, not the worker."""
    code = (
        "import logging.config, sys; "
        "logging.config.dictConfig({'version': 1, "
        "'filters': {'job': {'()': 'venturi_redis.JobLogFilter'}}}); "
        "print(sorted(m for m in sys.modules if m.startswith('venturi_redis._worker.') "
        "and m.rsplit('.', 1)[1] in ('logcontext', 'worker', 'runner', 'execute', 'completer')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['venturi_redis._worker.logcontext']"


# Public names whose modules a worker does not use: `import venturi_redis`
# leaves them unimported (issue 42), and naming one loads it.
LOADED_WHEN_NAMED = {
    "BulkFilters": "venturi_redis._producer.bulk",
    "BulkProgress": "venturi_redis._producer.bulk",
    "HistoryPoint": "venturi_redis._model.history",
    "Limit": "venturi_redis._model.limits",
    "LimitInfo": "venturi_redis._model.limits",
    "LimitKeyLoad": "venturi_redis._model.limits",
    "OffloadHandle": "venturi_redis._producer.results",
    "OffloadNotFound": "venturi_redis._producer.results",
    "OffloadResult": "venturi_redis._producer.results",
    "QueueEvent": "venturi_redis._model.events",
    "QueueStats": "venturi_redis._producer.reads",
    "Rate": "venturi_redis._model.limits",
    "Schedule": "venturi_redis._model.schedule",
    "ScheduleInfo": "venturi_redis._model.schedule",
    "read_result": "venturi_redis._producer.results",
    "read_result_redacted": "venturi_redis._producer.results",
    "resolve": "venturi_redis._producer.results",
}


def test_names_a_worker_does_not_use_load_when_named() -> None:
    code = (
        "import importlib, json, sys; import venturi_redis as vr; "
        f"names = {LOADED_WHEN_NAMED!r}; "
        "before = sorted({m for m in names.values() if m in sys.modules}); "
        "same = [n for n, m in names.items() if getattr(vr, n) is getattr(importlib.import_module(m), n)]; "
        "from venturi_redis import BulkFilters, HistoryPoint, Limit, QueueEvent, Schedule, resolve; "
        "print(json.dumps([before, same]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, same = json.loads(out.stdout)
    assert before == []
    assert same == list(LOADED_WHEN_NAMED)


# What a worker started by `venturi worker` must not have imported by the time
# it runs its first job (issue 42: its start-up to the first claim). Each is
# the optional dependency of another face (the other commands' tables and
# progress bars, the dashboard, Prometheus, Django, OpenTelemetry's
# instrumentation, cron expressions, encryption) or a module of the package
# that a worker does not use. A prefix covers its submodules.
NOT_AT_A_WORKER_START = (
    "venturi_redis.cli.admin",
    "venturi_redis.cli.commands",
    "venturi_redis.cli.dashboard",
    "venturi_redis.cli.reading",
    "venturi_redis.dashboard",
    "venturi_redis.contrib",
    "venturi_redis.otel",
    "venturi_redis.testing",
    "venturi_redis._worker.metrics",
    "venturi_redis._producer.sync",
    "venturi_redis._producer.rebuild",
    # the readings (stats, job lists), an operator's bulk commands, the metrics
    # history and the offload results' reading side: loaded where they are called
    "venturi_redis._producer.reads",
    "venturi_redis._producer.many",
    "venturi_redis._producer.bulk",
    "venturi_redis._producer.results",
    "venturi_redis._producer.history",
    "venturi_redis._model.history",
    # the event stream, limits and schedules of a worker that uses none (its
    # first fire round finds nothing due), the queue discovery of the CLI's
    # hints, batch handlers, @vr.offload functions: loaded where they are used
    "venturi_redis._model.events",
    "venturi_redis._model.limits",
    "venturi_redis._model.schedule",
    "venturi_redis._producer.events",
    "venturi_redis._producer.limits",
    "venturi_redis._producer.schedules",
    "venturi_redis._producer.discovery",
    "venturi_redis._worker.batch",
    "venturi_redis._model.batch_note",
    "venturi_redis._worker.offload",
    # the embedded memory:// server: a redis:// worker never needs it
    "fakeredis",
    "lupa",
    "rich.console",
    "rich.table",
    "rich.progress",
    "typer.rich_utils",
    "starlette",
    "jinja2",
    "uvicorn",
    "prometheus_client",
    "django",
    "cronsim",
    "cryptography.hazmat",
    "opentelemetry.instrumentation",
    "opentelemetry.sdk.trace",
)

STARTUP_APP = """
import json, os, sys
from typing import ClassVar
import redis
import venturi_redis as vr
from venturi_redis._store.scripts import scripts


class Probe(vr.Task):
    KIND: ClassVar[str] = "startup.probe"


class ProbeJob(Probe, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        seen = {"modules": sorted(sys.modules), "expanded": sorted(scripts()._scripts)}
        redis.Redis.from_url(os.environ["REDIS_URL"]).set(os.environ["PROBE_KEY"], json.dumps(seen))
        return vr.Outcome.completed()


client = vr.Client.from_url(os.environ["REDIS_URL"])
worker = vr.Worker(client.queue(os.environ["PROBE_QUEUE"]), handle_signals=True)
worker.register(ProbeJob)
"""


def test_a_worker_started_by_the_cli_imports_no_other_face_and_expands_only_its_scripts(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """`venturi worker`, as a user starts it, up to its first job's handler: none of
    NOT_AT_A_WORKER_START imported, and only the Lua scripts it sent expanded."""
    (tmp_path / "startup_probe.py").write_text(STARTUP_APP)
    name = f"startup-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "PROBE_QUEUE": name,
        "PROBE_KEY": f"{name}:seen",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
    }
    enqueue = (
        "import asyncio, startup_probe as a; "
        "asyncio.run(a.client.queue(a.worker.queues[0].name).enqueue(a.Probe()))"
    )
    subprocess.run([sys.executable, "-c", enqueue], env=env, check=True, cwd=tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "venturi_redis.cli", "worker", "startup_probe:worker"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    r = redis.Redis.from_url(redis_server.url)
    try:
        deadline = time.monotonic() + 60
        while (raw := r.get(f"{name}:seen")) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    seen = json.loads(raw)
    imported = [
        m for m in seen["modules"] for bad in NOT_AT_A_WORKER_START if m == bad or m.startswith(f"{bad}.")
    ]
    assert imported == []
    assert "venturi_redis.cli.worker" in seen["modules"]  # the probe saw the CLI's worker
    assert "claim" in seen["expanded"]
    assert len(seen["expanded"]) < len(ScriptSet().names()) // 2, seen["expanded"]


def test_internals_are_not_public_attributes() -> None:
    """What only the package itself calls has a leading underscore (issue 25 item 5)."""
    internals = {
        vr.Client: ["now_arg"],
        vr.Durability: ["command", "check"],
    }
    for cls, names in internals.items():
        for name in names:
            assert not hasattr(cls, name), f"{cls.__name__}.{name} is public"
            assert hasattr(cls, f"_{name}"), f"{cls.__name__}._{name} is gone"
    worker = vr.Worker(vr.Queue.from_url("memory://internals"), handle_signals=False)
    # What the worker's parts ask of it is public by design (issue 37: the Protocols
    # between the worker's parts are made of public members, RunnerHost, RunHost,
    # CompleterHost); what only the worker itself uses keeps its underscore.
    assert not hasattr(worker, "finish") and hasattr(worker, "_finish")


def test_wheel_ships_the_lua_scripts(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in (ROOT / "lua").rglob("*.lua"):
        assert f"venturi_redis/lua/{script.relative_to(ROOT / 'lua')}" in names
    assert "venturi_redis/py.typed" in names
    # The dashboard's templates and static files (htmx vendored: it works offline).
    dash = ROOT / "venturi_redis" / "dashboard"
    for kind in ("templates", "static"):
        files = [p for p in (dash / kind).rglob("*") if p.is_file()]
        assert files and all(f"venturi_redis/dashboard/{p.relative_to(dash)}" in names for p in files), kind
    # and the unpacked wheel's loader reads its own copy, not the checkout's
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = "import venturi_redis._store.scripts as s; print(s._lua_dir()); print(len(s.ScriptSet().names()))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(unpacked), "PATH": "/usr/bin:/bin"},
    )
    lua_dir, count = out.stdout.split()
    assert lua_dir == str(unpacked / "venturi_redis" / "lua")
    assert int(count) == len(list((ROOT / "lua").glob("*.lua")))
