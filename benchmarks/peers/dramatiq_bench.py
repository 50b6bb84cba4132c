"""Dramatiq adapter (own venv: dramatiq[redis]). One worker process, N worker threads."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
import dramatiq
from dramatiq.brokers.redis import RedisBroker

_a = c.parse_args()
broker = RedisBroker(url=_a.url)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=_a.queue, max_retries=0)
def noop(i: int, t: float = 0.0) -> None:
    c.sync_hit(t)


def main(a: Any) -> None:
    if a.action == "worker":
        rec = c.sync_worker_env(a)
        w = dramatiq.Worker(broker, worker_threads=a.concurrency)
        rec.mark_start(c.handler_connections(a))
        w.start()
        try:
            while True:
                time.sleep(1)
        finally:
            w.stop()
    elif a.action == "enqueue":
        # Dramatiq has no bulk enqueue (group() sends each message on its own).
        c.time_sync(a.mode, a.n, lambda i: noop.send(i), None, a.bulk_size)
    elif a.action == "fill":
        for i in range(a.n):
            noop.send(i)
    elif a.action == "latency":
        for i in c.paced(a.n, a.rate):
            noop.send(i, time.time())


if __name__ == "__main__":
    main(_a)
