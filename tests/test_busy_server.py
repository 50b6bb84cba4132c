"""A server busy running a script: what a worker's run sends meanwhile is sent again.

Past ``busy-reply-threshold`` (5 s by default), a Redis running a script
answers every other command ``BUSY`` without running it. A run that ends
then has its ending refused that way; written once the script is done, it
stands, instead of the job being left running until its lease runs out and
run again.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import venturi_redis as vr
from tests.helpers import events, make_worker
from tests.servers import RedisServer, server_version

pytestmark = pytest.mark.anyio

# A script that holds the server for ARGV[1] microseconds (by its clock).
SPIN = """
local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > tonumber(ARGV[1]) then return 1 end
end
"""


class Busy(vr.Task):
    KIND: ClassVar[str] = "busy.spin"
    ending: str


class BusyJob(Busy, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        """On its first run, end while another client's script holds the server."""
        if ctx.run_count == 1:
            state["group"].start_soon(state["other"].eval, SPIN, 0, 800_000)
            await anyio.sleep(0.2)  # the script runs, past the threshold
            if self.ending == "failed":
                raise RuntimeError("a failed run, written while the server is busy")
        return vr.Outcome.completed()


async def state_of(q: vr.Queue, job_id: str) -> vr.JobState | None:
    """The job's state; None while the server answers BUSY (the test's reads meet it too)."""
    try:
        info = await q.get(job_id)
    except ResponseError:
        return None
    return None if info is None else info.state


@pytest.mark.parametrize("ending", ["completed", "failed"])
async def test_an_ending_refused_busy_is_written_once_the_script_is_done(ending: str) -> None:
    # busy-reply-threshold since Redis 7.0, where lua-time-limit is its alias; 6.2 has only that.
    threshold = "--busy-reply-threshold" if server_version() >= (7, 0) else "--lua-time-limit"
    with RedisServer(threshold, "20") as server:
        other = aioredis.Redis.from_url(server.url)
        async with vr.Client.from_url(server.url) as client:
            q = client.queue("busy")
            job_id = await q.enqueue(Busy(ending=ending))
            async with anyio.create_task_group() as group:
                state = {"group": group, "other": other}
                worker = make_worker(q, BusyJob, state=state, lease=60)
                group.start_soon(worker.run)
                # A bound against a job left to its lease (60 s), not a timing.
                with anyio.move_on_after(20):
                    while await state_of(q, job_id) != vr.JobState.COMPLETED:
                        await anyio.sleep(0.05)
                worker.shutdown()
            info = await q.get(job_id)
            journal = await events(q, job_id)
        await other.aclose()
    assert info is not None and info.state == vr.JobState.COMPLETED, info
    expected = ["enqueued", "claimed", "completed"]
    if ending == "failed":
        expected = ["enqueued", "claimed", "failed", "claimed", "completed"]
    assert journal == expected, journal
