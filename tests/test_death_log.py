"""A death is never silent (issue 33 item 3): one WARNING line with the job id, kind, reason and note.

Nor is a failed run (issue 39 item 3): a WARNING with its exception type,
a few per kind per minute (``_worker/failure_log.py``).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from pydantic import Field

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo, Flaky, FlakyJob
from venturi_redis._worker import failure_log
from venturi_redis._worker.execute import TRACEBACK_TAIL
from venturi_redis._worker.failure_log import FailureLog

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def fresh_failure_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # The rate limit is per process: runs of other tests must not use up this one's lines.
    monkeypatch.setattr(failure_log, "FAILURES", FailureLog())


async def test_every_death_logs_a_warning(queue: vr.Queue, caplog: pytest.LogCaptureFixture) -> None:
    doomed = await queue.enqueue(Doomed())
    unknown = await queue.enqueue(Echo(text="nobody handles echo here"))
    flaky = await queue.enqueue(Flaky(fail_times=5))
    with caplog.at_level(logging.INFO, logger="venturi_redis.worker"):
        await drain(queue, DoomedJob, FlakyJob, max_failures=2)
    deaths = [r for r in caplog.records if r.levelno == logging.WARNING and " is dead " in r.getMessage()]
    said = {r.getMessage().split()[1]: r.getMessage() for r in deaths}
    assert set(said) == {doomed, unknown, flaky}
    assert f"({Doomed.KIND}) on queue {queue.name} is dead (permanent): resource gone" in said[doomed]
    assert "(echo)" in said[unknown] and "(unknown_kind): no handler for kind 'echo'" in said[unknown]
    assert "(max_failures): boom 2" in said[flaky]
    for jid in (doomed, unknown, flaky):
        info = await queue.get(jid)
        assert info is not None and info.state.value == "dead"
    # A retried failure is not a death, but an operator sees it: a WARNING with its type.
    failed = [r for r in caplog.records if "boom 1" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in failed] == [
        (logging.WARNING, f"job {flaky} (flaky) failed: RuntimeError: boom 1")
    ]


async def test_failed_runs_warn_with_their_type_a_few_per_kind(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    # A deploy that breaks a handler fails every run: the log says so, but not 40 times.
    ids = await queue.enqueue_many([Lookup(user=f"u{i}", token="t0ken") for i in range(20)])
    with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
        await drain(queue, LookupJob, max_failures=2)
    failed = [r.getMessage() for r in caplog.records if " failed: " in r.getMessage()]
    assert len(failed) == failure_log.BURST
    assert all(m.endswith("(lookup) failed: KeyError: 'user_id ***'") for m in failed)
    assert {m.split()[1] for m in failed} <= set(ids)


def test_the_failure_log_holds_back_then_says_how_many(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    flog = FailureLog(burst=2, window=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
        shown = [flog.failed(f"j{i}", "send", "OSError", "down") for i in range(5)]
        assert flog.failed("x", "other-kind", "OSError", "down")  # per kind
        now[0] = 61.0  # the next window: its first line tells what was held back
        assert flog.failed("j5", "send", "OSError", "down")
    assert shown == [True, True, False, False, False]
    assert (
        caplog.messages[-1]
        == "job j5 (send) failed: OSError: down (3 more failed runs of send were not logged)"
    )


class Lookup(vr.Task):
    KIND: ClassVar[str] = "lookup"
    user: str
    token: str = Field(default="", json_schema_extra={"sensitive": True})
    depth: int = 0

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.01, cap=0.05)


class LookupJob(Lookup, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.depth:
            return _recurse(self.depth, self.token)
        if self.user == "gone":
            raise vr.TaskError.permanent("user deleted")
        raise KeyError(f"user_id {self.token}")


def _recurse(n: int, token: str) -> vr.Outcome:
    if n == 0:
        raise ValueError("bottom reached " + "." * 3000 + f" with {token}")
    return _recurse(n - 1, token)


async def test_the_journal_keeps_the_exception_type_and_traceback_tail(queue: vr.Queue) -> None:
    # `raise KeyError("user_id")` used to leave only "'user_id'": no type, no traceback.
    retried = await queue.enqueue(Lookup(user="ann", token="s3cr3t-token"))
    dead = await queue.enqueue(Lookup(user="gone"))
    deep = await queue.enqueue(Lookup(user="bob", token="tok-deep-777", depth=200))
    await drain(queue, LookupJob, max_failures=2)

    failed = [e for e in await queue.journal(retried) if e.event == "failed"]
    assert len(failed) == 2
    for e in failed:
        assert e.details["error_type"] == "KeyError"
        tb = e.details["traceback"]
        assert tb.startswith("Traceback (most recent call last):")
        assert "in handle" in tb and 'raise KeyError(f"user_id {self.token}")' in tb
        # The task's sensitive value is masked in the traceback as in the note.
        assert tb.endswith("KeyError: 'user_id ***'") and "s3cr3t-token" not in tb
        assert e.note == "'user_id ***'"

    (death,) = [e for e in await queue.journal(dead) if e.event == "dead"]
    assert death.details["reason"] == "permanent"
    assert death.details["error_type"] == "venturi_redis.TaskError"
    assert "user deleted" in death.details["traceback"]

    # Bounded: a 3 KB message 200 frames deep keeps only the tail (the end nearest the raise),
    # with the frames that raised it: the message's line is cut in its middle (its whole
    # start is the note), so it cannot push them out (tests/test_large_values.py).
    (first, *_) = [e for e in await queue.journal(deep) if e.event == "failed"]
    tb = first.details["traceback"]
    assert first.details["error_type"] == "ValueError"
    assert len(tb) <= TRACEBACK_TAIL + 4 and 'raise ValueError("bottom reached "' in tb
    assert tb.endswith(". with ***") and "tok-deep-777" not in tb


async def test_failures_without_an_exception_journal_no_error_fields(queue: vr.Queue) -> None:
    unknown = await queue.enqueue(Echo(text="nobody handles echo here"))
    await drain(queue, DoomedJob)
    (death,) = [e for e in await queue.journal(unknown) if e.event == "dead"]
    assert death.details["reason"] == "unknown_kind"
    assert "error_type" not in death.details and "traceback" not in death.details
