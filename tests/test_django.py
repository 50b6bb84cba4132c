"""Django's Tasks framework on venturi: examples/django as a user runs it, and the backend contract.

Django is set up once in this process with the example project's settings
(``shop.settings``: TASKS points at this suite's redis-server); its worker runs
as ``python manage.py venturi_worker`` in a child process.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "django"


@pytest.fixture
def project(django_project: dict[str, str]) -> dict[str, str]:
    """Django set up once per session (tests/conftest.py); the environment its workers need."""
    return django_project


@pytest.fixture
def http(project: dict[str, str]) -> Any:
    from django.test import Client

    return Client()


@pytest.fixture
def sync(redis_server: RedisServer) -> Iterator[vr.SyncClient]:
    with vr.SyncClient(redis_server.url) as client:
        yield client


def poll(http: Any, name: str, result_id: str, until: set[str]) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 60
    while True:
        doc: dict[str, Any] = http.get(f"/results/{name}/{result_id}").json()
        if doc["status"] in until or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


def test_views_enqueue_and_manage_py_venturi_worker_runs_the_tasks(
    project: dict[str, str], http: Any, tmp_path: Path
) -> None:
    sent = http.post("/welcome", json.dumps({"email": "ada@example.org"}), content_type="application/json")
    assert sent.status_code == 202
    welcome_id = sent.json()["result_id"]
    assert sent.json()["status"] == "READY"
    assert http.get(f"/results/send_welcome/{welcome_id}").json()["status"] == "READY"  # no worker yet
    bad_id = http.post("/welcome", json.dumps({"email": "nobody"}), content_type="application/json").json()[
        "result_id"
    ]
    words_id = http.post(
        "/words", json.dumps({"text": "to be or not"}), content_type="application/json"
    ).json()["result_id"]

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "venturi_worker"],
            cwd=EXAMPLE,
            # As a user runs it: the example project's own settings.
            env={**os.environ, **project, "DJANGO_SETTINGS_MODULE": "shop.settings", "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        done = poll(http, "send_welcome", welcome_id, {"SUCCESSFUL", "FAILED"})
        assert done == {
            "status": "SUCCESSFUL",
            "attempts": 1,
            "errors": [],
            "return_value": "welcomed ada@example.org",
        }
        from shop.tasks import send_welcome

        # The worker of each claim, read back from the journal: host:pid:random.
        (worker_id,) = send_welcome.get_result(welcome_id).worker_ids
        assert worker_id.count(":") == 2 and worker_id.split(":")[1] == str(worker.pid)
        counted = poll(http, "count_words", words_id, {"SUCCESSFUL", "FAILED"})
        assert counted["return_value"] == {"words": 4, "attempt": 1}
        failed = poll(http, "send_welcome", bad_id, {"FAILED"})
        # max_failures=2 in the settings: one retry, then FAILED, each failure kept.
        assert failed == {"status": "FAILED", "attempts": 2, "errors": ["builtins.ValueError"] * 2}
        error = send_welcome.get_result(bad_id).errors[-1]  # Django's TaskError, as its backends keep it
        assert error.exception_class is ValueError
        assert "ValueError: not an address: 'nobody'" in error.traceback and "send_welcome" in error.traceback
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
    text = log.read_text()
    assert code == 0, text
    assert "tasks: shop.tasks.count_words, shop.tasks.send_welcome" in text


def test_priority_run_after_and_queue_map_onto_the_venturi_job(
    project: dict[str, str], sync: vr.SyncClient
) -> None:
    from django.utils import timezone
    from shop.tasks import count_words, send_welcome

    from venturi_redis.contrib.django import _compat

    seen: list[Any] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result)

    _compat.task_enqueued.connect(on_enqueued)
    try:
        later = timezone.now() + timedelta(hours=1)
        res = send_welcome.using(priority=80, run_after=later).enqueue("grace@example.org")
        low = count_words.using(priority=-5).enqueue(text="a b")
    finally:
        _compat.task_enqueued.disconnect(on_enqueued)
    assert [r.id for r in seen] == [res.id, low.id]

    job = sync.queue(project["VENTURI_QUEUE"]).get(res.id)
    assert job is not None and job.kind == "shop.tasks.send_welcome"  # a KIND of its own: its module path
    assert (job.state, job.priority) == (vr.JobState.PENDING, vr.Priority.CRITICAL)
    assert job.eligible_at is not None and job.eligible_at >= later - timedelta(seconds=1)
    assert job.payload == {
        "task": "shop.tasks.send_welcome",
        "args": ["grace@example.org"],
        "kwargs": {},
        "backend": "default",
    }
    reports = sync.queue("reports").get(low.id)  # Django's "reports" queue is venturi's "reports"
    assert reports is not None and reports.priority == vr.Priority.LOW

    again = send_welcome.get_result(res.id)
    assert (again.status, again.args, again.attempts, again.is_finished) == (
        "READY",
        ["grace@example.org"],
        0,
        False,
    )
    with pytest.raises(ValueError, match="not finished"):
        _ = again.return_value


def test_the_contracts_refusals(project: dict[str, str]) -> None:
    from shop.tasks import send_welcome

    from venturi_redis.contrib.django import _compat

    with pytest.raises(_compat.TaskResultDoesNotExist):
        send_welcome.get_result("01ARZ3NDEKTSV4RRFFQ69G5FAV")  # a job id no queue has
    with pytest.raises(_compat.TaskResultDoesNotExist):
        send_welcome.get_result("venturi:{x}:job:1")  # not a job id: never read as a key
    # Django's own sentence first, as its backends say it (Django's tests match on it), then why.
    with pytest.raises(_compat.InvalidTaskError, match=r"^Queue 'elsewhere' is not valid for backend\. "):
        send_welcome.using(queue_name="elsewhere")
    with pytest.raises(_compat.InvalidTaskError, match="priority must be a whole number"):
        send_welcome.using(priority=101)
    with pytest.raises(_compat.InvalidTaskError, match="aware datetime"):
        send_welcome.using(run_after=datetime(2030, 1, 1))  # naive, and the project has USE_TZ
    with pytest.raises(TypeError, match="Unsupported type"):
        send_welcome.enqueue(object())  # not JSON: refused before anything is sent

    def local() -> None: ...

    with pytest.raises(_compat.InvalidTaskError, match="module level"):
        _compat.Task(func=local, priority=0, backend="default", queue_name="default", run_after=None)


def test_the_framework_is_djangos_own_tasks_module_where_django_has_it(
    monkeypatch: pytest.MonkeyPatch, project: dict[str, str]
) -> None:
    import django

    from venturi_redis.contrib.django import _compat

    if django.VERSION >= (6, 0):
        # Real Django 6 (make test-django6): every name comes from django.tasks,
        # under Django's own spelling of the refusals.
        import django.tasks
        import django.tasks.exceptions
        import django.tasks.signals

        assert _compat.FRAMEWORK == "django.tasks"
        assert _compat.task_backends is django.tasks.task_backends
        assert (_compat.Task, _compat.TaskResult, _compat.TaskContext) == (
            django.tasks.Task,
            django.tasks.TaskResult,
            django.tasks.TaskContext,
        )
        assert _compat.InvalidTaskError is django.tasks.exceptions.InvalidTask
        assert _compat.InvalidTaskBackendError is django.tasks.exceptions.InvalidTaskBackend
        assert _compat.task_started is django.tasks.signals.task_started
        assert "django_tasks" not in sys.modules  # the backport is never reached for
        return
    # Django 5.2 (Python 3.11): with the backport's modules standing in under
    # Django 6's names, the integration takes them from there.
    import django_tasks

    for sub in ["", ".base", ".backends", ".backends.base", ".signals"]:
        monkeypatch.setitem(sys.modules, f"django.tasks{sub}", importlib.import_module(f"django_tasks{sub}"))
    # Django 6 names the refusal InvalidTask (the backport installed here, InvalidTaskError).
    exceptions = types.ModuleType("django.tasks.exceptions")
    for name in ["TaskResultDoesNotExist", "TaskResultMismatch"]:
        setattr(exceptions, name, getattr(django_tasks.exceptions, name))
    exceptions.InvalidTask = type("InvalidTask", (Exception,), {})  # type: ignore[attr-defined]
    exceptions.InvalidTaskBackend = type("InvalidTaskBackend", (Exception,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "django.tasks.exceptions", exceptions)
    try:
        reloaded = importlib.reload(_compat)
        assert reloaded.FRAMEWORK == "django.tasks"
        assert reloaded.InvalidTaskError is exceptions.InvalidTask  # type: ignore[attr-defined]
    finally:
        monkeypatch.undo()
        assert importlib.reload(_compat).FRAMEWORK == "django_tasks"
    assert django_tasks.task_backends is _compat.task_backends


def test_the_backend_declares_the_contracts_features(project: dict[str, str]) -> None:
    # Each flag is backed by a test here: run_after and priority (the mapping
    # test), async tasks (count_words), results from any process (the views).
    from venturi_redis.contrib.django import VenturiBackend, _compat

    backend = _compat.task_backends["default"]
    assert isinstance(backend, VenturiBackend) and backend.alias == "default"
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)
    assert backend.task_class is _compat.Task
    assert backend.queues == {"default", "reports"}
    assert backend.venturi_queues() == sorted([project["VENTURI_QUEUE"], "reports"])
    assert list(backend.check()) == []


@pytest.mark.anyio
async def test_aenqueue_aget_result_arefresh_and_a_cancelled_task_reads_failed(
    project: dict[str, str], sync: vr.SyncClient
) -> None:
    from django.utils import timezone
    from shop.tasks import count_words, send_welcome

    from venturi_redis.contrib.django import _compat

    res = await send_welcome.using(run_after=timezone.now() + timedelta(hours=1)).aenqueue("lin@example.org")
    assert (res.status, res.args, res.kwargs, res.backend) == ("READY", ["lin@example.org"], {}, "default")
    assert res.enqueued_at is not None and res.started_at is None and res.finished_at is None
    again = await send_welcome.aget_result(res.id)
    assert (again.id, again.status, again.worker_ids, again.errors) == (res.id, "READY", [], [])
    with pytest.raises(_compat.TaskResultDoesNotExist):
        await send_welcome.aget_result("01ARZ3NDEKTSV4RRFFQ69G5FAV")
    # Django's own check: the result of one task is not another's.
    with pytest.raises(_compat.TaskResultMismatch):
        await count_words.aget_result(res.id)

    assert sync.queue(project["VENTURI_QUEUE"]).cancel(res.id) == "cancelled"
    await res.arefresh()
    assert (res.status, res.is_finished) == ("FAILED", True)
    with pytest.raises(ValueError, match="Task failed"):
        _ = res.return_value
    # A FAILED result always has an error to show (django-tasks' example view reads errors[0]).
    from venturi_redis.contrib.django import TaskCancelled

    [error] = res.errors
    assert error.exception_class is TaskCancelled
    assert error.exception_class_path == "venturi_redis.contrib.django.TaskCancelled"
    assert (
        error.traceback.startswith("venturi_redis.contrib.django.TaskCancelled: ")
        and "cancel" in error.traceback
    )


@pytest.mark.anyio
async def test_a_run_reads_running_then_successful_with_its_times_and_worker(
    project: dict[str, str], redis_server: RedisServer
) -> None:
    # make_worker in this process (the command's worker), so the signals'
    # receivers can read the result back while the task runs.
    import anyio
    from django.utils import timezone
    from shop.tasks import send_welcome

    from venturi_redis.contrib.django import _compat
    from venturi_redis.contrib.django._jobs import call_class
    from venturi_redis.contrib.django.worker import make_worker

    running: list[Any] = []
    finished: list[Any] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        running.append((task_result, send_welcome.get_result(task_result.id)))  # read from Redis mid-run

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    async with vr.Client.from_url(redis_server.url) as client:
        queue = client.queue(project["VENTURI_QUEUE"])
        res = await send_welcome.aenqueue("kay@example.org")
        # A job naming a function the worker never found: dead, nothing imported.
        gone = await queue.enqueue(
            call_class("os.system")(task="os.system", args=["true"], kwargs={}, backend="default")
        )
        _compat.task_started.connect(on_started)
        _compat.task_finished.connect(on_finished)
        try:
            worker = make_worker(client=client, handle_signals=False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(60):
                    for job_id in (res.id, gone):
                        while (info := await queue.get(job_id)) is None or info.finished_at is None:
                            await anyio.sleep(0.02)
                worker.shutdown()
        finally:
            _compat.task_started.disconnect(on_started)
            _compat.task_finished.disconnect(on_finished)
        dead = await queue.get(gone)
    assert dead is not None and dead.state == vr.JobState.DEAD
    assert "no handler for kind 'os.system'" in (dead.note or "")
    with pytest.raises(_compat.TaskResultDoesNotExist, match="not among this process's tasks"):
        send_welcome.get_backend().get_result(gone)

    [(sent, mid_run)] = [(s, r) for s, r in running if s.id == res.id]
    assert (sent.status, sent.worker_ids) == ("RUNNING", [worker.id])
    assert (mid_run.status, mid_run.is_finished, mid_run.worker_ids) == ("RUNNING", False, [worker.id])
    assert mid_run.started_at is not None and mid_run.finished_at is None
    with pytest.raises(ValueError, match="not finished"):
        _ = mid_run.return_value
    assert [(f.status, f.return_value) for f in finished if f.id == res.id] == [
        ("SUCCESSFUL", "welcomed kay@example.org")
    ]

    assert res.status == "READY"
    await res.arefresh()  # the READY result the view got, refreshed in place
    assert (res.status, res.is_finished, res.return_value) == ("SUCCESSFUL", True, "welcomed kay@example.org")
    assert (res.worker_ids, res.attempts, res.errors) == ([worker.id], 1, [])
    assert res.enqueued_at is not None and res.started_at is not None and res.finished_at is not None
    assert res.enqueued_at <= res.started_at == res.last_attempted_at <= res.finished_at <= timezone.now()


def test_venturi_worker_pointed_at_the_django_settings_runs_the_tasks(
    project: dict[str, str], tmp_path: Path
) -> None:
    # The other way to run them: the venturi CLI with make_worker, settings from the environment.
    from shop.tasks import send_welcome

    res = send_welcome.enqueue("mo@example.org")
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        **project,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "venturi_redis.cli",
                "worker",
                "venturi_redis.contrib.django.worker:make_worker",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        import time

        deadline = time.monotonic() + 60
        while not res.is_finished:
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
            res.refresh()
        assert (res.status, res.return_value) == ("SUCCESSFUL", "welcomed mo@example.org"), log.read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
    assert code == 0, log.read_text()


@pytest.mark.anyio
async def test_venturi_job_show_prints_a_failed_tasks_traceback_once(
    project: dict[str, str], redis_server: RedisServer
) -> None:
    """Issue 39, item 5: the traceback was printed four times (twice in the
    attachment's JSON, twice more chained in the journal's own)."""
    import anyio
    from shop.tasks import send_welcome

    from venturi_redis.contrib.django.worker import make_worker

    res = await send_welcome.aenqueue("nobody")  # max_failures=2: failed, failed, dead
    async with vr.Client.from_url(redis_server.url) as client:
        queue = client.queue(project["VENTURI_QUEUE"])
        backoff = vr.Backoff.fibonacci(base=0.01, cap=0.05)
        worker = make_worker(client=client, handle_signals=False, backoff=backoff)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(60):
                while (info := await queue.get(res.id)) is None or info.state != vr.JobState.DEAD:
                    await anyio.sleep(0.02)
            worker.shutdown()
    shown = subprocess.run(
        [sys.executable, "-m", "venturi_redis.cli", "job", "show", res.id, "--redis", redis_server.url],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    ).stdout
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert shown.count("ValueError: not an address: 'nobody'") == 1, shown
    assert "kind" in shown and "shop.tasks.send_welcome" in shown  # named without --show-payload
    await res.arefresh()
    assert [e.exception_class_path for e in res.errors] == ["builtins.ValueError"] * 2
    assert all(e.traceback.endswith("ValueError: not an address: 'nobody'\n") for e in res.errors)
