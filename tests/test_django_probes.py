"""Issue 38, the probe of the Django backend: a careless user and a hostile operator.

Each test pins what happens when a task's arguments cannot be stored, are
huge, name a function the worker does not have, are enqueued inside a
database transaction, when a result is read for an unknown id or from a job
edited by hand, and for ``priority`` and ``run_after`` at their edges.
docs/guarantees.md ("The Django backend") lists what was found.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

import tests.test_django_upstream as upstream
import venturi_redis as vr
from tests.test_django_upstream import Upstream, run_batch
from venturi_redis._store.keys import QueueKeys

# The upstream suite's fixtures: the ``upstream`` backend on queues of the test's own.
up = upstream.up
sync = upstream.sync


def _backend() -> Any:
    from venturi_redis.contrib.django import _compat

    return _compat.task_backends["upstream"]


def _raw() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


# -- arguments ------------------------------------------------------------------------------


def test_a_nan_or_an_infinity_is_refused_never_run_as_none(up: Upstream, sync: vr.SyncClient) -> None:
    """Found: ``noop_task.enqueue(float("nan"))`` was accepted, its result said
    ``args == [nan]``, and the job held ``null``: the task ran with None."""
    from tests.djangoapp import tasks

    for bad in (float("nan"), float("inf"), {"x": [float("-inf")]}):
        with pytest.raises(vr.PayloadError, match="NaN or infinity"):
            tasks.noop_task.enqueue(bad)
        with pytest.raises(vr.PayloadError, match="NaN or infinity"):
            tasks.noop_task.enqueue(x=bad)
    assert sum(sync.queue(up.queue).counts()[k] for k in ("pending", "running", "completed")) == 0


def test_the_result_enqueue_returns_holds_the_arguments_as_stored(up: Upstream) -> None:
    """Found: a dict with int keys was returned as given (``{1: "a"}``) but stored,
    read back and passed to the task as JSON holds it (``{"1": "a"}``)."""
    from tests.djangoapp import tasks

    result = tasks.noop_task.enqueue({1: "a"}, (2, 3), b"bytes", k={2: None})
    assert result.args == [{"1": "a"}, [2, 3], "bytes"] and result.kwargs == {"k": {"2": None}}
    assert _backend().get_result(result.id) == result


def test_what_json_cannot_hold_or_too_big_is_refused_with_nothing_written(
    up: Upstream, sync: vr.SyncClient
) -> None:
    """Held: a set, an object, an int past 64 bits, 2 MB of text are refused at enqueue."""
    from tests.djangoapp import tasks

    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.noop_task.enqueue({"a": {1, 2}})
    with pytest.raises(vr.PayloadError, match="Integer value out of range"):
        tasks.noop_task.enqueue(2**70)
    with pytest.raises(vr.PayloadTooLarge, match="over the cap of 1048576"):
        tasks.noop_task.enqueue("x" * (2 * 1024 * 1024))
    assert sync.queue(up.queue).counts()["pending"] == 0


# -- a task the worker does not have ----------------------------------------------------------


def test_a_task_path_the_worker_does_not_have_is_never_imported(up: Upstream, sync: vr.SyncClient) -> None:
    """Held: a job naming a function no tasks module defines (renamed or removed
    since, or written by a hostile hand) dies ``unknown_kind``; the module it
    names is never imported, by the worker or by get_result. A job whose KIND is
    a real task but whose payload names another dies ``permanent``."""
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat
    from venturi_redis.contrib.django._jobs import call_class

    queue = sync.queue(up.queue)
    trap = "tests.djangoapp.trap.boom"
    renamed = queue.enqueue(call_class(trap)(task=trap, args=[], kwargs={}, backend="upstream"))
    real = tasks.noop_task.module_path
    mislabelled = queue.enqueue(call_class(real)(task=trap, args=[], kwargs={}, backend="upstream"))
    with pytest.raises(_compat.TaskResultDoesNotExist, match="not among this process's tasks"):
        _backend().get_result(renamed)
    run_batch()
    assert "tests.djangoapp.trap" not in sys.modules
    dead = queue.get(renamed)
    assert dead is not None and dead.dead_reason == vr.DeadReason.UNKNOWN_KIND, dead
    assert f"no handler for kind {trap!r}" in (dead.note or "")
    other = queue.get(mislabelled)
    assert other is not None and other.dead_reason == vr.DeadReason.PERMANENT, other
    assert "names another task" in (other.note or "")
    with pytest.raises(_compat.TaskResultDoesNotExist):
        _backend().get_result(renamed)
    assert "tests.djangoapp.trap" not in sys.modules


# -- results --------------------------------------------------------------------------------------


def test_unknown_ids_are_results_that_do_not_exist(up: Upstream) -> None:
    """Held: nothing that is not a job id is read as a key; an unknown one does not exist."""
    from venturi_redis.contrib.django import _compat

    for bad in ("", "\x00", "x" * 10_000, "01arz3ndektsv4rrffq69g5fav", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "*"):
        with pytest.raises(_compat.TaskResultDoesNotExist):
            _backend().get_result(bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("state", "bogus"),
        ("result", b"\xc1"),
        ("payload", b"\xc1"),
        ("created_at", "x"),
        ("finished_at", "x"),
    ],
)
def test_a_corrupt_job_is_an_error_never_a_false_result(up: Upstream, field: str, value: Any) -> None:
    """Found: a completed task whose hash an operator damaged read back as a result that
    was not true: ``state`` garbage read READY for ever, a corrupt ``result`` read
    SUCCESSFUL with ``return_value`` None, a corrupt payload "does not exist", a
    corrupt ``created_at`` enqueued in 1970. Now vr.CorruptQueueError names the job."""
    from tests.djangoapp import tasks

    result = tasks.calculate_meaning_of_life.enqueue()
    run_batch()
    assert _backend().get_result(result.id).return_value == 42
    _raw().hset(QueueKeys.for_queue(up.queue).job(result.id), field, value)
    expected = f"{result.id}: .*corrupt, its fields {field} do not parse"
    with pytest.raises(vr.CorruptQueueError, match=expected):
        _backend().get_result(result.id)


def test_a_payload_edited_into_no_task_call_is_an_error_naming_the_job(up: Upstream) -> None:
    """Found: a Django job whose payload an operator edited (``args`` not a list)
    read as a result that "does not exist"."""
    from tests.djangoapp import tasks
    from venturi_redis._model.codec import pack

    result = tasks.calculate_meaning_of_life.enqueue()
    run_batch()
    path = tasks.calculate_meaning_of_life.module_path
    edited = pack({"task": path, "args": "not a list", "kwargs": {}, "backend": "upstream"})
    _raw().hset(QueueKeys.for_queue(up.queue).job(result.id), "payload", edited)
    with pytest.raises(vr.CorruptQueueError, match=f"{result.id}: .*its payload is no task call"):
        _backend().get_result(result.id)


def test_a_wrong_type_job_key_or_journal_is_an_error_naming_the_job(up: Upstream) -> None:
    """Found: a raw WRONGTYPE ResponseError, naming neither the job nor what to do."""
    from tests.djangoapp import tasks

    keys = QueueKeys.for_queue(up.queue)
    for key_of, what in ((keys.job, "its key is not a hash"), (keys.journal, "its journal is not a stream")):
        result = tasks.calculate_meaning_of_life.enqueue()
        run_batch()
        _raw().delete(key_of(result.id))
        _raw().set(key_of(result.id), "x")
        with pytest.raises(vr.CorruptQueueError, match=f"{result.id}: .*{what}.*venturi job show"):
            _backend().get_result(result.id)


# -- transactions ---------------------------------------------------------------------------


def test_enqueue_inside_a_transaction_is_at_once_and_on_commit_ties_it_to_the_commit(
    up: Upstream, sync: vr.SyncClient
) -> None:
    """Held, as Django's framework has it (docs/integrations.md): ``enqueue`` writes
    the job at once, so a task enqueued in a transaction that rolls back is run
    all the same; ``transaction.on_commit(partial(task.enqueue, ...))`` enqueues
    only on commit, and nothing when it rolls back."""
    from django.db import transaction

    from tests.djangoapp import tasks

    class Rollback(Exception):
        pass

    queue = sync.queue(up.queue)
    enqueued: list[Any] = []

    @transaction.atomic
    def rolled_back() -> None:
        enqueued.append(tasks.noop_task.enqueue("rolled back, run all the same"))
        transaction.on_commit(partial(tasks.noop_task.enqueue, "never"))
        raise Rollback

    with pytest.raises(Rollback):
        rolled_back()
    with transaction.atomic():
        transaction.on_commit(partial(tasks.noop_task.enqueue, "committed"))
        assert queue.counts()["pending"] == 1  # only the one enqueued at once, so far
    run_batch()
    done = queue.list_jobs(state="completed")
    assert sorted(j.payload["args"][0] for j in done) == ["committed", "rolled back, run all the same"]
    assert _backend().get_result(enqueued[0].id).status == "SUCCESSFUL"


# -- priority and run_after ---------------------------------------------------------------------


def test_priority_and_run_after_at_their_edges(up: Upstream, sync: vr.SyncClient) -> None:
    """Held: Django's range is checked by Django; a ``run_after`` in year 1 runs now, one
    past venturi's 100 years is a ConfigurationError, and any zone is the same instant."""
    from tests.djangoapp import tasks
    from venturi_redis.contrib.django import _compat

    queue = sync.queue(up.queue)
    for bad in (-101, 101, 0.5):
        with pytest.raises(_compat.InvalidTaskError, match="priority must be a whole number"):
            tasks.noop_task.using(priority=bad)
    edges = {p: queue.get(tasks.noop_task.using(priority=p).enqueue().id) for p in (-100, 100)}
    levels = {p: i.priority for p, i in edges.items() if i}
    assert levels == {-100: vr.Priority.LOW, 100: vr.Priority.CRITICAL}
    with pytest.raises(vr.ConfigurationError, match="100 years"):
        tasks.noop_task.using(run_after=datetime(9999, 12, 31, tzinfo=UTC)).enqueue()
    past = queue.get(tasks.noop_task.using(run_after=datetime(1, 1, 2, tzinfo=UTC)).enqueue().id)
    assert past is not None and past.eligible_at == past.created_at
    later = datetime.now(UTC) + timedelta(hours=1)
    far_zone = later.astimezone(timezone_of(-11))
    a, b = (queue.get(tasks.noop_task.using(run_after=t).enqueue().id) for t in (later, far_zone))
    assert a is not None and b is not None and a.eligible_at and b.eligible_at
    assert abs((a.eligible_at - b.eligible_at).total_seconds()) < 1


def test_run_after_naive_or_aware_without_use_tz(up: Upstream, sync: vr.SyncClient) -> None:
    """Found: with ``USE_TZ = False`` an aware ``run_after`` (Django accepts it) raised
    ``TypeError: can't subtract offset-naive and offset-aware datetimes``. A naive one
    is read in TIME_ZONE, an aware one as the instant it is: both are the same delay."""
    from django.test import override_settings

    from tests.djangoapp import tasks

    queue = sync.queue(up.queue)
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        aware = datetime.now(UTC) + timedelta(hours=1)
        naive = aware.astimezone(ZoneInfo("America/New_York")).replace(tzinfo=None)
        a, b = (queue.get(tasks.noop_task.using(run_after=t).enqueue().id) for t in (aware, naive))
    assert a is not None and b is not None and a.eligible_at and b.eligible_at
    assert abs((a.eligible_at - aware).total_seconds()) < 1
    assert abs((b.eligible_at - aware).total_seconds()) < 1


def timezone_of(hours: int) -> Any:
    from datetime import timezone

    return timezone(timedelta(hours=hours))


# -- a secret in an exception's message ------------------------------------------------------------


def test_an_exception_quoting_an_argument_is_stored_and_sent_as_raised(
    up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Pinned, not masked: Django's tasks have no sensitive marker (a ``vr.Task``'s
    ``Field(json_schema_extra={"sensitive": True})``), so an exception that quotes an
    argument reaches the job's note and traceback, the worker's log and
    ``task_finished`` as raised, as on Django's database backend. What venturi
    masks by itself: the arguments' values in ``venturi job show`` without
    ``--show-payload``. docs/integrations.md says to pass a reference, not a secret."""
    import logging
    import subprocess

    from tests.djangoapp import tasks

    caplog.set_level(logging.WARNING)
    card = "4111111111111111"
    result = tasks.charge.enqueue(card)
    run_batch()
    result.refresh()
    assert result.status == "FAILED" and f"card {card} declined" in result.errors[0].traceback
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("venturi")]
    assert any(f"card {card} declined" in line for line in logged), logged
    cli = [sys.executable, "-m", "venturi_redis.cli", "job", "show", result.id]
    shown = subprocess.run(
        [*cli, "--redis", os.environ["REDIS_URL"]],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    ).stdout
    payload = next(line for line in shown.splitlines() if line.startswith("payload"))
    assert card not in payload and '"args": "***"' in payload, payload
