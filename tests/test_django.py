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
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "django"


@pytest.fixture(scope="module")
def project(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    """Django set up with the example's settings; the environment its worker needs."""
    import django
    from django.conf import settings

    env = {"REDIS_URL": redis_server.url, "VENTURI_QUEUE": f"shop-{uuid.uuid4().hex[:8]}"}
    saved = {k: os.environ.get(k) for k in [*env, "DJANGO_SETTINGS_MODULE"]}
    os.environ.update(env, DJANGO_SETTINGS_MODULE="shop.settings")
    sys.path.insert(0, str(EXAMPLE))
    try:
        if not settings.configured:
            django.setup()  # reads shop.settings, and so the environment, once
        assert settings.TASKS["default"]["OPTIONS"]["queue"] == env["VENTURI_QUEUE"]
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
            env={**os.environ, **project, "PYTHONUNBUFFERED": "1"},
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
    assert job is not None and job.kind == "django.task"
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
    with pytest.raises(_compat.InvalidTaskError, match="Queue 'elsewhere' is not valid"):
        send_welcome.using(queue_name="elsewhere")
    with pytest.raises(TypeError, match="Unsupported type"):
        send_welcome.enqueue(object())  # not JSON: refused before anything is sent

    def local() -> None: ...

    with pytest.raises(_compat.InvalidTaskError, match="module level"):
        _compat.Task(func=local, priority=0, backend="default", queue_name="default", run_after=None)


def test_importable_against_djangos_own_tasks_module(
    monkeypatch: pytest.MonkeyPatch, project: dict[str, str]
) -> None:
    # Django 6 has the framework built in as django.tasks (Python >= 3.12, so
    # not on this machine): with the backport's modules standing in under
    # those names, the integration takes them from there.
    import django_tasks

    from venturi_redis.contrib.django import _compat

    for sub in ["", ".base", ".backends", ".backends.base", ".exceptions", ".signals"]:
        monkeypatch.setitem(sys.modules, f"django.tasks{sub}", importlib.import_module(f"django_tasks{sub}"))
    try:
        assert importlib.reload(_compat).FRAMEWORK == "django.tasks"
    finally:
        monkeypatch.undo()
        assert importlib.reload(_compat).FRAMEWORK == "django_tasks"
    assert django_tasks.task_backends is _compat.task_backends
