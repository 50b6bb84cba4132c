"""A web app's producer under gevent's or eventlet's monkey patching (tests/test_green.py).

Run as a script, so that the patching comes before any other import, as
``gunicorn -k gevent`` or an app's first line does::

    python tests/procs/green_app.py gevent|eventlet|preload REDIS_URL QUEUE MERGE_QUEUE

With ``gevent``: 50 request greenlets at once each enqueue (the direct
path), enqueue a task whose dedup key collides (the merge, on the loop
thread), ``enqueue_many``, ``get``, ``counts`` and ``wait`` for the result
(the test runs a worker for QUEUE), while a sibling greenlet ticks and checks
that no asyncio loop is seen running in this thread. Then a ``wait`` cut
short by ``gevent.Timeout``, ``asyncio.run``, a second ``SyncClient`` and
``close``. It prints one JSON line of what it
saw. With ``eventlet``: ``SyncClient(url)`` must refuse; it prints the error.
With ``preload``, what ``gunicorn -k gevent --preload`` does: the
``SyncClient`` is made before any patching, then a forked child patches and
serves 50 request greenlets; the parent reports whether the child finished.

A deadlock dumps every thread's stack and exits 1 (``faulthandler``), so it
fails the test instead of hanging it.
"""

import sys

if sys.argv[1] == "gevent":
    from gevent import monkey

    monkey.patch_all()
elif sys.argv[1] == "eventlet":
    import eventlet

    eventlet.monkey_patch()

import asyncio
import faulthandler
import json
from typing import Any, ClassVar

import venturi_redis as vr
from tests.tasks import Echo

REQUESTS = 50
faulthandler.dump_traceback_later(60, exit=True)


class Count(vr.Task):
    """Coalesces by key: every request's collides with the first."""

    KIND: ClassVar[str] = "green-count"
    key: str
    n: int = 1

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.with_(Count(key=self.key, n=existing.payload.n + self.n), vr.NoCarry())


def loop_seen() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_gevent(url: str, name: str, merge_name: str) -> dict[str, Any]:
    import gevent

    sc = vr.SyncClient(url)
    q, mq = sc.queue(name), sc.queue(merge_name)
    seen = {"ticks": 0, "loop_seen": 0}

    def sibling() -> None:  # another request, running while the others wait
        while True:
            seen["ticks"] += 1
            seen["loop_seen"] += loop_seen()
            gevent.sleep(0.01)

    def request(i: int) -> dict[str, Any]:
        job_id = q.enqueue(Echo(text=f"r{i}"))
        merged = mq.enqueue(Count(key="k"))
        many = q.enqueue_many([Echo(text=f"m{i}"), Echo(text=f"n{i}")])
        info = q.get(job_id)
        counts = q.counts()
        done = q.wait(job_id, timeout=45)
        return {
            "merged": merged,
            "many": len(many),
            "got": info is not None and info.id == job_id,
            "counted": counts["pending"] + counts["running"] + counts["completed"] > 0,
            "result": f"{done.state.value}:{done.payload['text']}",
        }

    ticker = gevent.spawn(sibling)
    greenlets = [gevent.spawn(request, i) for i in range(REQUESTS)]
    gevent.joinall(greenlets, timeout=50, raise_error=True)
    ticker.kill()
    out = [g.value for g in greenlets]
    # A request timed out while it waits (no worker serves this queue): its
    # call is cancelled on the loop, not left waiting there for ever.
    idle = sc.queue(f"{merge_name}-idle")
    never = idle.enqueue(Echo(text="never"))
    try:
        with gevent.Timeout(0.3):
            idle.wait(never)
        timed_out = False
    except gevent.Timeout:
        timed_out = True
    gevent.sleep(0.1)  # the cancellation reaches the loop thread
    # The portal's and this one; a queue's shared event-stream reader ("venturi tail ...",
    # _producer/tail.py) ends by itself once its read's block ends with no waiter left.
    loop_tasks = sc._ensure()[0].call(
        lambda: len([t for t in asyncio.all_tasks() if not t.get_name().startswith("venturi tail ")])
    )
    merged = mq.get(out[0]["merged"])
    assert merged is not None
    second = vr.SyncClient(url)  # another client in the same process (another Redis, say)
    second_pending = second.queue(merge_name).counts()["pending"]
    second.close()
    sc.close()
    return {
        "requests": len(out),
        "merged_ids": len({o["merged"] for o in out}),
        "merged_n": merged.payload["n"],
        "many": sum(o["many"] for o in out),
        "got": sum(o["got"] for o in out),
        "counted": sum(o["counted"] for o in out),
        "results": sorted(o["result"] for o in out),
        "ticks": seen["ticks"],
        "loop_seen": seen["loop_seen"],
        "asyncio_run": asyncio.run(asyncio.sleep(0, "ok")),
        "second_pending": second_pending,
        "timed_out": timed_out,
        "loop_tasks": loop_tasks,
    }


def run_preload(url: str, name: str, merge_name: str) -> dict[str, Any]:
    import os
    import signal
    import time

    sc = vr.SyncClient(url)  # made in the master, at import, with the app (--preload)
    q, mq = sc.queue(name), sc.queue(merge_name)
    q.enqueue(Echo(text="master"))
    pid = os.fork()
    if pid == 0:  # the worker: patched after the fork, as gunicorn's GeventWorker does
        from gevent import monkey

        monkey.patch_all()
        import gevent

        def request(i: int) -> str:
            q.enqueue(Echo(text=f"r{i}"))
            merged = mq.enqueue(Count(key="k"))
            q.counts()
            return merged

        greenlets = [gevent.spawn(request, i) for i in range(REQUESTS)]
        gevent.joinall(greenlets, timeout=30, raise_error=True)
        ok = sum(g.successful() for g in greenlets) == REQUESTS and len({g.value for g in greenlets}) == 1
        sc.close()
        os._exit(0 if ok else 3)
    # A deadlocked child blocks its only OS thread: nothing in it can report, so wait here.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            sc.close()
            return {"child": os.waitstatus_to_exitcode(status)}
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sc.close()
    return {"child": "hung"}


def run_eventlet(url: str) -> dict[str, Any]:
    try:
        vr.SyncClient(url).close()
    except vr.ConfigurationError as exc:
        return {"refused": str(exc)}
    return {"refused": None}


if __name__ == "__main__":
    mode, url, name, merge_name = sys.argv[1:5]
    if mode == "gevent":
        result = run_gevent(url, name, merge_name)
    elif mode == "preload":
        result = run_preload(url, name, merge_name)
    else:
        result = run_eventlet(url)
    print(json.dumps(result), flush=True)
