"""Which job a log record belongs to: the run's context, and ``vr.JobLogFilter`` that copies it.

While a run executes, a contextvar says which job: a slot task's holds the
slot's ``Slot``, whose ``job`` is set around each run (runner.py); a batch's
task holds its ``BatchRun`` (batch.py); a sync handler's thread runs in a
copy of the context it was called from with the job itself (threads.py);
every task the handler starts copies the context it was started in. Any
record logged there, by the handler's own logger or a library's (httpx,
botocore), can then say which job it belongs to; nothing is done to a
record until a handler or logger the application configured runs
``JobLogFilter`` (importing the package changes no logging set-up:
no record factory is installed).

``JobLogFilter`` sets six attributes on every record it sees (None outside
a run, or '' for ``venturi_job``, so a format string naming them never fails):

- ``venturi_job_id``, ``venturi_kind``, ``venturi_queue``, ``venturi_run``
  (the run number: 1 for a job's first run);
- ``venturi_batch``: for a batch handler's call, ``"LEAD of N"`` (LEAD its
  first job, as the jobs' notes mark it: ``[batch LEAD of N]``), with
  ``venturi_job_id`` and ``venturi_run`` None, since the call runs N jobs;
  None for any other record;
- ``venturi_job``: all of it as one piece of text for a format string to
  end with, `` [KIND JOB_ID run N]`` (a batch's call: `` [KIND batch LEAD
  of N]``), '' outside a run: what ``venturi worker``'s text lines end with.

A record that already carries ``venturi_job_id`` (the worker's own lines
about one job, logged with ``extra=job_fields(job)`` from a task that runs no
job: the completer's) keeps them (``venturi_job`` is added).

The lines ``Worker(log_runs=True)`` logs, one per finished run, are
``run_ended``'s.
"""

from __future__ import annotations

import logging
from contextvars import Context, ContextVar
from typing import TYPE_CHECKING, Any

from .._model.endings import Completed, Dead, Ending, Failed, Paused, Released, Suspended

if TYPE_CHECKING:
    from .._store.store import Transition
    from .job import Job

log = logging.getLogger("venturi_redis.worker")


class BatchRun:
    """What a batch handler's call holds in ``RUNNING``: its KIND, queue, and first job and size."""

    __slots__ = ("batch", "kind", "queue")

    def __init__(self, jobs: list[Job]) -> None:
        self.kind = jobs[0].kind
        self.queue = jobs[0].queue.name
        self.batch = f"{jobs[0].id} of {len(jobs)}"


class Slot:
    """A slot task's holder of the job it runs (``job``; None between runs).

    Set in the slot task's context once, when the task starts (runner.py);
    each run then costs two attribute stores, not a ``ContextVar.set`` and
    ``reset`` (~2,600 instructions, 3% of a no-op job's worker cost:
    docs/observability.md, "Logs"). A task the handler starts shares
    the holder: while the run lasts it says the run's job; left running
    after the run returned, it says whatever its slot runs then. A sync
    handler's thread gets the job itself (``pinned``): an abandoned thread
    (its run timed out) still says its own.
    """

    __slots__ = ("job",)

    def __init__(self) -> None:
        self.job: Job | None = None


# What is executing here: a slot task's Slot, a batch's call (a BatchRun), a
# sync handler's job (a Job, pinned in its thread's context), or None.
RUNNING: ContextVar[Any] = ContextVar("venturi_redis_running", default=None)


def pinned(context: Context) -> Context:
    """``context`` (a copy of the caller's, for a thread) with a slot's job in place of the slot."""
    running = context.get(RUNNING)
    if running.__class__ is Slot:
        context.run(RUNNING.set, running.job)
    return context


def job_fields(job: Job) -> dict[str, Any]:
    """The attributes of a record about ``job``, for ``extra=`` (a line of the worker's own)."""
    return {
        "venturi_job_id": job.id,
        "venturi_kind": job.kind,
        "venturi_queue": job.queue.name,
        "venturi_run": job.run_count,
        "venturi_batch": None,
    }


class JobLogFilter(logging.Filter):
    """Copies the running job's fields onto each record (None outside a run); never drops one.

    Put it on a *handler* (a logger's filters see only the records logged on
    that very logger, not its children's): ``venturi worker`` puts it on the
    handler it configures, and a Django project names it in ``LOGGING``
    (``"()": "venturi_redis.JobLogFilter"``; docs/observability.md, "Logs").
    With a ``QueueHandler``, it goes on the ``QueueHandler``, which runs in
    the thread that logged, not on the listener's handlers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        d = record.__dict__
        if "venturi_job_id" in d:  # about one job already (extra=), or filtered by another handler
            if "venturi_job" not in d:
                d["venturi_job"] = text_suffix(record)
            return True
        running = RUNNING.get()
        if running.__class__ is Slot:
            running = running.job
        if running is None:
            d["venturi_job_id"] = d["venturi_kind"] = d["venturi_queue"] = None
            d["venturi_run"] = d["venturi_batch"] = None
        elif running.__class__ is BatchRun:
            d["venturi_job_id"] = d["venturi_run"] = None
            d["venturi_kind"] = running.kind
            d["venturi_queue"] = running.queue
            d["venturi_batch"] = running.batch
        else:
            d["venturi_job_id"] = running.id
            d["venturi_kind"] = running.kind
            d["venturi_queue"] = running.queue.name
            d["venturi_run"] = running.run_count
            d["venturi_batch"] = None
        d["venturi_job"] = text_suffix(record)
        return True


def text_suffix(record: logging.LogRecord) -> str:
    """`` [KIND JOB_ID run N]`` (a batch's call: `` [KIND batch LEAD of N]``) for a record
    about a job, '' for any other: what ``venturi worker``'s text lines end with."""
    d = record.__dict__
    kind = d.get("venturi_kind")
    if kind is None:
        return ""
    batch = d.get("venturi_batch")
    if batch is not None:
        return f" [{kind} batch {batch}]"
    return f" [{kind} {d.get('venturi_job_id')} run {d.get('venturi_run')}]"


def json_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields ``venturi worker --json`` adds to a record about a job: ``job_id``,
    ``kind``, ``queue``, ``run`` (a batch's call: ``kind``, ``queue``, ``batch``);
    none for any other record (absent, not null)."""
    d = record.__dict__
    kind = d.get("venturi_kind")
    if kind is None:
        return {}
    batch = d.get("venturi_batch")
    if batch is not None:
        return {"kind": kind, "queue": d.get("venturi_queue"), "batch": batch}
    return {
        "job_id": d.get("venturi_job_id"),
        "kind": kind,
        "queue": d.get("venturi_queue"),
        "run": d.get("venturi_run"),
    }


def run_ended(job: Job, ending: Ending, result: Transition, seconds: float) -> None:
    """``Worker(log_runs=True)``'s INFO line for one finished run, its ending as written.

    ``result``: the ending script's reply (a failed run's ``'pending'``, with
    the delay and failure count the retry script wrote, or ``'dead'`` at the
    backstop); ``seconds``: from the claim to the written ending, as the
    ``job_finished`` metric's.
    """
    if isinstance(ending, Completed):
        how = _noted("completed", ending.note)
    elif isinstance(ending, Failed):
        if result.detail == "dead":
            how = f"dead (max_failures): {_error(ending)}"
        else:
            retry = f"retry in {result.delay_ms / 1000:g} s (failure {result.failures})"
            how = f"failed, {retry}: {_error(ending)}"
    elif isinstance(ending, Dead):
        how = f"dead ({ending.reason.value}): {_error(ending)}"
    elif isinstance(ending, Paused):
        how = _noted(f"paused for {ending.delay_ms / 1000:g} s", ending.note)
    elif isinstance(ending, Suspended):
        how = _noted("suspended", ending.note)
    elif isinstance(ending, Released):
        how = f"released: {ending.note}"
    else:
        how = f"cancelled: {ending.note}"
    log.info(
        "job %s (%s) on queue %s run %d: %s in %.1f ms",
        job.id,
        job.kind,
        job.queue.name,
        job.run_count,
        how,
        seconds * 1000,
        extra=job_fields(job),
    )


def _noted(how: str, note: str) -> str:
    return f"{how}: {note}" if note else how


def _error(ending: Failed | Dead) -> str:
    """A failure's exception type and note, as the failed-run WARNING has them."""
    return f"{ending.error_type}: {ending.note}" if ending.error_type else ending.note
