"""A module no task of this app lives in: importing it leaves a mark (``IMPORTED``).

The probe of issue 38 names ``tests.djangoapp.trap.boom`` in a job written
by hand: the worker must never import a name read from Redis.
"""

from __future__ import annotations

IMPORTED = True


def boom() -> None:  # pragma: no cover - never called: the point of the test
    raise AssertionError("a name read from Redis was imported and called")
