"""The worker side: run Django tasks enqueued by ``VenturiBackend``.

``python manage.py venturi_worker`` (with ``venturi_redis.contrib.django`` in
INSTALLED_APPS), or ``venturi worker venturi_redis.contrib.django.worker:make_worker``
with ``DJANGO_SETTINGS_MODULE`` set: both build the worker with ``make_worker``.

Each task the worker found gets a handler class of its own (KIND: its module
path). A sync function's handler is a sync handler: it runs in one of the
worker's threads (``_worker/threads.py``), its database connection checked
as Django does around a request, and a stuck one cannot hold the worker's
shutdown. An async function runs on the worker's loop.

Django's signals are sent as its own backends send them: ``task_started``
before the call, ``task_finished`` after it, and for a failure *inside the
except block*, so that a receiver that logs with ``exc_info`` (django-tasks'
own ``logger.exception``, Sentry's logging integration) gets the task's
exception and traceback.

Every exception a task raises is a failed task, ``SystemExit`` and
``KeyboardInterrupt`` included: the task's result names their class and
traceback, and the worker goes on with its other tasks (as the database and
RQ backends do: one library calling ``sys.exit()`` inside a task must not stop
a worker running a hundred others). A plain ``vr.Handler`` that raises them
stops its worker instead: there, they are taken as meant for the process
(docs/guarantees.md).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Any

import anyio
from django.db import close_old_connections
from django.utils import timezone

from ..._model.errors import ConfigurationError, TaskError
from ..._model.outcome import Outcome
from ..._producer.client import Client
from ..._worker.context import Context
from ..._worker.handler import Handler
from ..._worker.threads import HandlerThreads
from ..._worker.worker import Worker
from . import _compat
from ._jobs import DjangoCall, build_result, call_class

# How often a --batch worker looks whether anything is left to run (a stats read per queue).
BATCH_POLL = 0.1


@dataclass
class DjangoWorkerState:
    """What every run needs: the backend (for its alias and signals) and the tasks found."""

    backend: Any
    tasks: dict[str, Any] = field(default_factory=dict)
    worker_id: str = ""  # the vr.Worker's id: what TaskResult.worker_ids lists
    threads: HandlerThreads | None = None  # the worker's threads (a failure's signal, for async tasks)


class _Run:
    """One run of a Django task: its results as the signals send them, and what its ending becomes."""

    def __init__(self, call: DjangoCall, task: Any, ctx: Context[Any], state: DjangoWorkerState) -> None:
        self.call = call
        self.task = task
        self.ctx = ctx
        self.state = state
        self.sender = type(state.backend)
        self.journal = list(ctx.history)
        self.running = self.result("RUNNING")

    def result(self, status: str, value: Any = None, error: Any = None) -> Any:
        result = build_result(
            self.task,
            job_id=self.ctx.job_id,
            status=status,
            call=self.call,
            enqueued_at=self.journal[0].at if self.journal else None,
            finished_at=None if status == "RUNNING" else timezone.now(),
            journal=self.journal,
            return_value=value,
        )
        result.worker_ids.append(self.state.worker_id)  # this run's claim is not in its history
        if error is not None:
            result.errors.append(error)
        return result

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs = list(self.call.args), dict(self.call.kwargs)
        if self.task.takes_context:
            args.insert(0, _compat.TaskContext(task_result=self.running))
        return args, kwargs

    def finish(self, raw: Any) -> tuple[Any, Any]:
        """The return value normalised to JSON, as Django's backends store it, and the SUCCESSFUL result."""
        value = _compat.TaskResult(
            task=self.task,
            id=self.ctx.job_id,
            status=_compat.TaskResultStatus.SUCCESSFUL,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=[raw],
            kwargs={},
            backend=self.call.backend,
            errors=[],
            worker_ids=[],
        ).args[0]
        return value, self.result("SUCCESSFUL", value)

    def failed(self, exc: BaseException) -> Any:
        """The FAILED result for ``exc``, this run's error included."""
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        error = _compat.TaskError(
            exception_class_path=path, traceback="".join(traceback.format_exception(exc))
        )
        return self.result("FAILED", error=error)

    def exited(self, exc: SystemExit | KeyboardInterrupt) -> TaskError:
        """``exc`` as the run's failure: a ``TaskError`` with its traceback (raised as is,
        it would stop the worker); its class is kept in the run's attachment, where
        ``TaskResult.errors`` reads it back."""
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.ctx.set_attachment({"exception_class_path": path})
        return TaskError(f"{path}: {exc}").with_traceback(exc.__traceback__)


def _check(call: DjangoCall, task: Any) -> None:
    if call.task != task.module_path:  # a job written by hand: its KIND and its path disagree
        raise TaskError.permanent(f"job of task {task.module_path!r} names another task, {call.task!r}")


def _sync_handle(task: Any) -> Callable[..., Outcome]:
    def handle(self: DjangoCall, ctx: Context[Any], state: DjangoWorkerState) -> Outcome:
        # In one of the worker's threads: the signals are sent from here, with
        # Django's own `send`, as its database backend sends them.
        _check(self, task)
        run = _Run(self, task, ctx, state)
        _compat.task_started.send(run.sender, task_result=run.running)
        args, kwargs = run.arguments()
        # A worker thread holds its own database connection: drop it if it went
        # stale, as Django does around each request.
        close_old_connections()
        try:
            # The normalisation inside the try: a value Django cannot store is the task's failure.
            value, done = run.finish(task.func(*args, **kwargs))
        except BaseException as exc:
            # Sent inside the except block: receivers see the exception (sys.exc_info()).
            _compat.task_finished.send(run.sender, task_result=run.failed(exc))
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise run.exited(exc) from None
            raise  # the task's own exception: the journal keeps its type and traceback
        finally:
            close_old_connections()
        _compat.task_finished.send(run.sender, task_result=done)
        return Outcome.completed(result=value)

    return handle


def _send_failed(sender: Any, result: Any, exc: BaseException) -> None:
    """In a thread: ``task_finished`` with ``exc`` being handled, so that receivers see its exc_info."""
    tb = exc.__traceback__
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - it is re-raised by the caller
        _compat.task_finished.send(sender, task_result=result)
    finally:
        exc.__traceback__ = tb  # the raise above added this frame


def _async_handle(task: Any) -> Callable[..., Any]:
    async def handle(self: DjangoCall, ctx: Context[Any], state: DjangoWorkerState) -> Outcome:
        # On the worker's loop. Sync receivers of a signal run in a thread
        # (Django's asend does the same), so that they may use the database.
        _check(self, task)
        run = _Run(self, task, ctx, state)
        await _compat.task_started.asend(run.sender, task_result=run.running)
        args, kwargs = run.arguments()
        try:
            value, done = run.finish(await task.func(*args, **kwargs))
        except (anyio.get_cancelled_exc_class(), GeneratorExit):
            raise  # the worker's cancellation (a shutdown, a timeout): its rules, not the task's
        except BaseException as exc:
            failed = run.failed(exc)
            if state.threads is not None:
                label = f"{ctx.job_id} ({ctx.kind}) task_finished"
                await state.threads.run(label, _send_failed, run.sender, failed, exc)
            else:  # pragma: no cover - make_worker always gives the threads
                await _compat.task_finished.asend(run.sender, task_result=failed)
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise run.exited(exc) from None
            raise
        await _compat.task_finished.asend(run.sender, task_result=done)
        return Outcome.completed(result=value)

    return handle


# Made once per task per process (a registered class is remembered by the worker side).
_handlers: dict[str, tuple[Any, type[Any]]] = {}


def handler_class(task: Any) -> type[Any]:
    """The Task+Handler class that runs ``task``'s jobs: a sync handler for a sync function."""
    path = task.module_path
    made = _handlers.get(path)
    if made is not None and made[0] is task:
        return made[1]
    handle = _async_handle(task) if iscoroutinefunction(task.func) else _sync_handle(task)
    name = f"DjangoJob[{path}]"
    attrs = {"handle": handle, "__module__": __name__, "__qualname__": name}
    cls = type(name, (call_class(path), Handler), attrs)
    _handlers[path] = (task, cls)
    return cls


def _selected_queues(backend: Any, queue_names: Sequence[str] | None) -> list[str]:
    """The venturi queues of the Django ``queue_names`` (``*`` or None: all of the backend's)."""
    if queue_names is None or "*" in queue_names:
        return backend.venturi_queues()  # type: ignore[no-any-return]
    unknown = [n for n in queue_names if n not in backend.queues]
    if unknown:
        raise ConfigurationError(
            f"TASKS[{backend.alias!r}] has no queue {', '.join(repr(n) for n in unknown)}; its QUEUES are "
            f"{', '.join(sorted(backend.queues))} (or '*' for all)"
        )
    return sorted({backend.venturi_queue(n) for n in queue_names})


def make_worker(
    alias: str = "default",
    *,
    client: Client | None = None,
    queue_names: Sequence[str] | None = None,
    **options: Any,
) -> Worker[Any]:
    """A ``vr.Worker`` for the Django backend ``alias``: its queues, the app's tasks.

    Sets Django up first when it is not (``DJANGO_SETTINGS_MODULE`` names the
    settings). ``queue_names``: the Django queue names to consume (default,
    or ``["*"]``: every one in the backend's ``QUEUES``). ``options`` go to
    ``vr.Worker`` (``concurrency``, ``lease``, ``shutdown_grace``...).
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
    # Every task found, whatever backend it was defined on: `task.using(backend=...)`
    # sends any task to any backend, and the queues a worker takes decide which
    # jobs it gets (a task enqueued elsewhere went dead here with "no handler").
    tasks = discover()
    names = _selected_queues(backend, queue_names)
    client = client or Client.from_url(backend.url)
    state = DjangoWorkerState(backend=backend, tasks=tasks)
    worker: Worker[Any] = Worker([client.queue(name) for name in names], state=state, **options)
    state.worker_id = worker.id
    state.threads = worker.handler_threads
    return worker.register(*(handler_class(t) for t in tasks.values()))


async def run_worker(worker: Worker[Any], *, batch: bool = False) -> None:
    """Run ``worker``; with ``batch``, until nothing is left to run now, then return (``--batch``).

    "Nothing left" is: on every queue of the worker that is not paused, no job
    eligible now and none running (another worker's included). A job whose
    ``run_after`` is still ahead, or a failed run waiting out its backoff
    before a retry, is not waited for.
    """
    if not batch:
        await worker.run()
        return

    async def watch() -> None:
        # Polled, not waited for: another worker's running jobs count too.
        while not await _nothing_due(worker):  # noqa: ASYNC110
            await anyio.sleep(BATCH_POLL)
        worker.shutdown()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await worker.run()  # returns after that shutdown, or a signal's
        tg.cancel_scope.cancel()


async def _nothing_due(worker: Worker[Any]) -> bool:
    for queue in worker.queues:
        stats = await queue.stats()
        if not stats.paused and (stats.running or sum(stats.pending.values())):
            return False
    return True
