"""Blocking producers for Django, Flask and scripts: ``vr.SyncClient``.

A ``SyncClient`` owns a private event loop on a daemon thread and runs the
async ``Queue`` on it through an anyio ``BlockingPortal``. So the blocking
calls run the very same code as the async ones (the same scripts, the same
dedup merge loop), and there is nothing to keep in step.

One exception, for speed: a single ``enqueue`` on a client that has an
enqueue lane (``redis://``, ``rediss://`` or ``unix://``, not durable mode)
is checked, encoded and sent from the calling thread, on a blocking redis-py
connection of the ``SyncClient``'s own (``_transport/blocking.py``: the
client and its runner of the script): the same ``prepare``, the same
``enqueue.lua`` call with the same keys and arguments, and no hand-off to the
loop thread and back (about 130 µs of client CPU of a ~170 µs call on the
benchmark machine, benchmarks/sync_enqueue.py). Only a dedup collision,
whose ``merge`` needs the async merge loop, goes on to the loop thread, with
the holder the script reported (nothing was written for the new job).
Everything else, and every other call, takes the portal.

One ``SyncClient`` is safe to share between threads (each call is handed to
the loop thread, or, for a direct enqueue, takes a connection of its own
from a thread-safe pool). After ``os.fork`` (gunicorn with preload, celery
prefork) the child's first call starts a fresh loop and connection pools of
its own: the parent's thread and sockets do not exist in the child.

Under gevent's monkey patching (``gunicorn -k gevent``) the loop still gets
a real OS thread and a calling greenlet waits without blocking the hub
(``green.py``); the direct enqueue runs on gevent's sockets in the greenlet.
Under eventlet's, ``SyncClient`` refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, Unpack, cast

import anyio
import redis
from anyio.from_thread import BlockingPortal

from .._model.enums import JobState, Priority
from .._model.errors import ConfigurationError
from .._model.flow import Flow
from .._model.history import HistoryPoint
from .._model.limits import LimitInfo, Rate
from .._model.records import JobInfo, JournalEntry, WorkerInfo
from .._model.schedule import ScheduleInfo
from .._model.task import Task
from .._store.keys import validate_name
from .._store.prepare import (
    ENQUEUE_OPTIONS,
    EnqueueManyOptions,
    EnqueueOptions,
    PrepareOptions,
    prepare,
    unknown_option,
)
from .._store.store import EVENTS_MAXLEN
from .._transport.blocking import blocking_redis
from .bulk import BulkFilters
from .client import Client, Queue
from .client_options import ClientOptions
from .green import start_loop_thread
from .names import Kept
from .offload import OffloadFunction
from .reads import QueueStats
from .results import OffloadHandle, OffloadResult, resolve
from .scale import ScaleTotal

P = ParamSpec("P")
R = TypeVar("R")

# Held only while a SyncClient swaps in a lock of a forked child's own (_own_lock):
# never across a wait, so no greenlet can block on it; made anew in every child.
_RENEWING = threading.Lock()


def _renewing_after_fork() -> None:
    global _RENEWING
    _RENEWING = threading.Lock()


os.register_at_fork(after_in_child=_renewing_after_fork)


class _LoopThread:
    """An event loop on a daemon thread, reachable through a BlockingPortal."""

    def __init__(self) -> None:
        self.portal: BlockingPortal | None = None
        self._aio: asyncio.AbstractEventLoop | None = None
        self._started: Future[BlockingPortal] = Future()
        self._ended: Future[None] = Future()
        # A real OS thread even under gevent's monkey patching, and a wait
        # that lets the hub run meanwhile (green.py says why).
        self._wait = start_loop_thread(self._main, "venturi-sync")
        self._green = self._wait is not Future.result
        self.portal = self._wait(self._started, None)

    def _main(self) -> None:
        async def serve() -> None:
            async with BlockingPortal() as portal:
                self._aio = asyncio.get_running_loop()
                self._started.set_result(portal)
                await portal.sleep_until_stopped()

        try:
            anyio.run(serve)
        except BaseException as exc:  # noqa: BLE001  # pragma: no cover - reported to the constructor
            if not self._started.done():
                self._started.set_exception(exc)
        finally:
            self._ended.set_result(None)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (awaited if it is async) on the loop thread, as ``BlockingPortal.call``."""
        assert self.portal is not None
        if not self._green:
            return self.portal.call(fn, *args)
        assert self._aio is not None

        # Under gevent: the portal's own hand-off waits on a concurrent Future
        # (a patched lock that another thread releases: LoopExit), so the call
        # goes in as a plain asyncio task, whose Future the greenlet awaits in
        # green.gevent_result. anyio runs in any asyncio task alike.
        async def run() -> Any:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        return self._wait(asyncio.run_coroutine_threadsafe(run(), self._aio), None)

    def stop(self) -> None:
        if self.portal is not None:
            self.call(self.portal.stop)
        with contextlib.suppress(TimeoutError):  # as a thread's join(5)
            self._wait(self._ended, 5)


def _direct_redis(client: Client) -> redis.Redis | None:
    """A blocking client for the direct single enqueue, where ``client`` has an enqueue lane."""
    if client.sender.lane is None or client.url is None:
        return None
    # As many connections as the client's own pool may open (its bound, the URL's or the keyword's).
    return blocking_redis(client.url, client.redis.connection_pool.max_connections)


class SyncClient:
    """A blocking client: ``SyncClient(url).queue(name).enqueue(task)``.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://`` or ``memory://``; ``None``
            reads ``REDIS_URL`` (then ``redis://127.0.0.1:6379/0``), like
            ``Client.from_url``.
        **options: Passed to ``Client.from_url`` (``namespace``,
            ``max_payload_bytes``, ``clock``, ``max_connections``: the bound
            of each of its two pools, the direct enqueues' and the loop's).

    Use it as a context manager, or call ``close()`` when done (at process
    exit the daemon thread simply ends).
    """

    def __init__(self, url: str | None = None, **options: Unpack[ClientOptions]) -> None:
        self._url = url
        self._options = options
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()  # the process whose lock ``_lock`` is (_own_lock)
        self._pid = -1
        self._loop: _LoopThread | None = None
        self._client: Client | None = None
        # The blocking connection pool of the direct single enqueue (None: none here).
        self._direct: redis.Redis | None = None
        # The blocking views handed out, by name, bounded as Client.queue's (names.py).
        self._kept: Kept[SyncQueue] = Kept()
        self._queues = self._kept.items  # read on every call: a plain dict's get
        self._closed = False
        self._ensure()  # a bad URL fails here, not at the first enqueue

    def _ensure(self) -> tuple[_LoopThread, Client]:
        pid = os.getpid()
        with self._own_lock(pid):
            if self._closed:
                raise ConfigurationError("this SyncClient is closed")
            if self._pid != pid or self._loop is None or self._client is None:
                # First use, or first use in a forked child: a loop of our own.
                self._loop = _LoopThread()
                url, options = self._url, self._options
                self._client = self._loop.call(lambda: Client.from_url(url, **options))
                self._direct = _direct_redis(self._client)
                self._pid = pid
            return self._loop, self._client

    def _own_lock(self, pid: int) -> threading.Lock:
        """``_lock``, made anew first in a forked child (its first call, or ``close``).

        The parent's lock may have been held by one of its threads at the
        fork. And ``gunicorn -k gevent --preload`` makes the ``SyncClient`` in
        the master, before the worker's ``monkey.patch_all()``: its lock is a
        real one, which ``_ensure`` holds while it waits (cooperatively) for
        the child's new loop; the next request greenlet then blocked the whole
        thread on it, the hub with it, and the child hung. A lock made now is
        gevent's when patched. The swap itself never yields.
        """
        if self._lock_pid != pid:
            with _RENEWING:
                if self._lock_pid != pid:
                    self._lock = threading.Lock()
                    self._lock_pid = pid
        return self._lock

    # ``fn`` positional-only: an offloaded function's own parameter may be named ``fn``.
    def _call(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        loop, _ = self._ensure()

        async def run() -> Any:
            return await fn(*args, **kwargs)

        return loop.call(run)

    @property
    def client(self) -> Client:
        """The async ``Client`` underneath (use it only from the loop thread)."""
        return self._ensure()[1]

    def queue(self, name: str = "default") -> SyncQueue:
        """The blocking view of queue ``name`` (kept as ``Client.queue`` keeps its queues: the
        last 1,024 names made)."""
        q = self._queues.get(name)
        if q is None:
            q = self._kept.make(name, self._new_queue)
        return q

    def _new_queue(self, name: str) -> SyncQueue:
        return SyncQueue(self, name)

    def scale_total(self, queues: Sequence[str] = (), *, prefix: str | None = None) -> ScaleTotal:
        """Blocking ``Client.scale_total``: the autoscaling signal summed over many queues."""
        client = self._ensure()[1]
        return cast(ScaleTotal, self._call(client.scale_total, queues, prefix=prefix))

    def offload(self, fn: OffloadFunction[P, R], /, *args: P.args, **kwargs: P.kwargs) -> OffloadHandle[R]:
        """Blocking ``await fn.offload(client, ...)`` for an ``@vr.offload`` function, ``def`` or
        ``async def``: enqueue a call to ``fn``'s queue and return its handle at once.

        Arguments that do not validate raise here, as the async call's do, and write nothing.
        """
        client = self._ensure()[1]
        result: OffloadHandle[R] = self._call(fn.offload, client, *args, **kwargs)
        return result

    def resolve(self, handle: OffloadHandle[R], *, timeout: float | timedelta | None) -> OffloadResult[R]:
        """Blocking ``vr.resolve``: wait for an offloaded call to settle and return its result.

        On timeout the result is ``pending`` and nothing is cancelled; a view (Django, Flask)
        should pass a short one. Raises ``vr.OffloadNotFound`` as ``vr.resolve`` does.
        """
        client = self._ensure()[1]
        result: OffloadResult[R] = self._call(resolve, client, handle, timeout=timeout)
        return result

    def close(self) -> None:
        """Close the connection pool and stop the loop thread."""
        with self._own_lock(os.getpid()):
            if self._closed:
                return
            self._closed = True
            loop, client, direct = self._loop, self._client, self._direct
            self._loop = self._client = self._direct = None
        if loop is not None and client is not None and self._pid == os.getpid():
            loop.call(client.aclose)
            loop.stop()
            if direct is not None:
                direct.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncQueue:
    """Blocking twin of ``vr.Queue``: same arguments, same semantics, same scripts."""

    def __init__(self, sync_client: SyncClient, name: str) -> None:
        self._sc = sync_client
        self.name = validate_name(name)  # a bad name fails now, not at the first call

    def _queue(self) -> Queue:
        return self._sc.client.queue(self.name)

    def __repr__(self) -> str:
        return f"<SyncQueue {self.name!r}>"

    def enqueue(self, task: Task[Any], **options: Unpack[EnqueueOptions]) -> str:
        """Enqueue one task and return its job id (see ``Queue.enqueue``; dedup merges included)."""
        loop, client = self._sc._ensure()
        direct = self._sc._direct
        q = client.queue(self.name)
        if direct is None or "after" in options or "at" in options:
            result: str = loop.call(lambda: q.enqueue(task, **options))
            return result
        # The direct path (module docstring): Queue.enqueue's own steps, from this thread.
        bad = unknown_option(options, ENQUEUE_OPTIONS, "enqueue")
        if bad is not None:
            raise bad
        job = prepare(task, client.max_payload_bytes, client.encryption, **cast("PrepareOptions", options))
        if client._recorded.due(self.name):  # the registry of queues (registry.py), once
            client._recorded.record_blocking(direct, self.name)
        holder = q.store.enqueue_blocking(direct, job)
        if not holder:
            return job.id
        from .dedup import merge_into

        merged: str = loop.call(merge_into, q, task, job, holder)
        return merged

    def enqueue_flow(self, parent: Task[Any], children: Sequence[Task[Any] | Flow]) -> Flow:
        """Enqueue ``children`` and ``parent`` waiting on them, atomically (see ``Queue.enqueue_flow``)."""
        result: Flow = self._sc._call(self._queue().enqueue_flow, parent, children)
        return result

    def enqueue_many(self, tasks: Sequence[Task[Any]], **options: Unpack[EnqueueManyOptions]) -> list[str]:
        """Enqueue many tasks in one round trip (see ``Queue.enqueue_many``)."""
        q = self._queue()
        result: list[str] = self._sc._call(q.enqueue_many, tasks, **options)
        return result

    def get(self, job_id: str) -> JobInfo | None:
        """A snapshot of the job, or ``None``."""
        result: JobInfo | None = self._sc._call(self._queue().get, job_id)
        return result

    def journal(self, job_id: str) -> list[JournalEntry]:
        """The job's journal, oldest first."""
        result: list[JournalEntry] = self._sc._call(self._queue().journal, job_id)
        return result

    def resume(self, job_id: str, value: Any = None) -> int:
        """Resume a suspended job with ``value``; 1, or 0 if it is not suspended."""
        result: int = self._sc._call(self._queue().resume, job_id, value)
        return result

    def update(
        self,
        job_id: str,
        *,
        task: Task[Any] | None = None,
        priority: Priority | int | str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Change a pending job in place; False if it is not pending (see ``Queue.update``)."""
        result: bool = self._sc._call(
            self._queue().update, job_id, task=task, priority=priority, delay=delay, at=at
        )
        return result

    def cancel(self, job_id: str) -> str:
        """Cancel a job (see ``Queue.cancel``)."""
        result: str = self._sc._call(self._queue().cancel, job_id)
        return result

    def counts(self) -> dict[str, int]:
        """Jobs per state (see ``Queue.counts``)."""
        result: dict[str, int] = self._sc._call(self._queue().counts)
        return result

    def workers(self) -> list[WorkerInfo]:
        """The workers consuming this queue now (see ``Queue.workers``)."""
        result: list[WorkerInfo] = self._sc._call(self._queue().workers)
        return result

    def wait(self, job_id: str, *, timeout: float | timedelta | None = None) -> JobInfo:
        """Block until the job has finished and return it (see ``Queue.wait``).

        A view (Django, Flask) should pass a ``timeout``: a request thread waits
        as long as it says.
        """
        result: JobInfo = self._sc._call(self._queue().wait, job_id, timeout=timeout)
        return result

    def set_events(self, enabled: bool, *, maxlen: int = EVENTS_MAXLEN) -> None:
        """Switch this queue's event stream on or off (see ``Queue.set_events``)."""
        self._sc._call(self._queue().set_events, enabled, maxlen=maxlen)

    def is_drained(self) -> bool:
        """Nothing pending and nothing running (see ``Queue.is_drained``)."""
        result: bool = self._sc._call(self._queue().is_drained)
        return result

    def stats(self) -> QueueStats:
        """Counts per state and priority, lag and throughput (see ``Queue.stats``)."""
        result: QueueStats = self._sc._call(self._queue().stats)
        return result

    def list_jobs(
        self, *, state: JobState | str | None = None, kind: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """Jobs read from the index zsets (see ``Queue.list_jobs``)."""
        result: list[JobInfo] = self._sc._call(self._queue().list_jobs, state=state, kind=kind, limit=limit)
        return result

    def retry(self, job_id: str) -> bool:
        """Move a dead job back to pending; False if it is not dead (see ``Queue.retry``)."""
        result: bool = self._sc._call(self._queue().retry, job_id)
        return result

    def retry_dead(
        self,
        **filters: Unpack[BulkFilters],
    ) -> list[str]:
        """Move dead jobs back to pending; returns their ids (see ``Queue.retry_dead``;
        ``on_progress`` is called in the client's event loop thread)."""
        result: list[str] = self._sc._call(
            self._queue().retry_dead,
            **filters,
        )
        return result

    def cancel_jobs(
        self,
        state: str = "pending",
        **filters: Unpack[BulkFilters],
    ) -> list[str]:
        """Cancel the matching jobs of ``state``; returns their ids (see ``Queue.cancel_jobs``)."""
        result: list[str] = self._sc._call(
            self._queue().cancel_jobs,
            state,
            **filters,
        )
        return result

    def pause(self) -> None:
        """Pause claims on this queue (see ``Queue.pause``)."""
        self._sc._call(self._queue().pause)

    def resume_queue(self) -> None:
        """Let workers claim from this queue again (see ``Queue.resume_queue``)."""
        self._sc._call(self._queue().resume_queue)

    def pause_key(self, key: str) -> bool:
        """Stop the jobs of an order key from starting (see ``Queue.pause_key``)."""
        result: bool = self._sc._call(self._queue().pause_key, key)
        return result

    def resume_key(self, key: str) -> bool:
        """Let the jobs of an order key run again (see ``Queue.resume_key``)."""
        result: bool = self._sc._call(self._queue().resume_key, key)
        return result

    def purge(
        self,
        state: str,
        *,
        older_than: float | timedelta = 0.0,
        **filters: Unpack[BulkFilters],
    ) -> int:
        """Remove finished jobs of ``state`` and their journals (see ``Queue.purge``)."""
        result: int = self._sc._call(
            self._queue().purge,
            state,
            older_than=older_than,
            **filters,
        )
        return result

    def history(
        self, *, since: timedelta = timedelta(hours=1), kind: str | None = None, step: timedelta | None = None
    ) -> list[HistoryPoint]:
        """The queue's metrics history, step by step (see ``Queue.history``)."""
        result: list[HistoryPoint] = self._sc._call(self._queue().history, since=since, kind=kind, step=step)
        return result

    def set_history(self, enabled: bool) -> None:
        """Switch this queue's metrics history on or off (see ``Queue.set_history``)."""
        self._sc._call(self._queue().set_history, enabled)

    # -- schedules (see Queue.schedule; docs/schedules.md) ----------------------------

    def schedule(
        self,
        schedule_id: str,
        task: Task[Any],
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        priority: Priority | int | str | None = None,
    ) -> ScheduleInfo:
        """Create or replace the schedule ``schedule_id`` (see ``Queue.schedule``)."""
        result: ScheduleInfo = self._sc._call(
            self._queue().schedule,
            schedule_id,
            task,
            cron=cron,
            every=every,
            tz=tz,
            start_at=start_at,
            end_at=end_at,
            priority=priority,
        )
        return result

    def unschedule(self, schedule_id: str) -> bool:
        """Remove the schedule; True if it existed (see ``Queue.unschedule``)."""
        result: bool = self._sc._call(self._queue().unschedule, schedule_id)
        return result

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """The schedule, or None (see ``Queue.get_schedule``)."""
        result: ScheduleInfo | None = self._sc._call(self._queue().get_schedule, schedule_id)
        return result

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule of this queue (see ``Queue.schedules``)."""
        result: list[ScheduleInfo] = self._sc._call(self._queue().schedules)
        return result

    def pause_schedule(self, schedule_id: str) -> bool:
        """Stop firing the schedule until resumed (see ``Queue.pause_schedule``)."""
        result: bool = self._sc._call(self._queue().pause_schedule, schedule_id)
        return result

    def resume_schedule(self, schedule_id: str) -> bool:
        """Fire the schedule again from its next fire time (see ``Queue.resume_schedule``)."""
        result: bool = self._sc._call(self._queue().resume_schedule, schedule_id)
        return result

    def trigger_schedule(self, schedule_id: str) -> str | None:
        """One extra job of the schedule now (see ``Queue.trigger_schedule``)."""
        result: str | None = self._sc._call(self._queue().trigger_schedule, schedule_id)
        return result

    # -- flow control (see Queue.set_limit; docs/flow-control.md) ------------------------

    def set_limit(
        self,
        kind: str,
        *,
        concurrency: int | None = None,
        rate: Rate | None = None,
        per_key: bool = False,
    ) -> None:
        """Cap the runs of ``kind`` (see ``Queue.set_limit``)."""
        self._sc._call(self._queue().set_limit, kind, concurrency=concurrency, rate=rate, per_key=per_key)

    def clear_limit(self, kind: str, *, per_key: bool = False) -> bool:
        """Remove a limit of ``kind`` (see ``Queue.clear_limit``); False when it had none."""
        result: bool = self._sc._call(self._queue().clear_limit, kind, per_key=per_key)
        return result

    def limits(self, *, keys: int = 50) -> list[LimitInfo]:
        """The queue's limits, with the busiest keys of per-key ones (see ``Queue.limits``)."""
        result: list[LimitInfo] = self._sc._call(self._queue().limits, keys=keys)
        return result
