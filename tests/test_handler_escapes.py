"""Handlers that raise what ``except Exception`` does not catch (issue 26, items 1 and 10),
and the application's other code a run calls (an exception's ``__str__``, a task's
``backoff()``, a model's validator, the worker's observer) when it raises.

A ``CancelledError`` the worker did not cause is a failed run, and the worker
goes on. ``KeyboardInterrupt`` / ``SystemExit`` stop the worker, but only after
its other running jobs are released (not charged) and the culprit's run is
recorded as failed; ``venturi worker`` then exits non-zero.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel, field_validator

import venturi_redis as vr
from tests.helpers import events, make_worker
from tests.procs.escapes import HANDLERS, Bail, SelfCancel, Sleeper
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


async def test_a_handlers_own_cancelled_error_is_a_failed_run_and_the_worker_goes_on(queue: vr.Queue) -> None:
    culprit = await queue.enqueue(SelfCancel(), max_failures=2)
    others = await queue.enqueue_many([Echo(text=str(i)) for i in range(5)])
    # One slot: the culprit runs first, so the others only complete if the worker went on.
    worker = make_worker(queue, *HANDLERS, EchoJob, concurrency=1, state={})
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    info = await queue.get(culprit)
    assert info is not None
    assert (info.state, info.failures, info.run_count) == (vr.JobState.DEAD, 2, 2)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal] == ["enqueued", "claimed", "failed", "claimed", "failed", "dead"]
    assert "CancelledError" in (journal[2].note or "")
    assert "the worker did not ask for" in (journal[2].note or "")
    assert journal[-1].details["reason"] == "max_failures"
    for job_id in others:
        done = await queue.get(job_id)
        assert done is not None and done.state == vr.JobState.COMPLETED
    assert (await queue.counts())["running"] == 0


class Boom(BaseException):
    """Neither an Exception nor one of the three with a rule of their own."""


class Odd(vr.Task):
    KIND: ClassVar[str] = "odd-base-exception"


class OddJob(Odd, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise Boom("boom")


async def test_another_base_exception_is_a_failed_run_and_the_worker_goes_on(queue: vr.Queue) -> None:
    culprit = await queue.enqueue(Odd(), max_failures=2)
    others = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    worker = make_worker(queue, OddJob, EchoJob, concurrency=1, state={})
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    info = await queue.get(culprit)
    assert info is not None and (info.state, info.failures) == (vr.JobState.DEAD, 2)
    failed = [e for e in await queue.journal(culprit) if e.event == "failed"]
    assert [e.note for e in failed] == ["boom", "boom"]
    assert failed[0].details["error_type"] == f"{__name__}.Boom"
    for job_id in others:
        done = await queue.get(job_id)
        assert done is not None and done.state == vr.JobState.COMPLETED


class Unprintable(Exception):
    """A library's exception whose __str__ raises (a format that does not fit its arguments)."""

    template = "{missing}"

    def __str__(self) -> str:
        return self.template.format(**{})


class Garbled(vr.Task):
    KIND: ClassVar[str] = "garbled-exception"


class GarbledJob(Garbled, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise Unprintable()


class GarbledSyncJob(Garbled, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise Unprintable()


@pytest.mark.parametrize("handler", [GarbledJob, GarbledSyncJob], ids=["async", "sync"])
async def test_an_exception_whose_str_raises_is_a_failed_run_with_a_note(
    queue: vr.Queue, handler: type
) -> None:
    """Its run was an internal error before: the job waited out its lease, reclaimed as
    lease_expired, and no note said what the handler raised."""
    culprit = await queue.enqueue(Garbled(), max_failures=1)
    other = await queue.enqueue(Echo(text="after"))
    worker = make_worker(queue, handler, EchoJob, concurrency=1, state={}, lease=60)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal] == ["enqueued", "claimed", "failed", "dead"]
    assert journal[2].note == "Unprintable (its str() raised KeyError: 'missing')"
    assert journal[2].details["error_type"] == f"{__name__}.Unprintable"
    done = await queue.get(other)
    assert done is not None and done.state == vr.JobState.COMPLETED


class BadBackoff(vr.Task):
    """A task whose backoff() raises, or returns what is not a vr.Backoff."""

    KIND: ClassVar[str] = "bad-backoff"
    returns: bool = False

    def backoff(self) -> vr.Backoff | None:
        if self.returns:
            return 5  # type: ignore[return-value]  # seconds, meant
        raise ValueError("no backoff configured for this tenant")


class BadBackoffJob(BadBackoff, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise RuntimeError(f"run {ctx.run_count} failed")


@pytest.mark.parametrize("returns", [False, True], ids=["raises", "not-a-backoff"])
async def test_a_task_backoff_that_breaks_falls_back_to_the_workers(
    queue: vr.Queue, returns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed run is recorded and retried with the worker's backoff, and the slip is logged
    once; before, a raising backoff() was an internal error that left the job to its lease."""
    caplog.set_level(logging.WARNING, logger="venturi_redis.worker")
    culprit = await queue.enqueue(BadBackoff(returns=returns), max_failures=3)
    worker = make_worker(queue, BadBackoffJob, concurrency=1, state={}, lease=60)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal] == ["enqueued", *["claimed", "failed"] * 3, "dead"]
    assert [e.note for e in journal if e.event == "failed"] == [f"run {n} failed" for n in (1, 2, 3)]
    slips = [r.getMessage() for r in caplog.records if "BadBackoffJob.backoff()" in r.getMessage()]
    said = "returned int, not a vr.Backoff or None" if returns else "raised ValueError: no backoff configured"
    assert len(slips) == 1 and said in slips[0], slips


KNOWN_REGIONS = {"eu": 1}


class Regional(vr.Task):
    """A model whose validator raises KeyError (not ValueError) for a region it does not know."""

    KIND: ClassVar[str] = "regional"
    region: str

    @field_validator("region")
    @classmethod
    def known(cls, value: str) -> str:
        KNOWN_REGIONS[value]  # KeyError: pydantic passes it through, not a ValidationError
        return value


class RegionalJob(Regional, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def test_a_validator_raising_other_than_value_error_is_an_invalid_payload(queue: vr.Queue) -> None:
    """Dead at once, invalid_payload, as a payload that does not validate (it was an internal
    error: the job waited out its lease and was charged a failure, its note saying nothing)."""
    KNOWN_REGIONS["us"] = 2
    culprit = await queue.enqueue(Regional(region="us"))  # valid where it was made
    del KNOWN_REGIONS["us"]  # not on the worker
    other = await queue.enqueue(Echo(text="after"))
    worker = make_worker(queue, RegionalJob, EchoJob, concurrency=1, state={}, lease=60)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal] == ["enqueued", "claimed", "dead"]
    assert journal[-1].details["reason"] == "invalid_payload"
    assert journal[-1].note == (
        "payload does not decode: stored value does not validate as Regional: "
        "its validation raised KeyError: 'us'"
    )
    done = await queue.get(other)
    assert done is not None and done.state == vr.JobState.COMPLETED


class Pages(BaseModel):
    n: int = 0


class Crawl(vr.Task[Pages]):
    KIND: ClassVar[str] = "carry-reassigned"


class CrawlJob(Crawl, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Pages], state: Any) -> vr.Outcome:
        ctx.carry = {"n": ctx.carry.n + 1}  # type: ignore[assignment]  # a dict, not Pages
        return vr.Outcome.pause_in(0)


async def test_a_carry_set_to_what_is_not_its_model_ends_the_run_with_a_note(queue: vr.Queue) -> None:
    """Dead at once with a note naming the mistake, as any run state that cannot be saved (it
    was an internal error: the job waited out its lease, charged a failure, nothing said)."""
    culprit = await queue.enqueue(Crawl())
    other = await queue.enqueue(Echo(text="after"))
    worker = make_worker(queue, CrawlJob, EchoJob, concurrency=1, state={}, lease=60)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal] == ["enqueued", "claimed", "dead"]
    note = "cannot save run state: ctx.carry was set to a dict; it must stay the task's carry model"
    assert journal[-1].note == note
    done = await queue.get(other)
    assert done is not None and done.state == vr.JobState.COMPLETED


async def test_an_internal_error_fails_the_run_at_once_with_a_note(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the worker's own path for one job (here: its first run's execution raising)
    is logged with its traceback and ends that run failed, noted, at once; before, the job
    waited out its lease and was reclaimed as lease_expired with nothing said."""
    import venturi_redis._worker.worker as worker_module

    real = worker_module.execute
    calls = 0

    async def flaky(host: Any, job: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug of ours")
        return await real(host, job)

    monkeypatch.setattr(worker_module, "execute", flaky)
    caplog.set_level(logging.ERROR, logger="venturi_redis.worker")
    job_id = await queue.enqueue(Echo(text="x"))
    worker = make_worker(queue, EchoJob, concurrency=1, state={}, lease=60)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    journal = await queue.journal(job_id)
    assert [e.event for e in journal] == ["enqueued", "claimed", "failed", "claimed", "completed"]
    assert journal[2].note == "internal error in the worker: RuntimeError: a bug of ours"
    assert journal[2].details["error_type"] == "RuntimeError"
    assert 'raise RuntimeError("a bug of ours")' in journal[2].details["traceback"]
    logged = [r for r in caplog.records if "internal error running job" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


class BrokenObserver:
    """An application's observer with a bug in every method."""

    def __init__(self) -> None:
        self.calls = 0

    def job_claimed(self, queue: str, kind: str) -> None:
        self.calls += 1
        raise RuntimeError("claimed: metrics backend down")

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        self.calls += 1
        raise RuntimeError("finished: metrics backend down")

    def job_waited(self, queue: str, kind: str, seconds: float) -> None:
        raise AssertionError("not reached: job_claimed raised first")


async def test_an_observer_that_raises_neither_stops_the_worker_nor_holds_a_job(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, job_finished raising ended run() with an ExceptionGroup, and job_claimed raising
    left the rest of that claim's jobs undispatched until their leases expired."""
    caplog.set_level(logging.WARNING, logger="venturi_redis.metrics")
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(6)])
    observer = BrokenObserver()
    worker = make_worker(queue, EchoJob, concurrency=3, state={}, lease=60, observer=observer)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED and info.run_count == 1
    assert observer.calls == 12
    said = [r.getMessage() for r in caplog.records if "observer raised" in r.getMessage()]
    assert sorted(said) == [
        "the worker's observer raised in job_claimed(); ignored (logged once)",
        "the worker's observer raised in job_finished(); ignored (logged once)",
    ]


async def test_a_cancellation_from_outside_run_still_releases_the_job(queue: vr.Queue) -> None:
    """The caller cancelling ``run()`` is the worker's own cancellation: released, not failed."""
    job_id = await queue.enqueue(Sleeper())
    started = anyio.Event()
    worker = make_worker(queue, *HANDLERS, state={"started": started})
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                await started.wait()  # the handler runs (a claimed job not yet started is not released)
            tg.cancel_scope.cancel()
    info = await queue.get(job_id)
    assert info is not None and info.failures == 0
    # Only the first run is checked: the release wakes workers, and the claim
    # loop being cancelled beside it may claim the job again before it stops.
    assert (await events(queue, job_id))[:3] == ["enqueued", "claimed", "released"]


@pytest.mark.parametrize(
    ("how", "raised"), [("exit", SystemExit), ("interrupt", KeyboardInterrupt)], ids=["exit", "interrupt"]
)
async def test_system_exit_in_a_handler_stops_the_worker_and_releases_the_others(
    queue: vr.Queue, how: str, raised: type[BaseException]
) -> None:
    innocent = await queue.enqueue_many([Sleeper() for _ in range(3)])
    culprit = await queue.enqueue(Bail(how=how, sleepers=3))
    # A long grace: the worker must not wait it out when it is on its way out for a crash.
    worker = make_worker(queue, *HANDLERS, concurrency=4, state={}, shutdown_grace=60)
    with pytest.raises(raised), anyio.fail_after(20):
        await worker.run()
    for job_id in innocent:
        info = await queue.get(job_id)
        assert info is not None
        assert (info.state, info.failures, info.carry) == (vr.JobState.PENDING, 0, {"n": 1})
        assert (await events(queue, job_id))[-1] == "released"
    info = await queue.get(culprit)
    assert info is not None
    assert (info.state, info.failures) == (vr.JobState.PENDING, 1)
    last = (await queue.journal(culprit))[-1]
    assert last.event == "failed"
    assert raised.__name__ in (last.note or "") and "worker stopped" in (last.note or "")
    assert (await queue.counts())["running"] == 0


async def test_a_worker_stopping_for_a_handlers_exit_starts_nothing_more(queue: vr.Queue) -> None:
    """With slots to spare, the claim loop waits in an idle claim while the
    handlers run; the culprit's failed run puts it back to pending and wakes
    that claim, which takes it again. What a claim hands out once the worker
    is stopping at once is released unstarted: the culprit runs once, and is
    charged once, per stop."""
    innocent = await queue.enqueue_many([Sleeper() for _ in range(3)])
    culprit = await queue.enqueue(Bail(how="exit", sleepers=3))
    worker = make_worker(queue, *HANDLERS, concurrency=8, state={}, shutdown_grace=60)
    with pytest.raises(SystemExit), anyio.fail_after(20):
        await worker.run()
    info = await queue.get(culprit)
    assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 1)
    journal = await queue.journal(culprit)
    assert [e.event for e in journal].count("failed") == 1, [(e.event, e.note) for e in journal]
    for entry in journal[3:]:  # enqueued, claimed, failed; then at most a claim given back
        assert entry.event == "claimed" or entry.note == "released on worker shutdown (not started)"
    for job_id in innocent:
        info = await queue.get(job_id)
        assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 0)
    assert (await queue.counts())["running"] == 0


async def test_a_claimed_job_not_yet_started_is_released_on_the_way_out(queue: vr.Queue) -> None:
    """A forced stop (or run() cancelled) can catch a job between its claim and its
    slot task (in an inbox): it is released, not left to its lease and charged.
    The moment cannot be timed from outside, so the worker's books are set as then."""
    job_id = await queue.enqueue(Echo(text="x"))
    worker = make_worker(queue, EchoJob)
    runner = worker._runners[0]
    _, _, (job,) = await runner.claim(1)
    runner.active[job.id] = job  # handed out, never started
    await worker._release_unstarted()
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 0)
    last = (await queue.journal(job_id))[-1]
    assert (last.event, last.note) == ("released", "released on worker shutdown (not started)")
    assert not runner.active


# -- `venturi worker`, as a supervisor sees it ------------------------------------------------------


def start_cli_worker(url: str, queue_name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ESCAPES_QUEUE": queue_name}
    return subprocess.Popen(
        [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.escapes:make", "--redis", url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(proc: subprocess.Popen[str], done: Callable[[], bool], *, alive: bool = True) -> None:
    deadline = time.monotonic() + 30
    while not done():
        if alive:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_venturi_worker_survives_cancelled_errors_it_did_not_cause(redis_server: RedisServer) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(name)
        for _ in range(5):
            q.enqueue(SelfCancel(), max_failures=1)
        q.enqueue_many([Echo(text=str(i)) for i in range(5)])
        proc = start_cli_worker(redis_server.url, name)
        try:
            wait_until(proc, lambda: (c := q.counts())["dead"] == 5 and c["completed"] == 5)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        assert q.counts()["running"] == 0


@pytest.mark.parametrize(
    ("how", "code", "status"),
    [("exit", 0, 1), ("exit", 3, 3), ("interrupt", None, 130)],
    ids=["exit-0", "exit-3", "interrupt"],
)
def test_venturi_worker_exits_non_zero_when_a_handler_raises_system_exit(
    redis_server: RedisServer, how: str, code: int | None, status: int
) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(name)
        innocent = q.enqueue_many([Sleeper() for _ in range(2)])
        culprit = q.enqueue(Bail(how=how, code=code, sleepers=2))
        proc = start_cli_worker(redis_server.url, name)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == status, err
        last_line = err.strip().splitlines()[-1]
        assert "stopped: " in last_line and f"raised by the handler of job {culprit}" in last_line, err
        for job_id in innocent:
            info: Any = q.get(job_id)
            assert (info.state, info.failures) == (vr.JobState.PENDING, 0)
        info = q.get(culprit)
        assert (info.state, info.failures) == (vr.JobState.PENDING, 1)
        assert q.counts()["running"] == 0
