"""Workers register themselves while they run (issue 33 item 4), against a real Redis.

Two worker processes are listed by `queue.workers()`, `venturi workers` and
counted by `venturi stats`; a SIGKILLed one disappears once its registration
expires; one stopped cleanly is gone at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

import venturi_redis as vr
from tests.servers import RedisServer
from venturi_redis._store.keys import QueueKeys
from venturi_redis.cli.commands import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def start(url: str, queue: str, lease: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs.worker", url, queue, str(lease)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, done: Callable[[], bool], procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not done():
        for p in procs:
            assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"waited a minute for {what}"
        time.sleep(0.05)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate()


def test_workers_are_listed_and_a_killed_one_expires(
    redis_server: RedisServer, procs: list[subprocess.Popen[str]]
) -> None:
    url, qname = redis_server.url, f"reg-{uuid.uuid4().hex[:10]}"
    with vr.SyncClient(url) as sc:
        q = sc.queue(qname)

        def pids() -> set[int]:
            return {w.pid for w in q.workers()}

        procs += [start(url, qname, 1.0), start(url, qname, 1.0)]
        a, b = procs
        wait_for("both workers", lambda: pids() == {a.pid, b.pid}, procs)
        (w, _) = q.workers()
        assert w.queues == (qname,) and w.concurrency == 16 and w.running == 0
        assert w.version == vr.__version__ and w.heartbeat_at >= w.started_at

        listed = runner.invoke(app, ["workers", "-q", qname, "--redis", url, "--json"])
        assert listed.exit_code == 0, listed.output
        assert {d["pid"] for d in json.loads(listed.stdout)} == {a.pid, b.pid}
        table = runner.invoke(app, ["workers", "--redis", url], env={"COLUMNS": "250"})
        assert table.exit_code == 0 and str(a.pid) in table.stdout and qname in table.stdout
        stats = runner.invoke(app, ["stats", "-q", qname, "--redis", url, "--json"])
        assert json.loads(stats.stdout)[0]["workers"] == 2
        # A queue with only workers on it is known (not a typo).
        assert runner.invoke(app, ["queue", "pause", qname, "--redis", url]).exit_code == 0
        assert q.stats().paused

        a.send_signal(signal.SIGKILL)
        a.wait()
        wait_for("the killed worker to expire", lambda: pids() == {b.pid}, [b])

        b.send_signal(signal.SIGTERM)
        out, _ = b.communicate(timeout=30)
        assert "STOPPED" in out
        assert pids() == set()  # a clean stop leaves at once
        r = redis.Redis.from_url(url)
        assert r.keys(QueueKeys.for_queue(qname).worker("*")) == []
