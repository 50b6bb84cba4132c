"""Fixtures: one contract suite, run on a real Redis and on fakeredis.

Each test gets its own queue name (isolation by name, not FLUSHALL), so tests
never see each other's keys and could run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import threading
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.servers import RedisServer, make_tls_files

# "cluster": a real three-master Redis Cluster (tests/cluster.py), started once
# per session on first use; the whole contract suite runs on it too.
BACKENDS = ["redis", "memory", "cluster"]
# The script-level contract suite (issue 37 item 4): the modules whose tests
# drive the scripts' behaviour, run on every backend above (a script that
# behaves differently on the embedded server or across a Cluster's slots
# fails there). Every other test that takes a `backend` runs once, on real
# Redis: a worker's, a validation's or a face's behaviour does not depend on
# the server, so three runs would only fail three times for one bug.
CONTRACT_MODULES = {
    "test_batch_claims", "test_batch_handlers", "test_batching", "test_claim", "test_cluster_sharded",
    "test_bulk_writes", "test_coalesce",
    "test_continuations", "test_core", "test_dedup", "test_enqueue_at", "test_events", "test_expiry",
    "test_flow_control", "test_history", "test_journal", "test_limit_keys", "test_limits_corrupt",
    "test_offload", "test_ops", "test_ordering", "test_progress", "test_quarantine", "test_quarantine_ops",
    "test_read_corrupt", "test_redrive", "test_registry", "test_resend", "test_retention", "test_retrying",
    "test_schedules", "test_schedules_corrupt", "test_scripts", "test_sync", "test_throttle", "test_update",
    "test_upgrade", "test_wait", "test_wake", "test_workflows", "test_workflows_corrupt",
}  # fmt: skip
# Process, chaos and failover tests: `pytest -m "not slow"` leaves them out
# of a quick local run; `make test` (and so .ci/run) runs them.
SLOW_MODULES = {
    "test_cluster_failover", "test_cluster_reshard", "test_dashboard_browser", "test_flow_processes",
    "test_offload_multiprocess", "test_processes", "test_schedules_procs", "test_sentinel",
    "test_workflows_procs",
}  # fmt: skip
# VENTURI_REDIS_SETUP=noconfig|acl|acl+info (tests/servers.py, MANAGED_SETUPS):
# the contract suite alone (the tests parametrized by `backend`), on the
# session's redis-server started that way, as the application's user. A test
# that needs what such a user may not run (INFO, CONFIG, DEBUG...: it counts
# commands, tunes the server) is marked `admin` and left out, and the run
# says how many it left out.
SETUP = os.environ.get("VENTURI_REDIS_SETUP", "")
if SETUP:
    BACKENDS = ["redis"]
# A test that uses one of these fixtures (each starts a Redis Cluster) or the
# "cluster" backend is marked `cluster`, as tests/test_cluster_failover.py
# (which starts its own) is whole: `make test-oldest` leaves them out
# (-m "not cluster") on a redis-py below the Cluster floor, which refuses a
# cluster client (tests/test_redispy_gates.py checks that it does).
CLUSTER_FIXTURES = {"redis_cluster", "tls_cluster"}


def _module(item: pytest.Item) -> str:
    return Path(str(item.fspath)).stem


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`backend`: every backend in the contract suite, real Redis elsewhere (a test's own
    `parametrize("backend", ...)` says otherwise)."""
    if "backend" not in metafunc.fixturenames or hasattr(metafunc.module, "backend"):
        return  # no backend, or the module's own `backend` fixture says which
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "backend" in (names.split(",") if isinstance(names, str) else names):
            return
    contract = Path(str(metafunc.definition.fspath)).stem in CONTRACT_MODULES
    metafunc.parametrize("backend", BACKENDS if contract else ["redis"])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _module(item) in SLOW_MODULES or "chaos" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.slow)
    if SETUP:
        kept = [
            i
            for i in items
            if "backend" in getattr(i, "fixturenames", ())
            and _module(i) in CONTRACT_MODULES
            and not i.get_closest_marker("admin")
        ]
        dropped = [i for i in items if i not in kept]
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        admin = sum(1 for i in dropped if i.get_closest_marker("admin"))
        print(
            f"\nVENTURI_REDIS_SETUP={SETUP}: the contract suite, {len(kept)} tests "
            f"({admin} admin tests left out)"
        )
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        on_cluster = callspec is not None and callspec.params.get("backend") == "cluster"
        if on_cluster or names & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the whole session, on a free port (started as VENTURI_REDIS_SETUP says)."""
    with RedisServer(setup=SETUP) as server:
        yield server


@pytest.fixture(scope="session")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server that speaks TLS only (``rediss://``), with a throwaway CA."""
    with RedisServer(tls=make_tls_files(tmp_path_factory.mktemp("tls"))) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster (three masters, no replicas) for the whole session."""
    with LocalCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def django_project(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    """Django, set up once per session with tests/djangoapp/settings.py; the environment its workers need.

    Those settings are examples/django's (``shop.settings``) plus the
    ``tests.djangoapp`` app and its ``upstream`` backend. Django reads its
    settings once per process: every test module that uses Django shares this.
    """
    import django
    from django.conf import settings

    env = {
        "REDIS_URL": redis_server.url,
        "VENTURI_QUEUE": f"shop-{uuid.uuid4().hex[:8]}",
        "VENTURI_UPSTREAM_QUEUE": f"up-{uuid.uuid4().hex[:8]}",
        "VENTURI_OTHER_QUEUE": f"q1-{uuid.uuid4().hex[:8]}",
    }
    saved = {k: os.environ.get(k) for k in [*env, "DJANGO_SETTINGS_MODULE"]}
    os.environ.update(env, DJANGO_SETTINGS_MODULE="tests.djangoapp.settings")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "django"))
    try:
        if not settings.configured:
            django.setup()  # reads the settings, and so the environment, once
        assert settings.TASKS["default"]["OPTIONS"]["queue"] == env["VENTURI_QUEUE"]
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Parametrized by pytest_generate_tests (above), or by the test itself."""
    return str(request.param)


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    if backend == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
async def client(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def queue_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue(client: vr.Client, queue_name: str) -> vr.Queue:
    return client.queue(queue_name)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    """On a test's timeout, print every thread's and every asyncio task's stack, then exit.

    pytest-timeout's own signal method raises inside whatever runs when the
    alarm fires: inside a task, that only fails the task, and a test stuck in
    its teardown hangs on (it did once, and the run had to be killed).
    Exiting is loud and ends the run; the task stacks say where it hung.
    """
    timer = threading.Timer(settings.timeout, _dump_and_exit, args=(item, settings.timeout))
    timer.daemon = True
    timer.start()
    item.cancel_timeout = timer.cancel  # type: ignore[attr-defined]  # pytest-timeout's cancel hook reads it
    return True


def _dump_and_exit(item: pytest.Item, timeout: float) -> None:
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # what the test printed, then the stacks, on the real stderr
        capman.suspend_global_capture(in_=True)
        captured_out, captured_err = capman.read_global_capture()
        sys.stderr.write(captured_out + captured_err)
    out = sys.stderr
    print(f"\n+++ Timeout: {item.nodeid} ran over {timeout:g}s +++", file=out)
    for ident, frame in sys._current_frames().items():
        if ident != threading.get_ident():
            print(f"--- thread {ident} ---", file=out)
            traceback.print_stack(frame, file=out)
    gc.unfreeze()  # a running worker froze its start-up objects: get_objects() skips frozen ones
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Task) and not obj.done():
            print(f"--- {obj.get_name()} ---", file=out)
            # Task.print_stack shows only the outermost frame: follow the awaits down.
            coro: Any = obj.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None:
                    code = frame.f_code
                    print(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}", file=out)
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    killed = _kill_children()
    if killed:
        print(f"+++ killed {killed} child process(es): redis-servers, worker processes +++", file=out)
    out.flush()
    os._exit(1)


def _kill_children() -> int:
    """SIGKILL this process's children; how many. ``os._exit`` runs no teardown, and
    left alone the redis-servers and worker processes the tests started run on
    (a timed-out chaos run's three workers drained its queue for minutes after).
    Linux lists the children in /proc (each thread's own); elsewhere they are left."""
    pids: set[int] = set()
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in children.read_text().split())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)
