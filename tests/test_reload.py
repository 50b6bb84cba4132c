"""``venturi worker MODULE:ATTR --reload``, as a developer runs it: edit the handler, the new code runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import ClassVar

import venturi_redis as vr
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

APP = """
import os
import venturi_redis as vr

class Version(vr.Task):
    KIND = "reload.version"

class VersionJob(Version, vr.Handler[None]):
    async def handle(self, ctx, state):
        return vr.Outcome.completed(result="{version}")

def make_worker():
    client = vr.Client.from_url(os.environ["REDIS_URL"])
    return vr.Worker(client.queue(os.environ["VENTURI_QUEUE"]), poll_interval=0.5).register(VersionJob)
"""


class Version(vr.Task):
    """The producer's side of the app's task: the same KIND, no handler."""

    KIND: ClassVar[str] = "reload.version"


WORKER = [sys.executable, "-m", "venturi_redis.cli", "worker", "relapp:make_worker", "--reload"]


def env_for(server: RedisServer, queue: str) -> dict[str, str]:
    """The app's environment: its Redis and queue, and this checkout's package."""
    return {
        **os.environ,
        "REDIS_URL": server.url,
        "VENTURI_QUEUE": queue,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


def result_of(q: vr.SyncQueue, log: Path) -> object:
    job_id = q.enqueue(Version())
    deadline = time.monotonic() + 60
    while (info := q.get(job_id)) is None or info.state != vr.JobState.COMPLETED:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return info.result


def wait_for(log: Path, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log.read_text()}"
        time.sleep(0.05)


def test_a_changed_handler_runs_after_the_reload(redis_server: RedisServer, tmp_path: Path) -> None:
    name = f"reload-{uuid.uuid4().hex[:8]}"
    app = tmp_path / "relapp.py"
    app.write_text(APP.format(version="v1"))
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            WORKER,
            cwd=tmp_path,
            env=env_for(redis_server, name),
            stdout=out,
            stderr=out,
        )
    try:
        with vr.SyncClient(redis_server.url) as client:
            q = client.queue(name)
            assert result_of(q, log) == "v1"
            app.write_text(APP.format(version="v2"))
            wait_for(log, "supervisor: relapp.py changed; restarting the workers with the new code")
            # The old worker has exited: a job enqueued between the supervisor's line and
            # its SIGTERM's handling could still be claimed by it (and run the old code).
            wait_for(log, "stopped for the new code; starting a fresh one")
            assert result_of(q, log) == "v2"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "stopped for the new code" in text and "restarting in" not in text, text


def test_reload_without_watchfiles_is_a_usage_error(redis_server: RedisServer, tmp_path: Path) -> None:
    (tmp_path / "watchfiles.py").write_text("raise ImportError('No module named watchfiles')\n")
    (tmp_path / "relapp.py").write_text(APP.format(version="v1"))
    res = subprocess.run(
        WORKER,
        cwd=tmp_path,
        env=env_for(redis_server, "x"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "venturi: --reload needs the watchfiles package (No module named watchfiles): "
        "pip install 'venturi-redis[reload]'"
    ]
