"""``VenturiBackend``: Django's Tasks framework enqueuing onto venturi queues.

Settings::

    TASKS = {
        "default": {
            "BACKEND": "venturi_redis.contrib.django.VenturiBackend",
            "QUEUES": ["default", "emails"],  # Django's queue names this backend takes
            "OPTIONS": {"url": "redis://127.0.0.1:6379/0", "queue": "default"},
        }
    }

The web process only enqueues and reads results, through a ``vr.SyncClient``
shared by every backend instance with the same URL (one event-loop thread
per URL, not per request thread).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from redis.exceptions import ResponseError

from ..._model.errors import ConfigurationError, CorruptQueueError, PayloadError
from ..._producer.sync import SyncClient, SyncQueue
from . import _compat
from ._jobs import as_call, call_class, is_job_id, known, priority_of, remember, result_from_job

_clients: dict[str, SyncClient] = {}
_clients_lock = threading.Lock()


def sync_client(url: str) -> SyncClient:
    """The process's one ``SyncClient`` for ``url``."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = SyncClient(url)
        return client


class VenturiBackend(_compat.BaseTaskBackend):
    """A Django Tasks backend whose tasks run as venturi jobs.

    ``OPTIONS``:

    - ``url``: the Redis URL (default: ``REDIS_URL``, then ``redis://127.0.0.1:6379/0``);
    - ``queue``: the venturi queue for Django's ``"default"`` queue name (default
      ``"default"``); any other ``queue_name`` is used as the venturi queue's name;
    - ``max_failures``: failed runs before a task is ``FAILED`` for good (default
      1: Django's tasks are not retried unless you ask; with more, a failed run is
      retried after venturi's backoff and the result reads ``READY`` meanwhile,
      its ``errors`` listing each failure).

    A task's ``priority`` (-100..100) maps onto venturi's levels: above 50
    critical, 1..50 high, 0 normal, below 0 low. ``run_after`` becomes the
    job's delay.

    ``QUEUES`` lists the Django queue names it takes, and its worker consumes
    exactly those. ``QUEUES: []`` (Django's "any name") is taken as
    ``["default"]``, as the RQ backend takes it as its configured queues: a
    name no worker consumes would be enqueued and never run.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # QUEUES: [] would accept any name; a worker consumes only names it knows.
        listed: set[str] = set(self.queues)
        self._no_queues_listed = not listed
        self.queues: set[str] = listed or {_compat.DEFAULT_TASK_QUEUE_NAME}
        options: dict[str, Any] = dict(params.get("OPTIONS", {}))
        self.url: str = options.pop("url", None) or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.default_queue: str = options.pop("queue", "default")
        self.max_failures: int | None = options.pop("max_failures", 1)
        if options:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(options)}: "
                "use url, queue and max_failures"
            )

    # -- names -------------------------------------------------------------------

    def venturi_queue(self, queue_name: str) -> str:
        """The venturi queue a Django ``queue_name`` goes to."""
        return self.default_queue if queue_name == _compat.DEFAULT_TASK_QUEUE_NAME else queue_name

    def venturi_queues(self) -> list[str]:
        """Every venturi queue of this backend (what its worker consumes)."""
        return sorted({self.venturi_queue(name) for name in self.queues})

    def _queue(self, queue_name: str) -> SyncQueue:
        return sync_client(self.url).queue(self.venturi_queue(queue_name))

    # -- the contract ----------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        if task.queue_name not in self.queues:
            listed = sorted(self.queues)
            why = (
                f"TASKS[{self.alias!r}] has QUEUES: [], which VenturiBackend takes as {listed}"
                if self._no_queues_listed
                else f"TASKS[{self.alias!r}]['QUEUES'] is {listed}"
            )
            # Django's own sentence first (its tests match on it), then why and what to do.
            raise _compat.InvalidTaskError(
                f"Queue '{task.queue_name}' is not valid for backend. {why}, and its worker consumes only "
                f"those; add {task.queue_name!r} to QUEUES to run tasks there"
            )
        super().validate_task(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        remember(task)
        now = datetime.now(UTC)
        delay = timedelta(0)
        if task.run_after is not None:
            delay = max(timedelta(0), _aware(task.run_after) - now)
        # A TaskResult first: it normalises args and kwargs to JSON, refusing
        # what cannot be (the same check Django's own backends make).
        pending = _compat.TaskResult(
            task=task,
            id="",
            status=_compat.TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        path = task.module_path
        # As the job will hold them: JSON's own (a dict's int keys become
        # strings), so that the result returned here is what get_result()
        # reads back and the task is called with; a NaN or an infinity, which
        # would be stored as null, is refused.
        args, kwargs = _as_stored(path, pending.args), _as_stored(path, pending.kwargs)
        object.__setattr__(pending, "args", args)
        object.__setattr__(pending, "kwargs", kwargs)
        call = call_class(path)(task=path, args=args, kwargs=kwargs, backend=self.alias)
        queue = self._queue(task.queue_name)
        job_id = queue.enqueue(
            call, delay=delay, priority=priority_of(task.priority), max_failures=self.max_failures
        )
        # The stored creation time (Redis's clock, to the millisecond), read
        # back: get_result() reads the same, so the two results compare equal
        # and refresh() changes nothing on a READY one. One round trip more.
        info = queue.get(job_id)
        object.__setattr__(pending, "id", job_id)
        object.__setattr__(pending, "enqueued_at", info.created_at if info is not None else now)
        _compat.task_enqueued.send(type(self), task_result=pending)
        return pending

    def get_result(self, result_id: str) -> Any:
        if is_job_id(result_id):
            for name in self.venturi_queues():
                queue = sync_client(self.url).queue(name)
                try:
                    info = queue.get(result_id)
                except ResponseError as exc:
                    raise _corrupt(result_id, name, "its key is not a hash", exc) from None
                if info is not None and (damaged := sorted(set(info.corrupt) & _READ_FIELDS)):
                    raise _corrupt(result_id, name, f"its fields {', '.join(damaged)} do not parse")
                try:
                    call = None if info is None else as_call(info)
                except ValueError as exc:
                    first = str(exc).splitlines()[1:2] or [type(exc).__name__]
                    raise _corrupt(result_id, name, f"its payload is no task call ({first[0]})") from None
                if info is None or call is None:
                    continue
                path = call.task
                task = known(path)
                if task is None:
                    from ._discovery import discover

                    discover()  # the app's tasks modules, named by settings, never by Redis
                    task = known(path)
                if task is None:
                    raise _compat.TaskResultDoesNotExist(
                        f"{result_id}: its task {path!r} is not among this process's tasks"
                    )
                try:
                    journal = queue.journal(result_id)
                except ResponseError as exc:
                    raise _corrupt(result_id, name, "its journal is not a stream", exc) from None
                if damaged_entries := ", ".join(e.id for e in journal if e.corrupt):
                    raise _corrupt(result_id, name, f"its journal entries {damaged_entries} do not parse")
                return result_from_job(task, info, call, journal)
        raise _compat.TaskResultDoesNotExist(result_id)


# The fields of a job's hash a result is read from: one that does not parse
# would be shown as its neutral default (JobInfo.corrupt), and so a result
# that is not true (a lost return value read as None, a completed task READY).
_READ_FIELDS = frozenset({"key", "state", "kind", "payload", "result", "created_at", "finished_at"})


def _corrupt(job_id: str, queue: str, why: str, error: ResponseError | None = None) -> Exception:
    """The error of a job whose data a result cannot be read from (``error``: Redis's, a WRONGTYPE)."""
    if error is not None and "WRONGTYPE" not in str(error):
        return error  # not the job's data: Redis's own error, as is
    return CorruptQueueError(
        f"{job_id}: the job of queue {queue!r} is corrupt, {why}: its result cannot be read; "
        f"`venturi job show {job_id} --queue {queue}` shows what is stored"
    )


def _aware(when: datetime) -> datetime:
    """``run_after`` as an aware time: a naive one is in the current time zone (USE_TZ = False)."""
    return when if timezone.is_aware(when) else timezone.make_aware(when)


def _as_stored(path: str, value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except ValueError:
        raise PayloadError(
            f"the arguments of task {path!r} hold a float JSON cannot store (NaN or infinity): "
            "pass it as a string, or None"
        ) from None
