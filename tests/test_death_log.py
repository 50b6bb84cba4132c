"""A death is never silent (issue 33 item 3): one WARNING line with the job id, kind, reason and note."""

from __future__ import annotations

import logging

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo, Flaky, FlakyJob

pytestmark = pytest.mark.anyio


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
    # A retried failure is not a death: it stays at INFO.
    failed = [r for r in caplog.records if "failed: boom 1" in r.getMessage()]
    assert failed and all(r.levelno == logging.INFO for r in failed)
