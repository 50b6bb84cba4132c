"""``VenturiBackend`` held to what django-tasks' own backends are expected to do (issue 44).

The reference is the suites those backends are held to: django-tasks-rq's
``tests/tests.py``, django-tasks-db's worker tests (those that run
``db_worker`` in-process and as a child process) and django-tasks'
``test_tasks.py``. The tasks are theirs (``tests/djangoapp/tasks.py``), on the
``upstream`` backend (one attempt per task, as theirs). Its worker runs in
this process through ``call_command("venturi_worker", batch=True)`` and as
``python manage.py venturi_worker`` in a child process, on a real redis-server.
Each test gets queues of its own (``up`` fixture). Where we differ on purpose
the test says so; docs/integrations.md lists those differences.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "django"


@dataclass
class Upstream:
    env: dict[str, str]  # for a child worker: the same queues
    queue: str  # the venturi queue of Django's "default"
    other: str  # the second Django queue name (and its venturi queue)
    tmp: Path

    def marker(self) -> str:
        return str(self.tmp / f"marker-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def up(django_project: dict[str, str], tmp_path: Path) -> Iterator[Upstream]:
    """The ``upstream`` backend on queues of this test's own (settings overridden, as a child gets them)."""
    from django.conf import settings
    from django.test import override_settings

    queue, other = f"up-{uuid.uuid4().hex[:8]}", f"q1-{uuid.uuid4().hex[:8]}"
    conf = settings.TASKS["upstream"]
    tasks = {
        **settings.TASKS,
        "upstream": {**conf, "QUEUES": ["default", other], "OPTIONS": {**conf["OPTIONS"], "queue": queue}},
    }
    env = {**django_project, "VENTURI_UPSTREAM_QUEUE": queue, "VENTURI_OTHER_QUEUE": other}
    with override_settings(TASKS=tasks):  # django-tasks rebuilds its backends on the change
        yield Upstream(env=env, queue=queue, other=other, tmp=tmp_path)


@pytest.fixture
def sync(redis_server: RedisServer) -> Iterator[vr.SyncClient]:
    with vr.SyncClient(redis_server.url) as client:
        yield client


def run_batch(**options: Any) -> str:
    """``manage.py venturi_worker --backend upstream --batch`` in this process: what it printed."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("venturi_worker", backend="upstream", batch=True, stdout=out, **options)
    return out.getvalue()


def start_worker(up: Upstream, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """``python manage.py venturi_worker --backend upstream ARGS`` in a child process."""
    env = {
        **os.environ,
        **up.env,
        "DJANGO_SETTINGS_MODULE": "tests.djangoapp.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "venturi_worker", "--backend", "upstream", *args],
            cwd=EXAMPLE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def says(log: Path, text: str) -> Callable[[], bool]:
    return lambda: text in log.read_text()


def wait_until(proc: subprocess.Popen[bytes], check: Callable[[], bool], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


# -- enqueue and get_result (item 3) -----------------------------------------------------------------


def test_enqueue_returns_what_get_result_reads_back(up: Upstream) -> None:
    """RQ's and the database backend's test_get_result and test_refresh_result:
    the READY result enqueue returns equals the stored one, so refresh() changes nothing."""
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    backend = _compat.task_backends["upstream"]
    for task in (tasks.noop_task, tasks.noop_task_async):
        result = task.enqueue(1, two=3)
        assert (result.status, result.attempts, result.args, result.kwargs) == ("READY", 0, [1], {"two": 3})
        assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
        assert result.enqueued_at is not None and result.task == task
        with pytest.raises(ValueError, match="Task has not finished yet"):
            _ = result.return_value
        assert backend.get_result(result.id) == result
        before = (result.enqueued_at, result.status, result.errors, result.worker_ids)
        result.refresh()
        assert (result.enqueued_at, result.status, result.errors, result.worker_ids) == before


@pytest.mark.anyio
async def test_aenqueue_returns_what_aget_result_reads_back(up: Upstream) -> None:
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    backend = _compat.task_backends["upstream"]
    result = await backend.aenqueue(tasks.noop_task, [], {})
    assert await backend.aget_result(result.id) == result


def test_a_result_names_the_task_as_defined(up: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """RQ's test_enqueue_priority: the task a result is read back with is the module's own,
    even when the first this process saw of it was a ``using()`` copy."""
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _jobs

    monkeypatch.setattr(_jobs, "_known", {})

    result = tasks.noop_task.using(priority=100).enqueue()
    assert result.task.priority == 100
    assert tasks.noop_task.get_backend().get_result(result.id).task.priority == 0


# -- running them (items 1 and 6) ------------------------------------------------------------------------


def test_batch_runs_every_due_task_then_returns(up: Upstream) -> None:
    """The database worker's test_batch_processes_all_tasks and test_run_enqueued_task."""
    from tests.djangoapp import tasks

    done = [tasks.noop_task.enqueue() for _ in range(3)] + [tasks.noop_task_async.enqueue()]
    failed = tasks.failing_task_value_error.enqueue()
    out = run_batch()
    assert f"no more tasks due on {', '.join(sorted([up.queue, up.other]))}" in out
    for result in (*done, failed):
        assert result.status == "READY"  # a result changes only when refreshed
        result.refresh()
        assert result.started_at is not None and result.finished_at is not None
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert result.attempts == 1
    assert [r.status for r in done] == ["SUCCESSFUL"] * 4
    assert failed.status == "FAILED"


def test_a_task_sent_to_another_backend_with_using_runs_on_that_backends_worker(up: Upstream) -> None:
    """Django 6's test_task_error_invalid_exception sends a task defined on one
    backend to another (``.using(backend=...)``): that backend's worker runs it
    (it went dead with "no handler" when a worker took only its own backend's
    tasks)."""
    from shop.tasks import send_welcome  # defined on "default"

    from tests.djangoapp import tasks  # defined on "upstream"

    moved = send_welcome.using(backend="upstream").enqueue("ada@example.org")
    assert moved.backend == "upstream"
    run_batch()
    moved.refresh()
    assert (moved.status, moved.return_value) == ("SUCCESSFUL", "welcomed ada@example.org")
    assert moved.backend == "upstream"
    assert tasks.noop_task.backend == "upstream"  # the one defined there, run by the same worker
    assert "shop.tasks.send_welcome" in run_batch()  # listed among the tasks it runs


def test_batch_does_not_wait_for_a_task_whose_run_after_is_ahead(up: Upstream) -> None:
    """The database worker's test_run_after: --batch runs what is due now, then exits."""
    from django.utils import timezone

    from tests.djangoapp import tasks

    later = tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
    now = tasks.noop_task.enqueue()
    run_batch()
    later.refresh()
    now.refresh()
    assert (later.status, now.status) == ("READY", "SUCCESSFUL")


def test_queue_name_selects_the_queues_a_worker_runs(up: Upstream) -> None:
    """The database worker's test_doesnt_process_different_queue and test_process_all_queues."""
    from django.core.management.base import CommandError

    from tests.djangoapp import tasks

    other = tasks.noop_task.using(queue_name=up.other).enqueue()
    run_batch(queue_name="default")
    other.refresh()
    assert other.status == "READY"
    run_batch(queue_name=up.other)
    other.refresh()
    assert other.status == "SUCCESSFUL"

    both = [tasks.noop_task.enqueue(), tasks.noop_task.using(queue_name=up.other).enqueue()]
    run_batch(queue_name=f"default,{up.other}")
    for result in both:
        result.refresh()
        assert result.status == "SUCCESSFUL"
    again = [tasks.noop_task.enqueue(), tasks.noop_task.using(queue_name=up.other).enqueue()]
    run_batch(queue_name="*")
    for result in again:
        result.refresh()
        assert result.status == "SUCCESSFUL"

    with pytest.raises(CommandError, match=r"has no queue 'emails'; its QUEUES are default"):
        run_batch(queue_name="emails")


def test_queue_isolation(up: Upstream, sync: vr.SyncClient) -> None:
    """RQ's test_queue_isolation: each Django queue is its own venturi queue, and results read from both."""
    from tests.djangoapp import tasks

    default = tasks.noop_task.enqueue()
    other = tasks.noop_task.using(queue_name=up.other).enqueue()
    backend = tasks.noop_task.get_backend()
    assert backend.get_result(default.id).task.queue_name == "default"
    assert backend.get_result(other.id).id == other.id
    assert [j.id for j in sync.queue(up.queue).list_jobs(state="pending")] == [default.id]
    assert [j.id for j in sync.queue(up.other).list_jobs(state="pending")] == [other.id]


@pytest.mark.parametrize(
    ("name", "exception", "message"),
    [
        ("failing_task_value_error", ValueError, "This task failed due to ValueError"),
        ("failing_task_value_error_async", ValueError, "This task failed due to ValueError"),
        ("failing_task_system_exit", SystemExit, "This task failed due to SystemExit"),
        ("failing_task_system_exit_async", SystemExit, "This task failed due to SystemExit"),
        ("failing_task_keyboard_interrupt", KeyboardInterrupt, "This task failed due to KeyboardInterrupt"),
    ],
)
def test_a_failing_task_is_failed_with_its_class_and_traceback_and_the_worker_goes_on(
    up: Upstream, name: str, exception: type[BaseException], message: str
) -> None:
    """RQ's test_catches_exception; the database worker's test_failing_task and
    test_worker_doesnt_exit. SystemExit and KeyboardInterrupt too: a failed task,
    its signal sent, and the worker runs the next task."""
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    finished: list[tuple[str, Any]] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append((task_result.status, sys.exc_info()[0]))

    result = getattr(tasks, name).enqueue()
    after = tasks.noop_task.enqueue()
    _compat.task_finished.connect(on_finished)
    try:
        run_batch(concurrency=1)  # one at a time: the noop runs after the failure
    finally:
        _compat.task_finished.disconnect(on_finished)
    result.refresh()
    after.refresh()
    assert (result.status, result.attempts, after.status) == ("FAILED", 1, "SUCCESSFUL")
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.enqueued_at <= result.started_at <= result.finished_at
    [error] = result.errors
    assert error.exception_class is exception
    assert error.traceback.endswith(f"{exception.__name__}: {message}\n"), error.traceback
    assert name in error.traceback  # the task's own frame
    assert ("FAILED", exception) in finished  # sent inside the except: receivers see the exception


def test_exit_inside_a_task_is_a_failed_task(up: Upstream) -> None:
    """The database worker's test_worker_doesnt_exit (``exit(1)`` in a task)."""
    from tests.djangoapp import tasks

    result = tasks.exit_task.enqueue()
    run_batch()
    result.refresh()
    assert result.status == "FAILED" and result.errors[0].exception_class is SystemExit


def test_complex_exception_and_return_value(up: Upstream) -> None:
    """test_complex_exception and test_complex_return_value (both upstream suites)."""
    from tests.djangoapp import tasks

    complex_exc = tasks.complex_exception.enqueue()
    complex_value = tasks.complex_return_value.enqueue()
    run_batch()
    complex_exc.refresh()
    complex_value.refresh()
    assert complex_exc.status == complex_value.status == "FAILED"
    assert complex_exc.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in complex_exc.errors[0].traceback
    assert complex_value.errors[0].exception_class is TypeError
    assert "Unsupported type" in complex_value.errors[0].traceback  # Django's own JSON normalisation


def test_takes_context(up: Upstream) -> None:
    """test_takes_context and test_context (both upstream suites)."""
    from tests.djangoapp import tasks

    task_id = tasks.get_task_id.enqueue()
    context = tasks.check_context.enqueue(1)
    run_batch()
    task_id.refresh()
    context.refresh()
    assert (task_id.status, task_id.return_value) == ("SUCCESSFUL", task_id.id)
    assert context.status == "SUCCESSFUL"


# -- QUEUES: [] (item 4) ----------------------------------------------------------------------------------


def test_no_queues_listed_means_default_and_a_name_no_worker_runs_is_refused(up: Upstream) -> None:
    """RQ's test_uses_rq_queues_for_queue_names: QUEUES: [] is the backend's own
    queues (RQ's from RQ_QUEUES; ours "default"), so a name its worker would never
    consume is refused at enqueue instead of waiting forever."""
    from django.conf import settings
    from django.test import override_settings

    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    conf = {**settings.TASKS["upstream"], "QUEUES": []}
    with override_settings(TASKS={**settings.TASKS, "upstream": conf}):
        backend = _compat.task_backends["upstream"]
        assert backend.queues == {"default"} and backend.venturi_queues() == [up.queue]
        with pytest.raises(_compat.InvalidTaskError, match=r"QUEUES: \[\], which VenturiBackend takes as"):
            tasks.noop_task.using(queue_name="emails")
        result = tasks.noop_task.enqueue()
        run_batch()
        result.refresh()
        assert result.status == "SUCCESSFUL"


# -- a child process: python manage.py venturi_worker (items 1, 2 and 6) -------------------------------


def test_batch_in_a_child_process_exits_0_after_the_due_tasks(up: Upstream, tmp_path: Path) -> None:
    """The database worker's test_run_subprocess, test_system_exit_task and
    test_keyboard_interrupt_task (``--burst``, RQ's word, is the same flag)."""
    from tests.djangoapp import tasks

    ok = tasks.calculate_meaning_of_life.enqueue()
    exits = tasks.failing_task_system_exit.enqueue()
    interrupts = tasks.failing_task_keyboard_interrupt.enqueue()
    log = tmp_path / "worker.log"
    proc = start_worker(up, "--burst", log=log)
    try:
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        stop(proc)
    for result in (ok, exits, interrupts):
        result.refresh()
    assert (ok.status, ok.return_value) == ("SUCCESSFUL", 42)
    assert exits.status == interrupts.status == "FAILED"
    assert exits.errors[0].exception_class is SystemExit
    assert interrupts.errors[0].exception_class is KeyboardInterrupt
    text = log.read_text()
    assert "no more tasks due" in text
    assert f"Task id={exits.id} path=tests.djangoapp.tasks.failing_task_system_exit state=FAILED" in text
    assert "SystemExit: This task failed due to SystemExit" in text  # django_tasks' logger.exception


def test_a_signal_lets_the_running_task_finish_then_the_worker_exits(up: Upstream, tmp_path: Path) -> None:
    """The database worker's test_interrupt_signals: SIGTERM or SIGINT, the task
    running completes within the grace, exit status 0."""
    from tests.djangoapp import tasks

    for sig in (signal.SIGTERM, signal.SIGINT):
        marker, go = up.marker(), up.marker()
        result = tasks.wait_for_file.enqueue(marker, go)
        log = tmp_path / f"worker-{sig.name}.log"
        proc = start_worker(up, "--shutdown-grace", "60", log=log)
        try:
            wait_until(proc, Path(marker).exists, log)
            result.refresh()
            assert result.status == "RUNNING" and len(result.worker_ids) == 1
            proc.send_signal(sig)
            wait_until(proc, says(log, "received, shutting down"), log)
            Path(go).write_text("go")
            assert proc.wait(timeout=60) == 0, log.read_text()
        finally:
            stop(proc)
        result.refresh()
        assert (result.status, result.return_value) == ("SUCCESSFUL", "saw it"), log.read_text()


def test_a_signal_stops_a_batch_worker_with_tasks_still_due(up: Upstream, tmp_path: Path) -> None:
    from tests.djangoapp import tasks

    marker, go = up.marker(), up.marker()
    running = tasks.wait_for_file.enqueue(marker, go)
    left = tasks.noop_task.enqueue()
    log = tmp_path / "worker.log"
    proc = start_worker(up, "--batch", "--concurrency", "1", log=log)
    try:
        wait_until(proc, Path(marker).exists, log)
        proc.send_signal(signal.SIGTERM)
        wait_until(proc, says(log, "received, shutting down"), log)
        Path(go).write_text("go")
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        stop(proc)
    running.refresh()
    left.refresh()
    assert (running.status, left.status) == ("SUCCESSFUL", "READY"), log.read_text()


@pytest.mark.parametrize("how", ["second-signal", "grace"])
def test_a_task_that_never_returns_cannot_hold_the_shutdown(
    up: Upstream, sync: vr.SyncClient, tmp_path: Path, how: str
) -> None:
    """The database worker's test_repeat_ctrl_c: a second SIGINT, or the grace
    running out, ends the worker though the task's thread sleeps on. The task is
    released (READY, to run again), where the database backend marks it FAILED."""
    from tests.djangoapp import tasks

    marker = up.marker()
    result = tasks.hang.enqueue(marker)
    log = tmp_path / "worker.log"
    # An hour's grace when only the second signal may end the worker.
    proc = start_worker(up, "--shutdown-grace", "3600" if how == "second-signal" else "0.5", log=log)
    try:
        wait_until(proc, Path(marker).exists, log)
        result.refresh()
        assert result.status == "RUNNING"
        proc.send_signal(signal.SIGINT)
        if how == "second-signal":
            wait_until(proc, says(log, "received, shutting down"), log)
            result.refresh()
            assert result.status == "RUNNING"  # the first signal waits for the task
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, (
            log.read_text()
        )  # the task sleeps an hour: the process did not wait
    finally:
        stop(proc)
    result.refresh()
    assert (result.status, result.errors, result.attempts) == ("READY", [], 1), log.read_text()
    assert sync.queue(up.queue).journal(result.id)[-1].event == "released"
    assert "the thread cannot be stopped and is abandoned" in log.read_text()


def test_the_command_refuses_a_backend_it_cannot_run(up: Upstream) -> None:
    """The database worker's test_unknown_backend and test_incorrect_backend."""
    from django.conf import settings
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.test import override_settings

    with pytest.raises(CommandError, match="unknown"):
        call_command("venturi_worker", backend="unknown", batch=True, stdout=io.StringIO())
    from venturi_redis.contrib.django import _compat

    dummy = {"BACKEND": f"{_compat.FRAMEWORK}.backends.dummy.DummyBackend"}
    with (
        override_settings(TASKS={**settings.TASKS, "dummy": dummy}),
        pytest.raises(CommandError, match="is a DummyBackend, not a VenturiBackend"),
    ):
        call_command("venturi_worker", backend="dummy", batch=True, stdout=io.StringIO())


# -- a failed task's traceback in the logs (issue 39, item 5) -------------------------------------------


def test_a_failed_tasks_traceback_reaches_logging_handlers_with_exc_info(up: Upstream) -> None:
    """django-tasks logs a failed task with ``logger.exception`` from its
    task_finished receiver (Django 6's receiver, with ``sys.exc_info()``): sent
    outside the except block, that logged ``NoneType: None`` and gave
    Sentry-style handlers no exception."""
    import logging

    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=logging.ERROR)
    logger = logging.getLogger(_compat.FRAMEWORK)  # "django.tasks" on Django 6, else "django_tasks"
    logger.addHandler(handler)
    try:
        sync_failure = tasks.failing_task_value_error.enqueue()
        async_failure = tasks.failing_task_value_error_async.enqueue()
        run_batch()
    finally:
        logger.removeHandler(handler)
    for result, name in (
        (sync_failure, "failing_task_value_error"),
        (async_failure, "failing_task_value_error_async"),
    ):
        [record] = [r for r in records if result.id in r.getMessage()]
        assert "state=FAILED" in record.getMessage()
        assert record.exc_info is not None and record.exc_info[0] is ValueError
        text = logging.Formatter().formatException(record.exc_info)
        assert f"in {name}" in text and text.endswith("ValueError: This task failed due to ValueError")
