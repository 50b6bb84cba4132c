"""``vr.Worker(...)`` checks every argument where it is given (issue 26, item 7).

Before, ``reclaim_interval=-1`` and ``poll_interval=float("nan")`` were
accepted and crashed ``run()``; ``max_failures=True`` was a backstop of one.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import venturi_redis as vr
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio

NAN, INF = float("nan"), math.inf


@pytest.fixture
async def queue() -> AsyncIterator[vr.Queue]:
    client = vr.Client.from_url("memory://worker-options")
    try:
        yield client.queue("options")
    finally:
        await client.aclose()


BAD: list[tuple[str, Any]] = [
    ("concurrency", 0),
    ("concurrency", -3),
    ("concurrency", 2.5),
    ("concurrency", True),
    ("concurrency", "8"),
    ("lease", 0),
    ("lease", -1),
    ("lease", NAN),
    ("lease", INF),
    ("lease", True),
    ("lease", "30"),
    ("lease", 1e-6),  # rounds to a lease of 0 ms
    ("lease", 1e16),  # over 100 years: Redis would wrap now + lease
    ("max_failures", 0),
    ("max_failures", True),
    ("max_failures", 2.0),
    ("max_failures", "25"),
    ("backoff", 5),
    ("jitter", -0.1),
    ("jitter", 1.5),
    ("jitter", NAN),
    ("jitter", True),
    ("batch_size", 0),
    ("batch_size", True),
    ("batch_size", 1.5),
    ("poll_interval", NAN),
    ("poll_interval", INF),
    ("poll_interval", 0),
    ("poll_interval", -1),
    ("poll_interval", 1e16),
    ("poll_interval", False),
    ("reclaim_interval", -1),
    ("reclaim_interval", 0),
    ("reclaim_interval", NAN),
    ("reclaim_interval", INF),
    ("reclaim_interval", True),
    ("shutdown_grace", -1),
    ("shutdown_grace", NAN),
    ("shutdown_grace", INF),
    ("shutdown_grace", True),
    ("shutdown_grace", 1e10),
    ("handle_signals", "no"),
    ("handle_signals", 0),
    ("name", ""),
    ("name", "has space"),
    ("name", "line\nbreak"),
    ("name", "x" * 201),
    ("name", 42),
    ("retention", 3600),
    ("check_eviction_policy", "false"),
    ("observer", object()),
    ("freeze_gc", 1),
    ("gc_threshold", 0),
    ("gc_threshold", True),
    ("gc_threshold", 5e3),
    ("blocked_loop_warning", 0),
    ("blocked_loop_warning", NAN),
    ("blocked_loop_warning", True),
    ("blocked_loop_warning", INF),
    ("blocked_loop_warning", "1"),
    ("max_runs", 0),
    ("max_runs", 2.5),
    ("max_memory_mib", -1),
    ("max_memory_mib", True),
    ("startup_wait", -1),
    ("startup_wait", NAN),
    ("startup_wait", INF),
    ("startup_wait", True),
]


@pytest.mark.parametrize(("arg", "value"), BAD, ids=[f"{a}={v!r}"[:40] for a, v in BAD])
async def test_a_bad_argument_is_refused_where_it_is_given(queue: vr.Queue, arg: str, value: Any) -> None:
    with pytest.raises(vr.ConfigurationError) as caught:
        vr.Worker(queue, **{arg: value})
    message = str(caught.value)
    assert message.startswith(arg), message
    assert repr(value)[:30] in message


async def test_a_client_that_is_not_one_is_refused(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match=r"client must be a vr\.Client"):
        vr.Worker("reports", client="redis://localhost")  # type: ignore[arg-type]


async def test_shutdown_grace_is_checked_when_given_to_shutdown(queue: vr.Queue) -> None:
    worker = vr.Worker(queue)
    with pytest.raises(vr.ConfigurationError, match="grace"):
        worker.shutdown(grace=NAN)
    assert worker.shutdown_grace == 10.0


async def test_good_arguments_are_kept(queue: vr.Queue) -> None:
    w = vr.Worker(
        queue,
        concurrency=3,
        lease=2,
        max_failures=None,
        jitter=0,
        batch_size=2,
        poll_interval=0.5,
        reclaim_interval=None,
        shutdown_grace=0,
        name="pod-7:worker",
        retention=None,
        gc_threshold=None,
    )
    assert (w.concurrency, w.lease, w.lease_ms, w.max_failures, w.jitter, w.batch_size) == (
        3,
        2.0,
        2000,
        None,
        0.0,
        2,
    )
    assert (w.poll_interval, w.reclaim_interval, w.shutdown_grace, w.id) == (0.5, 1.0, 0, "pod-7:worker")


async def test_a_worker_with_checked_intervals_runs(queue: vr.Queue) -> None:
    """The repro's values, corrected, run: the checks refuse nothing a worker can use."""
    job_id = await queue.enqueue(Echo(text="ok"))
    worker = vr.Worker(queue, poll_interval=0.05, reclaim_interval=0.05, handle_signals=False).register(
        EchoJob
    )
    with anyio.fail_after(10):
        await worker.run(until_idle=True)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED
