"""Finding the application's tasks: every ``tasks`` module of INSTALLED_APPS.

A worker runs a job only if its function is among the tasks found here; the
module path stored in the job is looked up, never imported.
"""

from __future__ import annotations

import sys
from typing import Any

from django.utils.module_loading import autodiscover_modules

from . import _compat
from ._jobs import known_tasks, remember_all


def discover(*modules: str) -> dict[str, Any]:
    """Import each app's ``tasks`` module (and ``modules``), and remember the tasks they define."""
    autodiscover_modules("tasks")
    for name in modules:
        __import__(name)
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name.endswith(".tasks") or name == "tasks" or name in modules):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, _compat.Task):
                found.append(value)
    remember_all(found)
    return known_tasks()
