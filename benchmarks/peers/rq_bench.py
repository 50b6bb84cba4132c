"""RQ adapter (own venv: rq). One SimpleWorker: RQ runs one job at a time per worker process."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c
from redis import Redis
from rq import Queue, SimpleWorker


def noop(i: int, t: float = 0.0) -> None:
    c.sync_hit(t)


# RQ refuses functions of __main__: name the function by its module path (the
# worker imports this file as ``rq_bench``; peers/ is its sys.path[0]).
FUNC = "rq_bench.noop"


def main(a: Any) -> None:
    conn = Redis.from_url(a.url)
    q = Queue(a.queue, connection=conn)
    if a.action == "worker":
        if a.concurrency != 1:
            # RQ's default Worker forks a child per job; SimpleWorker runs jobs
            # in-process, one at a time. Parallelism needs more worker processes.
            c.unsupported("one job at a time per RQ worker process")
        rec = c.sync_worker_env(a)
        w = SimpleWorker([q], connection=conn)
        rec.mark_start(c.handler_connections(a))
        w.work(logging_level="WARNING")
    elif a.action == "enqueue":

        def bulk(r: range) -> None:
            q.enqueue_many([Queue.prepare_data(FUNC, args=(i,)) for i in r])

        c.time_sync(a.mode, a.n, lambda i: q.enqueue(FUNC, i), bulk, a.bulk_size)
    elif a.action == "fill":
        for s in range(0, a.n, 1000):
            q.enqueue_many([Queue.prepare_data(FUNC, args=(i,)) for i in range(s, min(s + 1000, a.n))])
    elif a.action == "latency":
        for i in c.paced(a.n, a.rate):
            q.enqueue(FUNC, i, time.time())


if __name__ == "__main__":
    main(c.parse_args())
