"""The Django backend's promises, each pinned by the smallest test that breaks when its guard
does (a mutation campaign over contrib/django: enqueue's mapping, results, the worker's queues)."""

from __future__ import annotations

import pytest

import tests.test_django_upstream as upstream
import venturi_redis as vr
from tests.test_django_upstream import Upstream

# The upstream suite's fixtures: the ``upstream`` backend on queues of the test's own.
up = upstream.up
sync = upstream.sync


def test_a_django_priority_lands_on_its_level_at_each_boundary(up: Upstream, sync: vr.SyncClient) -> None:
    """docs/integrations.md: above 50 critical, 1..50 high, 0 normal, below 0 low."""
    from tests.djangoapp import tasks

    queue = sync.queue(up.queue)
    got = {p: queue.get(tasks.noop_task.using(priority=p).enqueue().id) for p in (51, 50, 1, 0, -1)}
    assert {p: i.priority for p, i in got.items() if i} == {
        51: vr.Priority.CRITICAL,
        50: vr.Priority.HIGH,
        1: vr.Priority.HIGH,
        0: vr.Priority.NORMAL,
        -1: vr.Priority.LOW,
    }


def test_an_unknown_option_is_refused_when_the_backend_is_made(up: Upstream) -> None:
    """A misspelt OPTIONS key (``urll``) must not leave the backend on its default URL."""
    from venturi_redis.contrib.django import VenturiBackend

    with pytest.raises(vr.ConfigurationError, match=r"unknown keys \['urll'\]"):
        VenturiBackend("typo", {"QUEUES": ["default"], "OPTIONS": {"urll": "redis://elsewhere:6379/0"}})


def test_a_plain_venturi_job_on_the_backends_queue_is_no_result(up: Upstream, sync: vr.SyncClient) -> None:
    """A job that is no Django call (another KIND, its own payload) is skipped, not read as a corrupt one."""
    from tests.tasks import Echo
    from venturi_redis.contrib.django import _compat

    job_id = sync.queue(up.queue).enqueue(Echo(text="not a task"))
    with pytest.raises(_compat.TaskResultDoesNotExist):
        _compat.task_backends["upstream"].get_result(job_id)
