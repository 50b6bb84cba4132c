"""Scenario 2: a worker frozen past its lease comes back and is fenced out.

Worker w1 claims a job and is SIGSTOPped mid-run. Its lease expires, the job
is reclaimed, worker w2 runs and completes it. w1 is SIGCONTed: its lease
renewal is refused (it logs the lost lease and flags the run cancelled), then
its handler returns and its completion is refused and journaled. The job's
final state, result and carry are w2's.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import anyio
import pytest

import venturi_redis as vr
from tests.chaos.chaos_tasks import Stale, gate_key
from tests.chaos.conftest import Fleet, figures
from tests.servers import RedisServer
from venturi_redis._model.codec import unpack

pytestmark = pytest.mark.anyio


async def _until(what: str, check: Callable[[], object], timeout: float = 15.0) -> float:
    """Poll ``check`` (sync or async) until truthy; returns the seconds it took."""
    start = time.monotonic()
    while True:
        value = check()
        if hasattr(value, "__await__"):
            value = await value  # type: ignore[misc]
        if value:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        await anyio.sleep(0.02)


async def test_frozen_worker_is_fenced_out(
    redis_server: RedisServer, fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    client = vr.Client.from_url(redis_server.url)
    q = client.queue(queue_name)
    r = client.redis
    try:
        job = await q.enqueue(Stale())
        fleet = fleet_factory(redis_server.url, queue_name, lease=1.0, reclaim_interval=0.2)
        w1 = fleet.start()

        async def started_by_w1() -> bool:
            return await r.lrange(f"chaos:{queue_name}:started", 0, -1) == [f"{job} {w1}".encode()]

        await _until("w1 to start the job", started_by_w1)
        fleet.signal(w1, signal.SIGSTOP)
        frozen_at = time.monotonic()
        w2 = fleet.start()

        async def completed() -> bool:
            info = await q.get(job)
            return info is not None and info.state == vr.JobState.COMPLETED

        await _until("w2 to complete the job", completed)
        frozen_for = time.monotonic() - frozen_at
        fleet.signal(w1, signal.SIGCONT)
        await _until("w1 to notice its lost lease", lambda: f"lease on job {job}" in fleet.log(w1))
        await r.set(gate_key(queue_name), 1)  # let w1's handler return its (stale) outcome

        async def refused() -> bool:
            return any(e.event == "refused" for e in await q.journal(job))

        await _until("w1's completion to be refused", refused)

        info = await q.get(job)
        assert info is not None
        raw = await r.hmget(q.keys.job(job), "state", "lease_owner", "result", "carry")
        assert raw[0] == b"completed"
        assert raw[1] == w2.encode()
        assert unpack(raw[2]) == w2
        assert unpack(raw[3]) == {"owner": w2, "runs": [w2]}
        journal = await q.journal(job)
        events = [e.event for e in journal]
        assert events == ["enqueued", "claimed", "lease_expired", "claimed", "completed", "refused"]
        assert journal[1].details["worker"] == w1
        assert journal[3].details["worker"] == w2
        assert journal[-1].details["attempted"] == "complete"
        assert await q.is_drained()
        log = fleet.log(w1)
        assert "refused" in log
        figures(
            "stale-owner",
            jobs=1,
            faults=1,
            frozen_s=f"{frozen_for:.2f}",
            refused=events.count("refused"),
            final_owner=w2,
            lost=0,
            duplicates=events.count("claimed") - 1,
        )
    finally:
        await client.aclose()
