"""Flow control's keys edited by hand never strand a job, nor fail a read (issue 38).

The limits live in three hashes and sets of the queue (docs/flow-control.md).
A number in them that the scripts cannot count with (a running count `abc`,
a ring slot `abc`, a cap `1e400`) is read as the claim reads it and written
whole again; before, every claim of the kind moved its job to running and
then failed at `HINCRBY`, so the job waited for its lease to expire, and
again. A key of the wrong type stops `set_limit` / `clear_limit` before
their first write (`vr.CorruptQueueError`), and `queue.limits()` names it.
"""

from __future__ import annotations

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio

JOBS = 6


async def limited(queue: vr.Queue) -> None:
    await queue.set_limit("echo", concurrency=2, rate=vr.Rate(100, 1))
    await queue.set_limit("echo", concurrency=1, per_key=True)
    for i in range(JOBS):
        await queue.enqueue(Echo(text=str(i)))


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [
        ("limits_state", "echo", "abc"),  # the kind's running count
        ("limits_state", "echo", "0.5"),
        ("limits_state", "echo\t#100p", "abc"),  # the rate ring's next slot
        ("limits_state", "echo\t#100p", "100"),  # a slot past the ring
        ("limits", "echo", "1e400 1e400 1e400 0 0 0"),
        ("limits", "echo", "abc def ghi"),
        ("limits", "echo", "-5 -1 -1 0 0 0"),
    ],
)
async def test_a_number_no_script_can_count_with_strands_no_job(
    queue: vr.Queue, key: str, field: str, value: str
) -> None:
    await limited(queue)
    await queue.client.redis.hset(getattr(queue.keys, key), field, value)
    await drain(queue, EchoJob, timeout=20)
    stats = await queue.stats()
    assert (stats.completed, stats.running, stats.limited) == (JOBS, 0, 0)
    rows = await queue.limits()  # read as the claim reads it, never raises
    assert [r.running for r in rows] == [0] * len(rows)


async def test_limits_reads_a_cap_as_the_claim_does(queue: vr.Queue) -> None:
    """`abc` and `-1` are no cap, and a rate over a window of 0 ms never holds a run back."""
    await queue.client.redis.hset(queue.keys.limits, "echo", "abc 5 -1 2 0 0")
    rows = await queue.limits()
    assert [(r.per_key, r.concurrency, r.rate) for r in rows] == [(True, 2, None)]


@pytest.mark.parametrize("which", ["limits", "limits_state", "limits_parked", "limits_ready", "meta", "wake"])
async def test_set_and_clear_stop_at_a_wrong_type_key_before_any_write(queue: vr.Queue, which: str) -> None:
    await queue.set_limit("echo", concurrency=2)
    redis = queue.client.redis
    key = getattr(queue.keys, which)
    await redis.delete(key)
    await redis.set(key, "x")
    before = None if which == "limits" else await redis.hgetall(queue.keys.limits)
    for change in (
        queue.set_limit("echo", concurrency=5),
        queue.clear_limit("echo"),
    ):
        with pytest.raises(vr.CorruptQueueError, match=f"{key} is not a"):
            await change
    if before is not None:
        assert await redis.hgetall(queue.keys.limits) == before


@pytest.mark.parametrize("which", ["limits", "limits_state", "limits_parked", "limits_ready"])
async def test_limits_names_a_wrong_type_key(queue: vr.Queue, which: str) -> None:
    await queue.set_limit("echo", concurrency=2, per_key=True)
    await queue.enqueue(Echo(text="x"))
    redis = queue.client.redis
    key = getattr(queue.keys, which)
    await redis.delete(key)
    await redis.set(key, "x")
    with pytest.raises(vr.CorruptQueueError, match=f"{key} is not a"):
        await queue.limits()
