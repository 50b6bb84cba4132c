"""vr.SyncClient in a gevent (or eventlet) app: monkey patching first, then producers in greenlets.

Each test runs tests/procs/green_app.py in a subprocess whose first line
patches, against a real redis-server; a deadlock there fails here (the
script's own faulthandler deadline, and a timeout on the subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import EchoJob

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "procs" / "green_app.py"


def run_app(mode: str, url: str, *names: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(APP), mode, url, *names],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def plain_app_imports(url: str) -> str:
    code = (
        "import sys, venturi_redis as vr\n"
        "from tests.tasks import Echo\n"
        f"with vr.SyncClient({url!r}) as sc:\n"
        "    sc.queue('plain').enqueue(Echo(text='x'))\n"
        "    sc.queue('plain').counts()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gevent', 'eventlet', 'greenlet')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


async def test_sync_client_serves_50_request_greenlets_under_gevent(
    redis_server: RedisServer, client: vr.Client
) -> None:
    name, merge_name = f"g-{uuid.uuid4().hex[:10]}", f"gm-{uuid.uuid4().hex[:10]}"
    worker = make_worker(client.queue(name), EchoJob)  # for the requests' wait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        out = await anyio.to_thread.run_sync(run_app, "gevent", redis_server.url, name, merge_name)
        worker.shutdown()
    assert out["requests"] == 50
    assert out["merged_ids"] == 1 and out["merged_n"] == 50  # every collision merged into one job
    assert out["many"] == 100 and out["got"] == 50 and out["counted"] == 50
    assert out["results"] == sorted(f"completed:r{i}" for i in range(50))
    # The hub kept serving another greenlet while the requests waited, and no
    # greenlet of the app's thread saw the SyncClient's loop as running (on
    # main it did: Django's ORM, asyncio.run and a second SyncClient refused).
    assert out["ticks"] > 0 and out["loop_seen"] == 0
    assert out["asyncio_run"] == "ok" and out["second_pending"] == 1
    # A wait cut short by gevent.Timeout left no task behind on the loop.
    assert out["timed_out"] is True and out["loop_tasks"] == 2
    # gevent stays optional: a plain app's SyncClient imports no green library.
    assert plain_app_imports(redis_server.url) == "[]"


def test_a_client_made_before_the_fork_serves_greenlets_of_a_patched_child(redis_server: RedisServer) -> None:
    # gunicorn -k gevent --preload: the app (and its SyncClient) is imported in
    # the master, unpatched; each worker forks, then patches. On main the
    # child hung on the SyncClient's (real) lock at its first requests.
    name, merge_name = f"p-{uuid.uuid4().hex[:10]}", f"pm-{uuid.uuid4().hex[:10]}"
    assert run_app("preload", redis_server.url, name, merge_name) == {"child": 0}


def test_sync_client_refuses_eventlet_with_the_alternatives(redis_server: RedisServer) -> None:
    out = run_app("eventlet", redis_server.url, "unused", "unused")
    assert out["refused"] is not None
    assert "gunicorn -k gevent" in out["refused"] and "vr.Client" in out["refused"]
