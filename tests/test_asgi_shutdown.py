"""examples/asgi_worker.py under a real uvicorn process: SIGTERM drains the worker.

The documented single-process shape (docs/continuations.md) runs the worker in
the ASGI lifespan. uvicorn, sent SIGTERM while a job runs, must run the
lifespan's shutdown half before the process ends: the job finishes within the
grace and is journaled ``completed``, never left ``running`` for its lease to
expire and be charged as a failure.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

import venturi_redis as vr
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent


def _lines(stream: object, out: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        out.put(line)
    out.put("")  # the process closed its output: it has exited


def wait_for(lines: queue.Queue[str], seen: list[str], needle: str, timeout: float = 60.0) -> str:
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no {needle!r} from uvicorn within {timeout} s; it printed:\n{''.join(seen)}")
        if not line:
            pytest.fail(f"uvicorn exited before {needle!r}; it printed:\n{''.join(seen)}")
        seen.append(line)
        if needle in line:
            return line


def test_sigterm_under_uvicorn_lets_the_running_job_finish(redis_server: RedisServer) -> None:
    name = f"asgi-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.asgi_worker:app", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    reader = threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        wait_for(lines, seen, "Uvicorn running on")
        req = urllib.request.Request(f"http://127.0.0.1:{port}/naps?seconds=1.5", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            job_id = json.loads(resp.read())["job_id"]
        wait_for(lines, seen, f"RUNNING {job_id}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
    # uvicorn re-raises the SIGTERM it caught once its shutdown is done.
    assert proc.returncode in (0, -signal.SIGTERM), "".join(seen)
    with vr.SyncClient(redis_server.url) as client:
        q = client.queue(name)
        info = q.get(job_id)
        assert info is not None
        assert (info.state, info.failures, info.note) == (vr.JobState.COMPLETED, 0, "slept 1.5s")
        assert [e.event for e in q.journal(job_id)] == ["enqueued", "claimed", "completed"]
