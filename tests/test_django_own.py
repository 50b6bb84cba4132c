"""``VenturiBackend`` held to Django 6's own tests of its Tasks framework (``tests/tasks/`` of Django).

``make test-django6`` unpacks them from the sdist of the Django release it
installed in ``.venv-django6`` and names their directory in
``VENTURI_DJANGO_TESTS``. Each of Django's tests runs as Django wrote it,
its own settings and assertions, on this backend: wherever those settings
name Django's ``DummyBackend`` or ``ImmediateBackend``, the backend made is a
``VenturiBackend`` on this suite's redis-server (queues of each test's own):

- for ``DummyBackend``, no worker runs: a result stays ``READY``, as the
  dummy backend's do;
- for ``ImmediateBackend``, ``enqueue`` is ours, then our worker runs in this
  process until nothing is due (``venturi_worker --batch``), then the result
  is read back from Redis: what the immediate backend returns at once.

Django's test classes that hold no backend of ours (``test_custom_backend.py``:
``BaseTaskBackend`` and custom ``Task`` classes on backends of its own) are
not run. Where a test checks what only Django's dummy or immediate backend
does (its in-memory ``results``, ``clear()``, no ``get_result``, no
``run_after``, a ``KeyboardInterrupt`` raised to the caller), ``DIFFERS``
says why, and the failure that test must end in: any other failure, or a
pass, fails here. Every other test must pass.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import textwrap
import threading
import unittest
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import django
import pytest

DJANGO_TESTS = os.environ.get("VENTURI_DJANGO_TESTS", "")
MODULES = ["test_tasks", "test_dummy_backend", "test_immediate_backend"]

if django.VERSION < (6, 0):
    if DJANGO_TESTS:
        raise RuntimeError(
            f"VENTURI_DJANGO_TESTS is set, but this is Django {django.__version__}: run them in .venv-django6"
        )
    pytest.skip(
        f"Django's own tasks tests need Django 6 (Python >= 3.12), this is {django.__version__}: "
        "make test-django6 runs them",
        allow_module_level=True,
    )
if not Path(DJANGO_TESTS, "tasks", "test_tasks.py").is_file():
    raise RuntimeError(
        f"VENTURI_DJANGO_TESTS={DJANGO_TESTS!r} holds no tasks/test_tasks.py: make test-django6 unpacks "
        "Django's tests/tasks/ from the sdist of the installed release and names them"
    )

# Where Django's test checks what only its own dummy or immediate backend does:
# why, and a text the failure must show (so it fails for that reason, not another).
DIFFERS: dict[str, tuple[str, str]] = {
    # DummyBackend's own API: an in-memory list of results, and clear().
    "test_tasks.TaskTestCase.test_enqueue_task": (
        "reads DummyBackend.results, the dummy's in-memory store",
        "object has no attribute 'results'",
    ),
    "test_tasks.TaskTestCase.test_enqueue_task_async": (
        "reads DummyBackend.results, the dummy's in-memory store",
        "object has no attribute 'results'",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_enqueue_task": (
        "reads DummyBackend.results, the dummy's in-memory store",
        "object has no attribute 'results'",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_enqueue_task_async": (
        "reads DummyBackend.results, the dummy's in-memory store",
        "object has no attribute 'results'",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "edits the result in DummyBackend.results, then refreshes",
        "object has no attribute 'results'",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": (
        "edits the result in DummyBackend.results, then refreshes",
        "object has no attribute 'results'",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_clear": (
        "DummyBackend.clear() forgets its results; ours are in Redis",
        "object has no attribute 'clear'",
    ),
    "test_dummy_backend.DummyBackendTransactionTestCase."
    "test_doesnt_wait_until_transaction_commit_by_default": (
        "counts DummyBackend.results (the enqueue inside the transaction is written at once here too)",
        "object has no attribute 'results'",
    ),
    # isinstance checks against Django's own classes.
    "test_tasks.TaskTestCase.test_using_correct_backend": (
        "checks that the backend is a DummyBackend",
        "is not an instance of <class 'django.tasks.backends.dummy.DummyBackend'>",
    ),
    "test_tasks.TaskTestCase.test_get_backend": (
        "checks that the backend is a DummyBackend",
        "is not an instance of <class 'django.tasks.backends.dummy.DummyBackend'>",
    ),
    "test_dummy_backend.DummyBackendTestCase.test_using_correct_backend": (
        "checks that the backend is a DummyBackend",
        "is not an instance of <class 'django.tasks.backends.dummy.DummyBackend'>",
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_using_correct_backend": (
        "checks that the backend is an ImmediateBackend",
        "is not an instance of <class 'django.tasks.backends.immediate.ImmediateBackend'>",
    ),
    # ImmediateBackend runs nothing later and stores nothing.
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        "ImmediateBackend has no get_result (supports_get_result = False); ours reads results from Redis "
        "(and an id it never gave is TaskResultDoesNotExist)",
        "TaskResultDoesNotExist: 123",
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
        "ImmediateBackend cannot refresh a result; ours can",
        "NotImplementedError not raised",
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "ImmediateBackend has no run_after (supports_defer = False); ours defers",
        "InvalidTask not raised",
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "ImmediateBackend runs the task in the caller, so a KeyboardInterrupt reaches it; a worker "
        "takes it as the task's failure (FAILED, logged), as Django's database backend does",
        "Unexpected logs found: ['ERROR:django.tasks:Task id=",  # logged as the task's failure, not raised
    ),
    # QUEUES: [] (docs/integrations.md): any name would be accepted, and no worker would run it.
    "test_tasks.TaskTestCase.test_unknown_queue_name": (
        "QUEUES: [] accepts any queue name on Django's backends; ours takes it as ['default'] and refuses "
        "a name its worker would never consume",
        "Queue 'queue-2' is not valid for backend. TASKS['immediate'] has QUEUES: []",
    ),
    **{
        f"{module}.{cls}.{test}": (
            "the class's QUEUES: [] takes any queue name on Django's backends, so `using(queue_name="
            "'unknown_queue')` is refused only at the enqueue under other settings; ours refuses it at once",
            "Queue 'unknown_queue' is not valid for backend. TASKS['default'] has QUEUES: []",
        )
        for module, cls in [
            ("test_dummy_backend", "DummyBackendTestCase"),
            ("test_immediate_backend", "ImmediateBackendTestCase"),
        ]
        for test in ["test_validate_on_enqueue", "test_validate_on_aenqueue"]
    },
}


def _django_tests() -> list[str]:
    """``module.Class.method`` of each of Django's tests in MODULES, read from the source (not imported)."""
    found = []
    for module in MODULES:
        tree = ast.parse(Path(DJANGO_TESTS, "tasks", f"{module}.py").read_text())
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and cls.name.endswith("TestCase"):
                for node in cls.body:
                    is_def = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    if is_def and node.name.startswith("test"):
                        found.append(f"{module}.{cls.name}.{node.name}")
    return found


TESTS = _django_tests()

_prefix = ""  # the current test's queue names start with it


@functools.cache
def _backends() -> tuple[type[Any], type[Any]]:
    """Our stand-ins for Django's DummyBackend and ImmediateBackend (made once, after Django's set-up)."""
    from venturi_redis.contrib.django import VenturiBackend
    from venturi_redis.contrib.django.worker import make_worker, run_worker

    class AsDummy(VenturiBackend):  # type: ignore[misc]
        """VenturiBackend on this test's own queues; no worker runs."""

        def __init__(self, alias: str, params: dict[str, Any]) -> None:
            super().__init__(alias, params)  # REDIS_URL: the suite's redis-server
            self.default_queue = f"{_prefix}-default"

        def venturi_queue(self, queue_name: str) -> str:
            return f"{_prefix}-{queue_name}"

    async def run_due(alias: str) -> None:
        worker = make_worker(alias, handle_signals=False)
        try:
            await run_worker(worker, batch=True)
        finally:
            for client in {id(q.client): q.client for q in worker.queues}.values():
                await client.aclose()

    class AsImmediate(AsDummy):
        """Enqueue, run our worker until nothing is due, and return the result read back from Redis."""

        def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
            result = super().enqueue(task, args, kwargs)
            # In a thread of its own, as a worker process is: not in the thread of
            # an async test's sync_to_async, whose executor the worker's own
            # sync_to_async (a signal's sync receivers) cannot submit to.
            failed: list[BaseException] = []

            def work() -> None:
                try:
                    anyio.run(run_due, self.alias)
                except BaseException as exc:  # noqa: BLE001 - raised below, in the caller
                    failed.append(exc)

            thread = threading.Thread(target=work, name=f"worker for {result.id}")
            thread.start()
            thread.join()
            if failed:
                raise failed[0]
            return self.get_result(result.id)

    return AsDummy, AsImmediate


def _adapted(cls: type[Any]) -> type[Any]:
    """``cls`` as it runs here: a ``setUp`` that only empties the dummy's store is not run
    (each test has queues of its own instead)."""
    own = cls.__dict__.get("setUp")
    if own is None:
        return cls
    body = textwrap.dedent(inspect.getsource(own)).splitlines()[1:]
    if [line.strip() for line in body if line.strip()] != ["default_task_backend.clear()"]:
        return cls  # a setUp that does more is run as it is
    return type(cls.__name__, (cls,), {"setUp": lambda self: None, "__module__": cls.__module__})


@pytest.fixture
def django_tests(django_project: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Django's tests importable (as their package, ``tasks``), its two backends ours, fresh queue names."""
    global _prefix
    import django.tasks.backends.dummy as dummy
    import django.tasks.backends.immediate as immediate

    from venturi_redis.contrib.django._discovery import discover

    monkeypatch.syspath_prepend(DJANGO_TESTS)
    for module in MODULES:  # first: they keep Django's own classes for their isinstance checks
        importlib.import_module(f"tasks.{module}")
    # The app's tasks modules (the worker's discovery imports them), under the
    # project's settings: under a Django test's TASKS, shop's "reports" queue is unknown.
    discover()
    as_dummy, as_immediate = _backends()
    # Settings name backends by import path: these names resolve to ours.
    monkeypatch.setattr(dummy, "DummyBackend", as_dummy)
    monkeypatch.setattr(immediate, "ImmediateBackend", as_immediate)
    _prefix = f"dj-{uuid.uuid4().hex[:8]}"
    yield
    _prefix = ""


def _run(name: str) -> list[str]:
    """Run one of Django's tests with unittest (its class's setUpClass and settings included)."""
    module, cls_name, method = name.split(".")
    imported = importlib.import_module(f"tasks.{module}")
    cls = _adapted(getattr(imported, cls_name))
    result = unittest.TestResult()
    unittest.TestSuite([cls(method)]).run(result)
    problems = [text for _, text in result.errors + result.failures]
    problems += [f"skipped: {why}" for _, why in result.skipped]
    problems += ["unexpected success" for _ in result.unexpectedSuccesses]
    return problems


def test_django_own_tasks_tests_were_found() -> None:
    # Each module has its tests; a Django release that moved them must not pass unnoticed.
    assert {t.split(".")[0] for t in TESTS} == set(MODULES)
    assert len(TESTS) >= 70, TESTS
    assert set(DIFFERS) <= set(TESTS), sorted(set(DIFFERS) - set(TESTS))


@pytest.mark.parametrize("name", TESTS)
def test_djangos_own(name: str, django_tests: None) -> None:
    problems = _run(name)
    if name in DIFFERS:
        why, shows = DIFFERS[name]
        assert problems, f"{name} passes now: take it out of DIFFERS ({why})"
        assert any(shows in p for p in problems), "\n".join(problems)
    else:
        assert not problems, "\n".join(problems)
