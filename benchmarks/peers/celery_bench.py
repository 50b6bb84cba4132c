"""Celery adapter (own venv: celery[redis]). One worker process with the threads pool."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from celery import Celery
from celery.signals import worker_ready

_a = c.parse_args()
app = Celery("bench", broker=_a.url)
app.conf.task_ignore_result = True
app.conf.task_default_queue = _a.queue
app.conf.broker_connection_retry_on_startup = True


@app.task(name="noop")
def noop(i: int, t: float = 0.0) -> None:
    c.sync_hit(t)


def main(a: Any) -> None:
    if a.action == "worker":
        rec = c.sync_worker_env(a)
        # Start the clock when Celery's bootsteps are done and it consumes.
        worker_ready.connect(lambda **_: rec.mark_start(c.handler_connections(a)), weak=False)
        # The threads pool keeps "one worker process"; prefork would add a child per slot.
        app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={a.concurrency}",
                "--loglevel=WARNING",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    elif a.action == "enqueue":
        # Celery has no bulk enqueue: group()/chunks() publish one message per task.
        c.time_sync(a.mode, a.n, lambda i: noop.delay(i), None, a.bulk_size)
    elif a.action == "fill":
        for i in range(a.n):
            noop.delay(i)
    elif a.action == "latency":
        for i in c.paced(a.n, a.rate):
            noop.delay(i, time.time())


if __name__ == "__main__":
    main(_a)
