"""The worker side: run Django tasks enqueued by ``VenturiBackend``.

``python manage.py venturi_worker`` (with ``venturi_redis.contrib.django`` in
INSTALLED_APPS), or ``venturi worker venturi_redis.contrib.django.worker:make_worker``
with ``DJANGO_SETTINGS_MODULE`` set: both build the worker with ``make_worker``.
"""

from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Any

import anyio
from django.db import close_old_connections

from ..._model.errors import TaskError
from ..._model.outcome import Outcome
from ..._model.task import NoCarry
from ..._producer.client import Client
from ..._worker.context import Context
from ..._worker.handler import Handler
from ..._worker.worker import Worker
from . import _compat
from ._jobs import DjangoCall, build_result


@dataclass
class DjangoWorkerState:
    """What every run needs: the backend (for its alias and signals) and the tasks found."""

    backend: Any
    tasks: dict[str, Any] = field(default_factory=dict)
    worker_id: str = ""  # the vr.Worker's id: what TaskResult.worker_ids lists


def _run_sync(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    # A worker thread holds its own database connection: drop it if it went
    # stale, as Django does around each request.
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


class DjangoJob(DjangoCall, Handler[DjangoWorkerState]):
    """Runs one call of a Django task function, with Django's signals and ``TaskContext``."""

    async def handle(self, ctx: Context[NoCarry], state: DjangoWorkerState) -> Outcome:
        task = state.tasks.get(self.task)
        if task is None:
            raise TaskError.permanent(
                f"task {self.task!r} is not among the tasks this worker found (the tasks modules of "
                "INSTALLED_APPS): deploy the worker with the same code as the web process"
            )
        journal = list(ctx.history)

        def result(status: str, value: Any = None) -> Any:
            return build_result(
                task,
                job_id=ctx.job_id,
                status=status,
                call=self,
                enqueued_at=journal[0].at if journal else None,
                finished_at=None,
                journal=journal,
                return_value=value,
            )

        running = result("RUNNING")
        running.worker_ids.append(state.worker_id)  # this run's claim is not in the history yet
        await _compat.task_started.asend(type(state.backend), task_result=running)
        args, kwargs = list(self.args), dict(self.kwargs)
        if task.takes_context:
            args.insert(0, _compat.TaskContext(task_result=running))
        try:
            if iscoroutinefunction(task.func):
                value = await task.func(*args, **kwargs)
            else:
                value = await anyio.to_thread.run_sync(functools.partial(_run_sync, task.func, args, kwargs))
            value = _compat.TaskResult(
                task=task,
                id=ctx.job_id,
                status=_compat.TaskResultStatus.SUCCESSFUL,
                enqueued_at=None,
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=[value],
                kwargs={},
                backend=self.backend,
                errors=[],
                worker_ids=[],
            ).args[0]  # the return value normalised to JSON, as Django's backends store it
        except Exception as exc:
            path = f"{type(exc).__module__}.{type(exc).__qualname__}"
            # Kept with the failure in the journal: get_result's errors read it back.
            ctx.set_attachment(
                {"exception_class_path": path, "traceback": "".join(traceback.format_exception(exc))}
            )
            failed = result("FAILED")
            await _compat.task_finished.asend(type(state.backend), task_result=failed)
            raise TaskError(f"{path}: {exc}") from exc
        done = result("SUCCESSFUL", value)
        await _compat.task_finished.asend(type(state.backend), task_result=done)
        return Outcome.completed(result=value)


def make_worker(alias: str = "default", *, client: Client | None = None, **options: Any) -> Worker[Any]:
    """A ``vr.Worker`` for the Django backend ``alias``: its queues, the app's tasks.

    Sets Django up first when it is not (``DJANGO_SETTINGS_MODULE`` names the
    settings). ``options`` go to ``vr.Worker`` (``concurrency``, ``lease``...).
    """
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()
    from ._backend import VenturiBackend
    from ._discovery import discover

    backend = _compat.task_backends[alias]
    if not isinstance(backend, VenturiBackend):
        raise TypeError(f"TASKS[{alias!r}] is a {type(backend).__name__}, not a VenturiBackend")
    tasks = {path: t for path, t in discover().items() if t.backend == alias}
    client = client or Client.from_url(backend.url)
    state = DjangoWorkerState(backend=backend, tasks=tasks)
    worker: Worker[Any] = Worker(
        [client.queue(name) for name in backend.venturi_queues()], state=state, **options
    )
    state.worker_id = worker.id
    return worker.register(DjangoJob)
