"""Django's Tasks framework, wherever it lives: ``django.tasks`` (Django >= 6.0)
or the ``django-tasks`` backport (``django_tasks``, for Django 5.2 LTS).

Both have the same contract under different import paths; everything else in
this package takes the names from here.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.dispatch import Signal


def _framework() -> str:
    try:
        importlib.import_module("django.tasks.base")
    except ImportError:
        pass
    else:
        return "django.tasks"
    try:
        importlib.import_module("django_tasks.base")
    except ImportError:
        raise ImportError(
            "venturi_redis.contrib.django needs Django's Tasks framework: Django >= 6.0, or the "
            "django-tasks backport (pip install 'venturi-redis[django]')"
        ) from None
    return "django_tasks"


FRAMEWORK = _framework()

_root = importlib.import_module(FRAMEWORK)
_base = importlib.import_module(f"{FRAMEWORK}.base")
_backends = importlib.import_module(f"{FRAMEWORK}.backends.base")
_exceptions = importlib.import_module(f"{FRAMEWORK}.exceptions")
_signals = importlib.import_module(f"{FRAMEWORK}.signals")

task_backends: Any = _root.task_backends
DEFAULT_TASK_QUEUE_NAME: str = _base.DEFAULT_TASK_QUEUE_NAME
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
BaseTaskBackend: Any = _backends.BaseTaskBackend
# The backport says InvalidTaskError, Django 6 InvalidTask.
InvalidTaskError: Any = getattr(_exceptions, "InvalidTaskError", None) or _exceptions.InvalidTask
InvalidTaskBackendError: Any = (
    getattr(_exceptions, "InvalidTaskBackendError", None) or _exceptions.InvalidTaskBackend
)
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
TaskResultMismatch: Any = _exceptions.TaskResultMismatch
task_enqueued: Any = _signals.task_enqueued
task_finished: Any = _signals.task_finished
# Sent when a run starts; a framework version without it gets a signal nobody hears.
task_started: Any = getattr(_signals, "task_started", None) or Signal()
