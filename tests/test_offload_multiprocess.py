"""Offload across processes on a real Redis: one process offloads and resolves,
another computes. The function runs in the worker process, never in the producer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PYTHON = (
    str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
)


def test_producer_offloads_worker_computes_producer_resolves(redis_server: RedisServer) -> None:
    env = {**os.environ, "VENTURI_MP_QUEUE": f"mp-{uuid.uuid4().hex[:10]}", "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [PYTHON, "-m", "tests.offload_procs.worker", redis_server.url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
        producer = subprocess.run(
            [PYTHON, "-m", "tests.offload_procs.producer", redis_server.url, "42", "5"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert producer.returncode == 0, producer.stderr
        out = json.loads(producer.stdout.strip().splitlines()[-1])
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, err = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert worker.returncode == 0, err
    assert out["status"] == "completed"
    assert out["is_report"] == "Report"
    assert out["value"]["total"] == 4205.0
    # computed by the worker process, not by the producer
    assert out["value"]["computed_by"] == worker.pid != out["pid"]
    # and the producer never loaded the worker side
    assert out["worker_loaded"] is False
