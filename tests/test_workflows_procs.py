"""Fan-in across processes (issue 31): many children drained by several worker
processes, one of them SIGKILLed mid-way; the parent runs exactly once, after
every child, and sees every result.

300 children by default (a few seconds); ``VENTURI_FANIN=1000`` (or more) for
the issue's figure. The measured time is printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import venturi_redis as vr
from tests.procs.fanin import Gather, Leaf
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 3
LEASE = 1.0  # short: the killed worker's jobs come back within about a second


def _wait(predicate: object, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_fan_in_across_processes_with_a_worker_killed(redis_server: RedisServer, tmp_path: Path) -> None:
    children = int(os.environ.get("VENTURI_FANIN", "300"))
    name = f"fanin-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    logs = []
    for k in range(WORKERS):
        log = tmp_path / f"w{k}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.procs.fanin", redis_server.url, name, str(LEASE)],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=out,
                )
            )
    try:
        for log in logs:
            _wait(lambda log=log: "STARTING" in log.read_text(), f"worker did not start: {log.read_text()}")
        with vr.SyncClient(redis_server.url) as client:
            q = client.queue(name)
            started = time.monotonic()
            flow = q.enqueue_flow(Gather(), [Leaf(i=i) for i in range(children)])
            # Kill one worker once a quarter of the children are done: whatever it held
            # comes back through the reclaim sweep.
            _wait(lambda: q.counts()["completed"] >= children // 4, "children are not completing")
            procs[0].send_signal(signal.SIGKILL)
            _wait(
                lambda: (i := q.get(flow.parent_id)) is not None and i.state is vr.JobState.COMPLETED,
                f"the parent did not complete: {q.counts()}",
            )
            elapsed = time.monotonic() - started
            parent = q.get(flow.parent_id)
            assert parent is not None
            assert parent.result == {"count": children, "sum": children * (children - 1) // 2}
            assert parent.run_count == 1
            journal = q.journal(flow.parent_id)
            assert [e.event for e in journal].count("claimed") == 1
            claimed_at = next(e.at for e in journal if e.event == "claimed")
            for child in flow.children_ids:
                info = q.get(child)
                assert info is not None and info.state is vr.JobState.COMPLETED
                assert info.finished_at is not None and info.finished_at <= claimed_at
            counts = q.counts()
            assert counts["waiting"] == 0 and counts["completed"] == children + 1
            print(
                f"\nfan-in: {children} children, {WORKERS} worker processes (one SIGKILLed), "
                f"drained in {elapsed:.2f} s, parent runs = {parent.run_count}"
            )
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
