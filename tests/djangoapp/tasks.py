"""Tasks like django-tasks' test tasks (``tests/tasks.py`` of django-tasks-db and django-tasks-rq)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

try:  # Django >= 6.0
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskContext, task


@task(backend="upstream")
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task(backend="upstream")
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task(backend="upstream")
def calculate_meaning_of_life() -> int:
    return 42


@task(backend="upstream")
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(backend="upstream")
async def failing_task_value_error_async() -> None:
    raise ValueError("This task failed due to ValueError")


@task(backend="upstream")
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(backend="upstream")
async def failing_task_system_exit_async() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(backend="upstream")
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task(backend="upstream")
def exit_task() -> None:
    exit(1)


@task(backend="upstream")
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task(backend="upstream")
def complex_return_value() -> Any:
    # Neither JSON nor anything else a result can be stored as.
    return lambda: True


@task(backend="upstream")
def hang(marker: str) -> None:
    """Says it runs (``marker`` appears), then sleeps an hour, never looking at anything."""
    Path(marker).write_text("running")
    time.sleep(3600)


@task(backend="upstream")
def wait_for_file(marker: str, path: str) -> str:
    """Says it runs, then waits (a minute at most) until ``path`` exists."""
    Path(marker).write_text("running")
    deadline = time.monotonic() + 60
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "saw it" if Path(path).exists() else "gave up"


@task(backend="upstream", takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(backend="upstream", takes_context=True)
def check_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


@task(backend="upstream")
def charge(card: str) -> None:
    """A careless task: its exception quotes its argument (issue 38, the Django probe)."""
    raise ValueError(f"card {card} declined")
