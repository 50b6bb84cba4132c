"""The dashboard in a real browser: headless Chromium (Debian's /usr/bin/chromium) driven by Playwright.

``venturi dashboard`` runs as a user starts it, against a redis-server of its
own holding a queue with jobs in every state (scripts/dashboard_screenshots.py
fills it). The browser opens the overview, follows the queue to its dead jobs
(their list under its heading, on the first screen), to a dead job, presses
retry and sees the job pending, sends the same retry as JSON and gets 409 with
the reason, and sees that retry arrive in the live
event feed of the queue page open in a second tab, taking a screenshot at each step; a
script error or a Content-Security-Policy violation in the page fails the test.
No browser is downloaded: .ci/run installs Debian's chromium when missing, and
this test fails (it is not skipped) when it is not there.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

import venturi_redis as vr
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "dashboard_screenshots", ROOT / "scripts/dashboard_screenshots.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_overview_to_dead_job_retry_in_chromium(own_redis: RedisServer, tmp_path: Path) -> None:
    shots = _script()
    if not os.path.exists(shots.CHROMIUM):
        pytest.fail(f"{shots.CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    ids = anyio.run(shots.populate, own_redis.url)
    with shots.dashboard(own_redis.url) as base:
        paths = shots.walk(base, tmp_path, ids["dead"])
    assert [p.name for p in paths] == [
        "dashboard-overview.png",
        "dashboard-queue-dead.png",
        "dashboard-job-dead.png",
        "dashboard-job-retried.png",
        "dashboard-queue-live.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5_000

    async def state() -> vr.JobState | None:
        async with vr.Client.from_url(own_redis.url) as client:
            info = await client.queue(shots.QUEUE).get(ids["dead"])
            return info.state if info else None

    assert anyio.run(state) == vr.JobState.PENDING
