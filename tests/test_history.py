"""The metrics history (issue 41): per queue, KIND and minute (and hour), the jobs
enqueued, completed, failed runs, dead and the completed runs' time, counted by the
transition scripts themselves (lua/include/history.lua), and ``queue.history``'s
steps. A damaged history key never fails a transition.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain, expires_at
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob
from venturi_redis._store import calls_obs
from venturi_redis._store.calls_ending import completion
from venturi_redis.testing import Clock

pytestmark = pytest.mark.anyio

LUA = Path(vr.__file__).resolve().parent.parent / "lua"
# A minute's start (epoch ms): the clocked tests start there.
T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def _sum(points: list[vr.HistoryPoint]) -> tuple[int, int, int, int]:
    return (
        sum(p.enqueued for p in points),
        sum(p.completed for p in points),
        sum(p.failed for p in points),
        sum(p.dead for p in points),
    )


@pytest.fixture
async def clocked(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url, clock=Clock(T0))
    try:
        yield c
    finally:
        await c.aclose()


def _clock(client: vr.Client) -> Clock:
    assert isinstance(client.clock, Clock)
    return client.clock


def test_the_switch_is_read_the_same_in_lua_and_python() -> None:
    """Only '1' turns it on, in every script that counts: absent is off (HISTORY_DEFAULT)."""
    assert calls_obs.HISTORY_DEFAULT == "0"
    opens: set[str] = set()
    for path in LUA.glob("*.lua"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*history_counts = ", line):
                assert line.rstrip().endswith("== '1' and {} or nil"), (path.name, line)
                opens.add(path.stem)
    assert opens == {
        "claim", "complete", "dead", "enqueue", "enqueue_flow", "reclaim", "retry", "schedule_fire"
    }  # fmt: skip


async def test_off_by_default_writes_nothing(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.enqueue(Echo(text="x"))
    await drain(queue, EchoJob)
    minute = _ms(T0) // 1000
    assert await clocked.redis.exists(queue.keys.history_minute(minute), queue.keys.history_hour(minute)) == 0
    assert _sum(await queue.history()) == (0, 0, 0, 0)


async def test_counts_every_transition_per_kind(queue: vr.Queue) -> None:
    await queue.set_history(True)
    await queue.enqueue_many([Echo(text="a"), Echo(text="b")])
    await queue.enqueue(Flaky(fail_times=1))
    await queue.enqueue(Doomed())
    await drain(queue, EchoJob, FlakyJob, DoomedJob)
    points = await queue.history(since=timedelta(minutes=5))
    assert len(points) == 5 and all(p.at.second == 0 and p.at.tzinfo is UTC for p in points)
    assert _sum(points) == (4, 3, 2, 1)  # the flaky job's failed run; the doomed one's, and its death
    echo = await queue.history(since=timedelta(minutes=5), kind="echo")
    assert _sum(echo) == (2, 2, 0, 0)
    done = [p for p in echo if p.completed]
    assert done and all(p.run_ms_mean is not None and p.run_ms_mean >= 0 for p in done)
    assert _sum(await queue.history(since=timedelta(minutes=5), kind="flaky")) == (1, 1, 1, 0)
    assert _sum(await queue.history(since=timedelta(minutes=5), kind="doomed")) == (1, 0, 1, 1)
    assert _sum(await queue.history(since=timedelta(minutes=5), kind="nope")) == (0, 0, 0, 0)
    assert all(p.run_ms_mean is None for p in await queue.history(kind="doomed"))
    # Switched off: nothing more is counted.
    await queue.set_history(False)
    await queue.enqueue(Echo(text="c"))
    assert _sum(await queue.history(since=timedelta(minutes=5)))[0] == 4


async def test_a_batch_is_counted_by_kind_once_per_call(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.set_history(True)
    await queue.enqueue_many([Echo(text=str(i)) for i in range(7)] + [Doomed(), Doomed()])
    minute = queue.keys.history_minute(_ms(T0) // 1000)
    assert await clocked.redis.hgetall(minute) == {b"echo\tenqueued": b"7", b"doomed\tenqueued": b"2"}
    # Expiry: 48 hours after the minute's end; the hour's 30 days after its end.
    lo, hi = await expires_at(clocked.redis, minute)
    assert lo <= _ms(T0) + 60_000 + 48 * 3_600_000 <= hi
    hour = queue.keys.history_hour(_ms(T0) // 1000)
    lo, hi = await expires_at(clocked.redis, hour)
    assert lo <= _ms(T0) + 3_600_000 + 30 * 86_400_000 <= hi
    # A batch of completions: the run time is each run's, from its claim to its completion.
    jobs = claimed_jobs(await claim_raw(queue, 3))
    _clock(clocked).advance(timedelta(seconds=1.5))
    await queue.store.send(queue.store.complete_op([completion(j, t, "", b"", b"", b"") for j, t in jobs]))
    [point] = await queue.history(since=timedelta(minutes=1), kind="echo")
    assert (point.at, point.enqueued, point.completed, point.run_ms_mean) == (T0, 7, 3, 1500.0)


async def test_minute_and_hour_steps(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    clock = _clock(clocked)
    await queue.set_history(True)
    await queue.enqueue(Echo(text="t0"))
    clock.advance(timedelta(minutes=7))
    await queue.enqueue_many([Echo(text="a"), Echo(text="b")])
    clock.advance(timedelta(hours=2))
    await queue.enqueue_many([Echo(text="c"), Echo(text="d"), Echo(text="e")])
    minutes = await queue.history(since=timedelta(hours=3))
    assert len(minutes) == 180 and minutes[-1].at == T0 + timedelta(hours=2, minutes=7)
    assert [(p.at, p.enqueued) for p in minutes if p.enqueued] == [
        (T0, 1),
        (T0 + timedelta(minutes=7), 2),
        (T0 + timedelta(hours=2, minutes=7), 3),
    ]
    fives = await queue.history(since=timedelta(hours=3), step=timedelta(minutes=5))
    assert len(fives) == 36 and fives[-1].at == T0 + timedelta(hours=2, minutes=5)
    assert [(p.at, p.enqueued) for p in fives if p.enqueued] == [
        (T0, 1),
        (T0 + timedelta(minutes=5), 2),
        (T0 + timedelta(hours=2, minutes=5), 3),
    ]
    hours = await queue.history(since=timedelta(hours=3), step=timedelta(hours=1))
    assert [(p.at, p.enqueued) for p in hours] == [
        (T0, 3),
        (T0 + timedelta(hours=1), 0),
        (T0 + timedelta(hours=2), 3),
    ]
    # Past 48 hours, by hours (the default step there): minutes are gone by then.
    clock.advance(timedelta(days=3))
    days = await queue.history(since=timedelta(days=4))
    assert len(days) == 96 and days[-1].at == T0 + timedelta(days=3, hours=2)
    assert [(p.at, p.enqueued) for p in days if p.enqueued] == [(T0, 3), (T0 + timedelta(hours=2), 3)]
    daily = await queue.history(since=timedelta(days=4), step=timedelta(days=1), kind="echo")
    assert sum(p.enqueued for p in daily) == 6 and len(daily) == 4


@pytest.mark.parametrize(
    ("since", "step"),
    [
        (timedelta(0), None),
        (timedelta(minutes=-5), None),
        (timedelta(days=31), None),
        (timedelta(hours=1), timedelta(seconds=90)),
        (timedelta(hours=1), timedelta(seconds=30)),
        (timedelta(hours=1), timedelta(0)),
        (timedelta(days=3), timedelta(minutes=30)),
        (3600, None),
        (timedelta(hours=1), 60),
    ],
)
async def test_bad_input_is_refused_before_any_read(queue: vr.Queue, since: Any, step: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="history"):
        await queue.history(since=since, step=step)


async def test_a_damaged_history_key_never_fails_a_transition(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.set_history(True)
    minute = queue.keys.history_minute(_ms(T0) // 1000)
    await clocked.redis.set(minute, "not a hash")  # an operator's mistake
    hour = queue.keys.history_hour(_ms(T0) // 1000)
    await clocked.redis.hset(hour, "echo\tenqueued", "x")  # a field that is no integer
    ok = await queue.enqueue(Echo(text="ok"))
    flaky = await queue.enqueue(Flaky(fail_times=1))
    doomed = await queue.enqueue(Doomed())
    await drain(queue, EchoJob, FlakyJob, DoomedJob)
    ended = ((ok, vr.JobState.COMPLETED), (flaky, vr.JobState.COMPLETED), (doomed, vr.JobState.DEAD))
    for job_id, state in ended:
        info = await queue.get(job_id)
        assert info is not None and info.state is state
    assert await clocked.redis.get(minute) == b"not a hash"
    # The hour still counts what it could; the damaged field stays as it was (read as 0).
    assert await clocked.redis.hget(hour, "echo\tenqueued") == b"x"
    assert await clocked.redis.hget(hour, "echo\tcompleted") == b"1"
    hours = await queue.history(since=timedelta(hours=1), step=timedelta(hours=1))
    assert _sum(hours) == (2, 2, 2, 1)
    assert _sum(await queue.history(since=timedelta(minutes=1))) == (0, 0, 0, 0)  # the minute unreadable
    assert _sum(await queue.history(since=timedelta(minutes=1), kind="echo")) == (0, 0, 0, 0)
    echo = await queue.history(since=timedelta(hours=1), step=timedelta(hours=1), kind="echo")
    assert _sum(echo) == (0, 1, 0, 0)  # "x" reads as 0


async def test_sharded_and_blocking_faces(url: str, queue_name: str) -> None:
    client = vr.Client.from_url(url, clock=Clock(T0))
    try:
        sharded = vr.ShardedQueue(client, queue_name, partitions=3)
        await sharded.set_history(True)
        await sharded.enqueue_many([Echo(text=str(i)) for i in range(6)])
        points = await sharded.history(since=timedelta(minutes=2))
        assert [(p.at, p.enqueued) for p in points] == [(T0 - timedelta(minutes=1), 0), (T0, 6)]
        assert sum(p.enqueued for p in await sharded.partitions[0].history()) < 6
    finally:
        await client.aclose()
    with vr.SyncClient(url, clock=Clock(T0)) as sc:
        q = sc.queue(queue_name + "-sync")
        q.set_history(True)
        q.enqueue(Echo(text="x"))
        assert _sum(q.history(kind="echo")) == (1, 0, 0, 0)
        with pytest.raises(vr.ConfigurationError):
            q.history(step=timedelta(seconds=1))


async def test_flows_schedules_leases_and_deadlines_are_counted(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    clock = _clock(clocked)
    await queue.set_history(True)
    await queue.enqueue_flow(Echo(text="parent"), [Echo(text="a"), Doomed()])  # enqueue_flow.lua
    await queue.schedule("tick", Echo(text="tick"), every=timedelta(hours=1))
    assert await queue.trigger_schedule("tick") is not None  # schedule_fire.lua
    late = await queue.enqueue(Flaky(fail_times=0), expires=timedelta(seconds=30))
    clock.advance(timedelta(seconds=40))
    await queue.store.reclaim(batch=100, max_failures="25")  # its deadline passed: dead (reclaim.lua)
    info = await queue.get(late)
    assert info is not None and info.state is vr.JobState.DEAD
    # A lease that runs out: a failed run (reclaim.lua); at the backstop, a death too.
    claimed = claimed_jobs(await claim_raw(queue, 10, lease_ms=1000))
    assert len(claimed) == 3  # the flow's two children, the trigger's job (the parent waits)
    clock.advance(timedelta(seconds=2))
    await queue.store.reclaim(batch=100, max_failures="1")
    # The parent goes dead with its first failed dependency (graph.lua), counted too.
    assert _sum(await queue.history(since=timedelta(minutes=2), kind="echo")) == (3, 0, 2, 3)
    assert _sum(await queue.history(since=timedelta(minutes=2), kind="doomed")) == (1, 0, 1, 1)
    assert _sum(await queue.history(since=timedelta(minutes=2), kind="flaky")) == (1, 0, 0, 1)


async def test_a_claim_that_finds_a_job_past_its_deadline_counts_its_death(
    clocked: vr.Client, queue_name: str
) -> None:
    queue = clocked.queue(queue_name)
    await queue.set_history(True)
    late = await queue.enqueue(Flaky(fail_times=0), expires=timedelta(seconds=30))
    _clock(clocked).advance(timedelta(seconds=40))
    assert claimed_jobs(await claim_raw(queue, 10)) == []  # claim.lua ends it, dead
    info = await queue.get(late)
    assert info is not None and info.state is vr.JobState.DEAD
    assert _sum(await queue.history(since=timedelta(minutes=1), kind="flaky")) == (1, 0, 0, 1)
