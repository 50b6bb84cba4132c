"""A Django task call as a venturi job, and a venturi job read back as a Django ``TaskResult``.

Producer side only: the backend (in the web process) and the worker both use
it; nothing here imports the worker.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from ..._model.enums import JobState, Priority
from ..._model.records import JobInfo, JournalEntry
from ..._model.task import Task as VenturiTask
from . import _compat

KIND = "django.task"
_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


class DjangoCall(VenturiTask):
    """One call of a Django ``@task`` function: which function, with what, for which backend.

    ``task`` is the function's module path; a worker runs it only if it found
    that function among the tasks it discovered (it never imports a name read
    from Redis).
    """

    KIND: ClassVar[str] = KIND
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str


# Every Django task this process has seen, by module path: the ones it enqueued
# and the ones discovery found. A name read from Redis is looked up here, never
# imported.
_known: dict[str, Any] = {}
_known_lock = threading.Lock()


def remember(task: Any) -> None:
    with _known_lock:
        _known.setdefault(task.module_path, task)


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


def errors_of(journal: Sequence[JournalEntry]) -> list[Any]:
    """Django ``TaskError``s from the journal's failures (their attachments)."""
    out = []
    # A run that fails its last allowed time is journaled "failed" and then
    # "dead": one error. A "dead" alone (a permanent error, an unknown task)
    # is its run's error.
    failed_runs = {e.run for e in journal if e.event == "failed"}
    for entry in journal:
        if entry.event != "failed" and not (entry.event == "dead" and entry.run not in failed_runs):
            continue
        doc = entry.attachment if isinstance(entry.attachment, dict) else {}
        out.append(
            _compat.TaskError(
                exception_class_path=str(doc.get("exception_class_path") or "builtins.Exception"),
                traceback=str(doc.get("traceback") or entry.note or ""),
            )
        )
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


def result_from_job(task: Any, info: JobInfo, journal: Sequence[JournalEntry]) -> Any:
    call = DjangoCall.model_validate(info.payload)
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
