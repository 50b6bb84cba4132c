"""The package face: exports, the producer/worker split, and the built wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import venturi_redis as vr

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
