"""huey adapter (own venv: huey + redis). One consumer process, N worker threads."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from huey import RedisHuey

_a = c.parse_args()
huey = RedisHuey(_a.queue, url=_a.url, results=False)


@huey.task()
def noop(i: int, t: float = 0.0) -> None:
    c.sync_hit(t)


def main(a: Any) -> None:
    if a.action == "worker":
        logging.basicConfig(level=logging.WARNING)
        rec = c.sync_worker_env(a)
        consumer = huey.create_consumer(workers=a.concurrency, worker_type="thread")
        rec.mark_start(c.handler_connections(a))
        consumer.run()
    elif a.action == "enqueue":
        # huey's TaskWrapper.map() enqueues one by one: no bulk API.
        c.time_sync(a.mode, a.n, lambda i: noop(i), None, a.bulk_size)
    elif a.action == "fill":
        for i in range(a.n):
            noop(i)
    elif a.action == "latency":
        for i in c.paced(a.n, a.rate):
            noop(i, time.time())


if __name__ == "__main__":
    main(_a)
