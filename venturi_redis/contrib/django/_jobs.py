"""A Django task call as a venturi job, and a venturi job read back as a Django ``TaskResult``.

Producer side only: the backend (in the web process) and the worker both use
it; nothing here imports the worker.

Each task function is a KIND of its own, its module path
(``shop.tasks.send_welcome``), so ``venturi jobs --kind``, the dashboard,
limits and metrics tell tasks apart, and ``venturi job show`` names the task
without ``--show-payload``.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from ..._model.enums import JobState, Priority
from ..._model.records import JobInfo, JournalEntry
from ..._model.task import Task as VenturiTask
from . import _compat

_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


class TaskCancelled(Exception):
    """The error a cancelled task's result lists: its job was cancelled (``venturi job cancel``).

    Never raised: it names what happened in ``TaskResult.errors`` (a Django
    result that is ``FAILED`` always has an error to show).
    """


# Its path in a TaskError (the public name: TaskError.exception_class imports it).
CANCELLED_PATH = "venturi_redis.contrib.django.TaskCancelled"


class DjangoCall(VenturiTask):
    """One call of a Django ``@task`` function: which function, with what, for which backend.

    The base of every task's own class (``call_class``), whose KIND is the
    function's module path. ``task`` repeats that path; a worker runs a job
    only if it found that function among the tasks it discovered (it never
    imports a name read from Redis).
    """

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str


_classes: dict[str, type[DjangoCall]] = {}
_classes_lock = threading.Lock()


def call_class(path: str) -> type[DjangoCall]:
    """The ``DjangoCall`` class of the task at ``path``: KIND = ``path``, made once per process."""
    with _classes_lock:
        cls = _classes.get(path)
        if cls is None:
            name = f"DjangoCall[{path}]"
            attrs: dict[str, Any] = {"KIND": path, "__module__": __name__, "__qualname__": name}
            attrs["__annotations__"] = {"KIND": ClassVar[str]}
            cls = _classes[path] = type(name, (DjangoCall,), attrs)
        return cls


# Every Django task this process has seen, by module path: the ones it enqueued
# and the ones discovery found. A name read from Redis is looked up here, never
# imported.
_known: dict[str, Any] = {}
_known_lock = threading.Lock()


def _definition(task: Any) -> Any:
    """The module-level task ``task`` was made from (``task.using(...)`` makes copies).

    A result read back names the task as defined, as Django's other backends
    do (the priority given to ``using`` is not stored with the result).
    """
    func = getattr(task, "func", None)
    module = sys.modules.get(getattr(func, "__module__", ""))
    defined = getattr(module, getattr(func, "__name__", ""), None)
    if isinstance(defined, _compat.Task) and defined.func is func:
        return defined
    return task


def remember(task: Any) -> None:
    with _known_lock:
        _known.setdefault(task.module_path, _definition(task))


def remember_all(tasks: Iterable[Any]) -> None:
    for task in tasks:
        remember(task)


def known(path: str) -> Any | None:
    return _known.get(path)


def known_tasks() -> dict[str, Any]:
    with _known_lock:
        return dict(_known)


def is_job_id(value: str) -> bool:
    return bool(_ULID.fullmatch(value))


def priority_of(django_priority: int) -> Priority:
    """Django's -100..100 (0 by default) on venturi's four levels."""
    if django_priority > 50:
        return Priority.CRITICAL
    if django_priority > 0:
        return Priority.HIGH
    if django_priority == 0:
        return Priority.NORMAL
    return Priority.LOW


_STATUS = {
    JobState.PENDING: "READY",
    JobState.WAITING: "READY",
    JobState.RUNNING: "RUNNING",
    JobState.SUSPENDED: "RUNNING",
    JobState.COMPLETED: "SUCCESSFUL",
    JobState.DEAD: "FAILED",
    JobState.CANCELLED: "FAILED",
}


def class_path(error_type: str) -> str:
    """A journal's ``error_type`` (``ValueError``, ``shop.errors.OutOfStock``) as Django's class path."""
    if not error_type:
        return "builtins.Exception"
    return error_type if "." in error_type else f"builtins.{error_type}"


def error_of(entry: JournalEntry) -> Any:
    """The Django ``TaskError`` of one journal entry (a failure, a death, a cancellation)."""
    if entry.event == "cancelled":
        note = entry.note or "the job was cancelled"
        return _compat.TaskError(exception_class_path=CANCELLED_PATH, traceback=f"{CANCELLED_PATH}: {note}\n")
    doc = entry.attachment if isinstance(entry.attachment, dict) else {}
    # The journal keeps the exception's type and its traceback's tail; a
    # SystemExit or KeyboardInterrupt, recorded as a TaskError so that the
    # worker goes on, names its own class in the attachment.
    path = str(doc.get("exception_class_path") or class_path(entry.details.get("error_type", "")))
    text = entry.details.get("traceback") or entry.note or ""
    return _compat.TaskError(
        exception_class_path=path, traceback=text if text.endswith("\n") else text + "\n"
    )


def errors_of(journal: Sequence[JournalEntry]) -> list[Any]:
    """Django ``TaskError``s from the journal: each failed run, and a cancellation."""
    out = []
    # A run that fails its last allowed time is journaled "failed" and then
    # "dead": one error. A "dead" alone (a permanent error, an unknown task)
    # is its run's error.
    failed_runs = {e.run for e in journal if e.event == "failed"}
    for entry in journal:
        if entry.event in ("failed", "cancelled") or (entry.event == "dead" and entry.run not in failed_runs):
            out.append(error_of(entry))
    return out


def build_result(
    task: Any,
    *,
    job_id: str,
    status: str,
    call: DjangoCall,
    enqueued_at: datetime | None,
    finished_at: datetime | None,
    journal: Sequence[JournalEntry],
    return_value: Any = None,
) -> Any:
    """A Django ``TaskResult`` for job ``job_id`` of ``task`` from what the journal says."""
    claims = [e for e in journal if e.event == "claimed"]
    result = _compat.TaskResult(
        task=task,
        id=job_id,
        status=_compat.TaskResultStatus[status],
        enqueued_at=enqueued_at,
        started_at=claims[0].at if claims else None,
        finished_at=finished_at,
        last_attempted_at=claims[-1].at if claims else None,
        args=list(call.args),
        kwargs=dict(call.kwargs),
        backend=call.backend,
        errors=errors_of(journal),
        worker_ids=[e.details.get("worker", "") for e in claims],
    )
    if status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", return_value)
    return result


def as_call(info: JobInfo) -> DjangoCall | None:
    """The Django call a job holds, or None when it is not one (another kind of job).

    Raises:
        ValueError: The payload names the job's KIND as its task, as a Django
            call's does, but does not validate as one (edited by hand).
    """
    payload = info.payload
    if not isinstance(payload, dict) or payload.get("task") != info.kind:
        return None
    return DjangoCall.model_validate(payload)


def result_from_job(task: Any, info: JobInfo, call: DjangoCall, journal: Sequence[JournalEntry]) -> Any:
    return build_result(
        task,
        job_id=info.id,
        status=_STATUS[info.state],
        call=call,
        enqueued_at=info.created_at,
        finished_at=info.finished_at,
        journal=journal,
        return_value=info.result,
    )
