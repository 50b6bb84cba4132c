"""Synchronous handlers: a plain ``def handle`` runs in a daemon thread of the worker's own.

``call_handler`` is how execute.py calls every handler: an ``async def
handle`` is awaited on the loop as it always was (one set lookup more), a
``def handle`` (found when its class was registered, ``handler.sync_handle``)
runs in a thread of the worker's ``HandlerThreads``, so blocking code never
blocks the event loop that claims, renews leases and commits for every other run.

Why threads of our own, not anyio's ``to_thread`` or asyncio's default
executor: theirs are not daemon threads, and the interpreter joins them when
it exits. One handler stuck in a blocking call would then keep the worker
process alive after its shutdown, forever. Ours are daemon threads: the
process exits whatever they are doing.

A thread cannot be stopped. When a run ends while its thread still runs (its
timeout, the shutdown grace running out, a second signal, ``run()`` itself
cancelled), the run ends exactly as an async one would (failed and retried at
a timeout; released back to pending at a shutdown, docs/operations.md) and
the thread is *abandoned*: its context is flagged cancelled
(``ctx.is_cancelled()``, for a handler that looks), it runs on until it
returns, and what it returns or raises then is discarded (logged). It keeps
its place among the worker's threads until then, so handlers that hang cannot
make a worker start threads without bound: at most ``capacity`` threads are
alive at once (the worker's concurrency on all its queues), and a run that
finds them all taken by abandoned ones waits for one, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .handler import SYNC_HANDLERS
from .logcontext import pinned

log = logging.getLogger("venturi_redis.worker")

T = TypeVar("T")

# An idle thread ends after this long without a run (anyio's pool waits 10 s too).
IDLE_SECONDS = 10.0
_names = itertools.count(1)


def call_handler(threads: HandlerThreads, task: Any, ctx: Any, state: Any) -> Awaitable[Any]:
    """``task.handle(ctx, state)`` as something to await: the coroutine of an
    async handler, a worker thread's run of a sync one."""
    if type(task) in SYNC_HANDLERS:
        return _in_thread(threads, task, ctx, state)
    return task.handle(ctx, state)  # type: ignore[no-any-return]


async def _in_thread(threads: HandlerThreads, task: Any, ctx: Any, state: Any) -> Any:
    # ctx.from_thread() runs coroutines on this loop for the handler.
    ctx._loop = asyncio.get_running_loop()
    try:
        outcome = await threads.run(f"{ctx.job_id} ({ctx.kind})", task.handle, ctx, state)
    except asyncio.CancelledError:
        # The run is being ended without its thread: tell a handler that looks.
        ctx._cancel("the run was ended (its timeout, or the worker's shutdown) while its thread ran")
        raise
    if inspect.isawaitable(outcome):  # a `def` returning a coroutine: an async def under a decorator
        outcome = await outcome
    return outcome


class _Call:
    """One function call handed to a thread, and what became of it."""

    __slots__ = ("abandoned", "args", "context", "finished", "fn", "future", "label", "loop", "started")

    def __init__(
        self, label: str, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.label = label
        self.fn = fn
        self.args = args
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        # The caller's context variables (a tracing span, the job a log record is about) go with
        # the call; the job as it is now, though the call outlives its run (logcontext.pinned).
        self.context = pinned(contextvars.copy_context())
        self.started = time.monotonic()
        self.abandoned = False  # both flags under the pool's lock
        self.finished = False


class _Thread:
    """A daemon thread that runs calls from its inbox, one at a time."""

    __slots__ = ("inbox", "pool", "thread")

    def __init__(self, pool: HandlerThreads) -> None:
        self.pool = pool
        self.inbox: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name=f"venturi-handler-{next(_names)}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        pool = self.pool
        while (call := self._next()) is not None:
            try:
                result, error = call.context.run(call.fn, *call.args), None
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: the loop decides
                result, error = None, exc
            pool._done(self, call, result, error)
            del call, result, error  # not kept alive by an idle thread

    def _next(self) -> _Call | None:
        try:
            return self.inbox.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            if self.pool._retire(self):
                return None
            return self.inbox.get()  # taken from the idle list meanwhile: its call is on its way


class HandlerThreads:
    """The worker's threads for sync handlers: at most ``capacity()`` alive, abandoned ones included."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        # Guards the lists and counts below: threads update them as they finish.
        self._lock = threading.Lock()
        self._idle: list[_Thread] = []
        self._alive = 0
        self._abandoned = 0
        # Runs waiting for a thread: woken (to look again) whenever one frees up.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def abandoned(self) -> int:
        """Threads still running a call whose run has ended without them."""
        return self._abandoned

    async def run(self, label: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the threads; cancelling this abandons the call (see the module)."""
        loop = asyncio.get_running_loop()
        thread = await self._take(loop, label)
        call = _Call(label, fn, args, loop)
        thread.inbox.put(call)
        try:
            return await call.future  # type: ignore[no-any-return]
        finally:
            # Cancelled (the awaiting task's cancellation cancels the future too):
            # the thread runs on without anyone waiting for it.
            if call.future.cancelled():
                self._abandon(call)

    async def _take(self, loop: asyncio.AbstractEventLoop, label: str) -> _Thread:
        warned = False
        while True:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
                capacity = max(1, self._capacity())
                if self._alive < capacity:
                    self._alive += 1
                    break
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
                abandoned = self._abandoned
            if not warned:
                warned = True
                log.warning(
                    "job %s waits for a thread: all %d of the worker's handler threads are busy, %d of "
                    "them with runs that already ended (a sync handler that did not return by its "
                    "timeout or the shutdown: it cannot be stopped, only abandoned)",
                    label,
                    capacity,
                    abandoned,
                )
            try:
                await waiter
            finally:
                with self._lock:
                    if (loop, waiter) in self._waiters:
                        self._waiters.remove((loop, waiter))
        try:
            return _Thread(self)
        except BaseException:  # no thread could be started (RuntimeError: can't start new thread)
            with self._lock:
                self._alive -= 1
            raise

    def _abandon(self, call: _Call) -> None:
        with self._lock:
            if call.finished:
                return  # it returned as it was being cancelled: nothing runs on
            call.abandoned = True
            self._abandoned += 1
        log.warning(
            "job %s: its run ended while its sync handler still ran; the thread cannot be stopped and "
            "is abandoned: it runs on until it returns, and what it returns is discarded",
            call.label,
        )

    def _done(self, thread: _Thread, call: _Call, result: Any, error: BaseException | None) -> None:
        """In the thread: ``call`` returned (or raised); the thread goes back to the idle list."""
        with self._lock:
            call.finished = True
            abandoned = call.abandoned
            if abandoned:
                self._abandoned -= 1
            self._idle.append(thread)
            waiters, self._waiters = self._waiters, []
        if abandoned:
            what = "returned" if error is None else f"raised {type(error).__name__}"
            log.warning(
                "job %s: the abandoned thread of an ended run %s after %.1f s; discarded",
                call.label,
                what,
                time.monotonic() - call.started,
            )
        else:
            _soon(call.loop, _deliver, call.future, result, error)
        for loop, waiter in waiters:
            _soon(loop, _wake, waiter)

    def _retire(self, thread: _Thread) -> bool:
        """In an idle thread that waited ``IDLE_SECONDS``: leave, unless a run just took it."""
        with self._lock:
            if thread not in self._idle:
                return False
            self._idle.remove(thread)
            self._alive -= 1
            return True


def _soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    # A closed loop (RuntimeError): the worker that waited is gone.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled after the thread finished: the run ended without it
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
