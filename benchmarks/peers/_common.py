"""Shared plumbing for the per-library adapters (stdlib + redis-py only).

Every adapter is a script run inside its library's own virtualenv::

    python peers/<lib>_bench.py ACTION --url URL [--n N] [--mode M] [--concurrency C] [--rate R]

Actions:
    enqueue   enqueue ``n`` no-op jobs with ``--mode single|concurrent|bulk``;
              prints ``RESULT {"seconds": ...}`` (the timed loop only).
    fill      enqueue ``n`` no-op jobs the fastest way the library offers (untimed,
              used to prepare the drain workload).
    worker    run one worker at ``--concurrency``; writes ``bench:start`` just
              before entering the library's run loop. Each job's handler INCRs
              ``bench:count``; the handler that brings it to ``n`` writes
              ``bench:end``. A job carrying ``t`` (its enqueue time) RPUSHes
              ``now - t`` to ``bench:lat``. The runner stops the process.
    latency   enqueue ``n`` jobs paced at ``--rate`` per second, each carrying
              ``t = time.time()`` taken just before its enqueue call.

``--bare-evalsha after|before`` (venturi's W1 single only, see
``time_single_paired``): the enqueue action also times ``n`` bare redis-py
``EVALSHA`` round trips of ``return 1`` in the same process, right after or
right before its own loop, and adds ``bare_evalsha_seconds`` to the result.

The handler work is identical for every library: one INCR (plus an RPUSH in
the latency workload), from a client of the adapter's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

COUNT = "bench:count"
START = "bench:start"
END = "bench:end"
LAT = "bench:lat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["enqueue", "fill", "worker", "latency"])
    p.add_argument("--url", required=True)
    p.add_argument("--queue", default="bench")
    p.add_argument("--n", type=int, default=10_000)
    # "blocking": venturi's single enqueue through vr.SyncClient (its W1 line for sync producers)
    p.add_argument("--mode", default="single", choices=["single", "concurrent", "bulk", "blocking"])
    p.add_argument("--chunk", type=int, default=100, help="concurrent awaits per gather")
    p.add_argument("--bulk-size", type=int, default=1000, help="jobs per bulk call")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument(
        "--handler",
        default="incr",
        choices=["incr", "empty"],
        help="worker: 'empty' counts in-process instead of INCRing (venturi's W8 only)",
    )
    p.add_argument(
        "--loop",
        default="asyncio",
        choices=["asyncio", "uvloop"],
        help="worker: the event loop (venturi's W8 uvloop row only; `venturi worker --loop`)",
    )
    p.add_argument(
        "--handler-pool",
        default="warm",
        choices=["warm", "lazy"],
        help="worker: 'warm' opens the handler client's connections (one per concurrent "
        "handler) before the start stamp; 'lazy' leaves them to the first jobs",
    )
    p.add_argument(
        "--bare-evalsha",
        default="off",
        choices=["off", "after", "before"],
        help="enqueue --mode single: also time n bare EVALSHA `return 1` round trips in this "
        "process, after or before the enqueue loop (venturi's W1 only)",
    )
    return p.parse_args(argv)


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def unsupported(what: str) -> None:
    """The library has no such API: say so rather than fake it."""
    emit({"unsupported": what})
    sys.exit(0)


def paced(n: int, rate: float) -> Iterator[int]:
    """Yield 0..n-1 on a fixed schedule of ``rate`` per second (sync sleep)."""
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


async def apaced(n: int, rate: float) -> Any:
    """Async version of ``paced``."""
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i


class SyncRecorder:
    """The no-op handler's only work, for synchronous libraries (thread-safe)."""

    def __init__(self, url: str, n: int) -> None:
        import redis

        self.r = redis.Redis.from_url(url)
        self.n = n

    def mark_start(self, connections: int = 0) -> None:
        """Stamp the start, after opening ``connections`` pooled connections (see AsyncRecorder)."""
        pool = self.r.connection_pool
        held: list[Any] = []
        try:
            for _ in range(connections):
                try:
                    conn = pool.get_connection()
                except TypeError:  # redis-py before 5 wants a command name
                    conn = pool.get_connection("PING")
                conn.connect()
                held.append(conn)
        finally:
            for conn in held:
                pool.release(conn)
        self.r.set(START, repr(time.time()))

    def hit(self, t: float = 0.0) -> None:
        if t:
            self.r.rpush(LAT, repr(time.time() - t))
        if self.r.incr(COUNT) == self.n:
            self.r.set(END, repr(time.time()))


class AsyncRecorder:
    """The no-op handler's only work, for asyncio libraries."""

    def __init__(self, url: str, n: int) -> None:
        import redis.asyncio as aioredis

        self.r = aioredis.Redis.from_url(url)
        self.n = n

    async def mark_start(self, connections: int = 0) -> None:
        """Stamp the start, after opening ``connections`` pooled connections.

        The handler's client is the benchmark's, not the library's: with the
        pool opened here (one connection per concurrent handler, as the
        adapters pass it), W2's window holds the library's start-up and
        drain, not a burst of TCP connects for the first jobs' INCRs (about
        50 ms at concurrency 100 here). W8's client connects before its
        clock starts too. ``--handler-pool lazy`` passes 0, as before.
        """
        pool = self.r.connection_pool
        held: list[Any] = []
        try:
            for _ in range(connections):
                try:
                    conn = await pool.get_connection()
                except TypeError:  # redis-py before 5 wants a command name
                    conn = await pool.get_connection("PING")
                await conn.connect()
                held.append(conn)
        finally:
            for conn in held:
                await pool.release(conn)
        await self.r.set(START, repr(time.time()))

    async def hit(self, t: float = 0.0) -> None:
        if t:
            await self.r.rpush(LAT, repr(time.time() - t))
        if await self.r.incr(COUNT) == self.n:
            await self.r.set(END, repr(time.time()))


class EmptyRecorder(AsyncRecorder):
    """No Redis work per job: counts in the worker process, stamps END at ``n``.

    Only for venturi's W8 row "the worker with an empty handler": how close
    the worker itself comes to the scripts' ceiling, with no handler cost.
    """

    count = 0

    async def hit(self, t: float = 0.0) -> None:
        self.count += 1
        if self.count == self.n:
            await self.r.set(END, repr(time.time()))


def time_sync(
    mode: str,
    n: int,
    single: Callable[[int], Any],
    bulk: Callable[[range], Any] | None,
    bulk_size: int,
) -> None:
    """Time a synchronous library's enqueue loop and emit the result."""
    if mode == "concurrent":
        unsupported("no async API: concurrent awaits do not apply")
    if mode == "bulk" and bulk is None:
        unsupported("no bulk enqueue API")
    t0 = time.perf_counter()
    if mode == "single":
        for i in range(n):
            single(i)
    else:
        assert bulk is not None
        for s in range(0, n, bulk_size):
            bulk(range(s, min(s + bulk_size, n)))
    emit({"seconds": time.perf_counter() - t0, "n": n})


async def time_async(
    mode: str,
    n: int,
    single: Callable[[int], Awaitable[Any]],
    bulk: Callable[[range], Awaitable[Any]] | None,
    chunk: int,
    bulk_size: int,
) -> None:
    """Time an asyncio library's enqueue loop and emit the result."""
    if mode == "bulk" and bulk is None:
        unsupported("no bulk enqueue API")
    t0 = time.perf_counter()
    if mode == "single":
        for i in range(n):
            await single(i)
    elif mode == "concurrent":
        for s in range(0, n, chunk):
            await asyncio.gather(*(single(i) for i in range(s, min(s + chunk, n))))
    else:
        assert bulk is not None
        for s in range(0, n, bulk_size):
            await bulk(range(s, min(s + bulk_size, n)))
    emit({"seconds": time.perf_counter() - t0, "n": n})


async def time_single_paired(
    url: str, n: int, single: Callable[[int], Awaitable[Any]], bare: str, warmup: int = 200
) -> None:
    """W1 single, and its reference measured beside it; emit both.

    The reference is ``n`` sequential ``EVALSHA`` of the script ``return 1``
    from a plain ``redis.asyncio`` client (hiredis where installed), the
    round trip the enqueue is compared with. Both loops run in this process,
    one right after the other (``bare`` = "after" or "before" the enqueue
    loop; the runner alternates it across runs), so that the machine's speed,
    which drifts over minutes, is the same for the two figures. The bare loop
    gets ``warmup`` untimed calls first (its connection opened, the script
    loaded); the enqueue loop gets none, as in every library's W1, so any
    set-up it pays counts against venturi.
    """
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)

    async def enqueues() -> float:
        t0 = time.perf_counter()
        for i in range(n):
            await single(i)
        return time.perf_counter() - t0

    async def round_trips(count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            await r.evalsha(sha, 0)
        return time.perf_counter() - t0

    try:
        sha = await r.script_load("return 1")
        await round_trips(warmup)
        if bare == "before":
            bare_seconds = await round_trips(n)
            seconds = await enqueues()
        else:
            seconds = await enqueues()
            bare_seconds = await round_trips(n)
    finally:
        await r.aclose()
    emit({"seconds": seconds, "n": n, "bare_evalsha_seconds": bare_seconds, "bare": bare})


_SYNC_REC: SyncRecorder | None = None


def sync_hit(t: float = 0.0) -> None:
    """The no-op handler body for synchronous libraries (the recorder comes from the env)."""
    global _SYNC_REC
    if _SYNC_REC is None:
        import os

        _SYNC_REC = SyncRecorder(os.environ["BENCH_URL"], int(os.environ["BENCH_N"]))
    _SYNC_REC.hit(t)


def sync_worker_env(a: argparse.Namespace) -> SyncRecorder:
    """Export what ``sync_hit`` needs (also to forked children) and return its recorder.

    Every adapter runs its handlers in the worker process (threads, or one at
    a time), so they share this recorder and the connections its
    ``mark_start`` opens.
    """
    import os

    global _SYNC_REC
    os.environ["BENCH_URL"] = a.url
    os.environ["BENCH_N"] = str(a.n)
    _SYNC_REC = SyncRecorder(a.url, a.n)
    return _SYNC_REC


def handler_connections(a: argparse.Namespace) -> int:
    """How many connections ``mark_start`` opens: one per concurrent handler, or none (lazy)."""
    return int(a.concurrency) if a.handler_pool == "warm" else 0
