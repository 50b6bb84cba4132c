"""Schedules (issue 27): the contract on every backend, with a driven clock.

Firing is driven by hand here (``fire_due``, what a worker's scheduler calls
on its wake-ups) so each fire time is chosen by the test; the worker's own
loop is tried at the end, and several processes in tests/test_schedules_procs.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import anyio
import pytest

import venturi_redis as vr
from tests.tasks import Echo, EchoJob
from venturi_redis._producer.firing import fire_due
from venturi_redis._store import calls_schedule

pytestmark = pytest.mark.anyio

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a whole minute


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Report(vr.Task):
    KIND: ClassVar[str] = "report"
    name: str = "daily"

    def dedup_key(self) -> str | None:
        return self.name


class Sync(vr.Task):
    KIND: ClassVar[str] = "sync"
    account: str

    def limit_key(self) -> str | None:
        return self.account


class ReportRefused(Report):
    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        raise RuntimeError("no merging today")


class ReportKept(Report):
    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.independent()


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    clock = Clock(T0)
    async with vr.Client.from_url(url, clock=clock) as c:
        yield c.queue(queue_name), clock


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def jobs_of(queue: vr.Queue) -> list[vr.JobInfo]:
    return sorted(await queue.list_jobs(state="pending", limit=1000), key=lambda j: j.fire_at or j.created_at)


async def test_schedule_is_stored_read_listed_and_removed(timed: tuple[vr.Queue, Clock]) -> None:
    queue, _ = timed
    info = await queue.schedule("tick", Echo(text="hi"), every=60)
    assert (info.id, info.kind, info.every, info.cron, info.tz) == ("tick", "every", 60.0, None, "UTC")
    assert info.next_at == at(T0 + 60_000)
    assert (info.last_at, info.last_job_id, info.paused, info.task_kind) == (None, None, False, "echo")
    nightly = await queue.schedule("nightly", Echo(text="n"), cron="@daily", tz="Europe/Berlin")
    assert nightly.kind == "cron" and nightly.cron == "@daily" and nightly.every is None
    # 2027-01-15 is winter in Berlin: midnight is 23:00 UTC the day before.
    assert nightly.next_at == datetime(2027, 1, 15, 23, 0, tzinfo=UTC)
    assert [s.id for s in await queue.schedules()] == ["nightly", "tick"]
    assert await queue.get_schedule("tick") == info
    # Declaring it again as it is changes nothing (a fleet's workers all do at start).
    assert await queue.schedule("tick", Echo(text="hi"), every=60) == info
    assert await queue.unschedule("tick") is True
    assert await queue.unschedule("tick") is False
    assert await queue.get_schedule("tick") is None
    assert [s.id for s in await queue.schedules()] == ["nightly"]


async def test_each_fire_time_gives_one_job_naming_its_schedule(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    await queue.schedule("tick", Echo(text="hi"), every=timedelta(seconds=10), priority="high")
    assert (await fire_due(queue)).fired == []  # not due yet
    clock.ms = T0 + 10_000
    round_ = await fire_due(queue)
    assert [(sid, f.status) for sid, f in round_.fired] == [("tick", "created")]
    assert round_.earliest == T0 + 20_000
    assert (await fire_due(queue)).fired == []  # fired: the next is in 10 s
    [job] = await jobs_of(queue)
    assert job.schedule_id == "tick" and job.fire_at == at(T0 + 10_000)
    assert job.priority == vr.Priority.HIGH and job.payload == {"text": "hi"}
    [entry] = await queue.journal(job.id)
    assert entry.event == "enqueued"
    assert entry.details["schedule"] == "tick" and entry.details["fire_at"] == str(T0 + 10_000)
    assert entry.details["fires"] == "1"
    info = await queue.get_schedule("tick")
    assert info is not None and info.last_job_id == job.id and info.fires == 1
    assert info.last_at == job.fire_at and info.next_at == at(T0 + 20_000)
    # A job not made by a schedule says so.
    plain = await queue.get(await queue.enqueue(Echo(text="x")))
    assert plain is not None and plain.schedule_id is None and plain.fire_at is None


class Seen(vr.Task):
    KIND: ClassVar[str] = "seen-history"


class SeenJob(Seen, vr.Handler[list[Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: list[Any]) -> vr.Outcome:
        state.extend(ctx.history)
        return vr.Outcome.completed()


async def test_a_scheduled_jobs_first_run_sees_the_fire_in_its_history(timed: tuple[vr.Queue, Clock]) -> None:
    """The fire writes the `enqueued` entry with the schedule and its fire time, and
    run_count '0' with it, so the claim reads that entry (not one rebuilt from the hash)."""
    queue, clock = timed
    await queue.schedule("tick", Seen(), every=timedelta(seconds=10))
    clock.ms = T0 + 10_000
    await fire_due(queue)
    seen: list[Any] = []
    worker = vr.Worker(queue, handle_signals=False, state=seen, check_eviction_policy=False)
    worker.register(SeenJob)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    [enqueued] = seen
    assert enqueued.event == "enqueued" and enqueued.details["schedule"] == "tick"
    assert enqueued.details["fire_at"] == str(T0 + 10_000)


async def test_workers_racing_on_one_fire_time_make_one_job(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    await queue.schedule("tick", Echo(text="hi"), every=1)
    for n in range(1, 6):
        clock.ms = T0 + n * 1000
        rounds = await asyncio.gather(*(fire_due(queue) for _ in range(4)))
        statuses = sorted(f.status for r in rounds for _, f in r.fired)
        assert statuses.count("created") == 1, statuses
        assert set(statuses) <= {"created", "refused"}
    jobs = await jobs_of(queue)
    assert [j.fire_at for j in jobs] == [at(T0 + n * 1000) for n in range(1, 6)]


async def test_a_stale_read_fires_nothing(timed: tuple[vr.Queue, Clock]) -> None:
    """Compare-and-advance: a worker that read the schedule before another fired it, or
    before it was changed, writes nothing; the same fire time cannot make a second job."""
    queue, clock = timed
    info = await queue.schedule("tick", Echo(text="hi"), every=1)
    assert info.next_at is not None
    clock.ms = T0 + 1000
    raw = await queue.client.redis.hgetall(queue.keys.schedule("tick"))
    await fire_due(queue)
    call = calls_schedule.schedule_fire(
        queue.keys,
        queue.client._now_arg(),
        schedule_id="tick",
        job_id="01STALEREADJOB000000000000",
        version=raw[b"version"].decode(),
        fire_at=T0 + 1000,
        next_at=T0 + 2000,
    )
    reply = calls_schedule.fired(await queue.client.sender.call(call))
    assert reply == calls_schedule.Fired("refused", "fire time already fired")
    await queue.schedule("tick", Echo(text="changed"), every=1)  # a new task, same timing: version moves
    clock.ms = T0 + 2000
    call = call._replace(args=[*call.args[:5], str(T0 + 2000), str(T0 + 3000), *call.args[7:]])
    reply = calls_schedule.fired(await queue.client.sender.call(call))
    assert reply == calls_schedule.Fired("refused", "schedule changed since it was read")
    assert len(await jobs_of(queue)) == 1
    assert [f.status for _, f in (await fire_due(queue)).fired] == ["created"]
    assert [j.payload for j in await jobs_of(queue)] == [{"text": "hi"}, {"text": "changed"}]


async def test_downtime_gives_one_job_for_the_missed_fire_times(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    await queue.schedule("tick", Echo(text="hi"), every=60)
    await queue.schedule("hourly", Echo(text="h"), cron="@hourly")
    clock.ms = T0 + 5 * 3_600_000 + 30_000  # five and a half hours with no worker
    fired = dict((await fire_due(queue)).fired)
    assert {k: v.status for k, v in fired.items()} == {"tick": "created", "hourly": "created"}
    by_schedule = {j.schedule_id: j for j in await jobs_of(queue)}
    assert len(by_schedule) == 2
    tick = by_schedule["tick"]
    assert tick.fire_at == at(T0 + 60_000)  # the first it stands for
    assert (await queue.journal(tick.id))[0].details["fires"] == str(5 * 60 + 0)
    hourly = by_schedule["hourly"]
    assert (await queue.journal(hourly.id))[0].details["fires"] == "5"
    # Then on from the next fire time after now, no more catching up.
    info = await queue.get_schedule("tick")
    assert info is not None and info.next_at == at(T0 + 5 * 3_600_000 + 60_000)
    assert (await fire_due(queue)).fired == []


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).strftime("%m-%d %H:%M %Z")


@pytest.mark.parametrize(
    ("tz", "cron", "start", "expected"),
    [
        # Spring forward: 02:30 does not exist on the night the clock jumps 02:00 -> 03:00.
        (
            "Europe/Berlin",
            "30 2 * * *",
            datetime(2027, 3, 27, 12, tzinfo=UTC),
            ["03-28 03:00 CEST", "03-29 02:30 CEST", "03-30 02:30 CEST"],
        ),
        # Fall back: 02:30 happens twice on the night the clock goes 03:00 -> 02:00; it fires once.
        (
            "Europe/Berlin",
            "30 2 * * *",
            datetime(2027, 10, 30, 12, tzinfo=UTC),
            ["10-31 02:30 CEST", "11-01 02:30 CET", "11-02 02:30 CET"],
        ),
        # An expression naming every hour fires on each real hour, the repeated one too.
        (
            "Europe/Berlin",
            "0 * * * *",
            datetime(2027, 10, 30, 22, 30, tzinfo=UTC),
            ["10-31 01:00 CEST", "10-31 02:00 CEST", "10-31 02:00 CET", "10-31 03:00 CET"],
        ),
        (
            "America/New_York",
            "30 2 * * *",
            datetime(2027, 3, 13, 12, tzinfo=UTC),
            ["03-14 03:00 EDT", "03-15 02:30 EDT"],
        ),
        (
            "America/New_York",
            "30 1 * * *",
            datetime(2027, 11, 6, 12, tzinfo=UTC),
            ["11-07 01:30 EDT", "11-08 01:30 EST"],
        ),
    ],
)
async def test_daylight_saving_changes_fire_once(
    url: str, queue_name: str, tz: str, cron: str, start: datetime, expected: list[str]
) -> None:
    clock = Clock(int(start.timestamp() * 1000))
    async with vr.Client.from_url(url, clock=clock) as c:
        queue = c.queue(queue_name)
        await queue.schedule("dst", Echo(text="d"), cron=cron, tz=tz)
        fired: list[int] = []
        end = clock.ms + len(expected) * 86_400_000
        while len(fired) < len(expected) and clock.ms < end:
            info = await queue.get_schedule("dst")
            assert info is not None and info.next_at is not None
            # Step to one minute past each fire time: every fire is on time, none caught up.
            clock.ms = int(info.next_at.timestamp() * 1000) + 60_000
            for _, f in (await fire_due(queue)).fired:
                assert f.status == "created"
                job = await queue.get(f.id)
                assert job is not None and job.fire_at is not None
                assert (await queue.journal(f.id))[0].details["fires"] == "1"
                fired.append(int(job.fire_at.timestamp() * 1000))
        assert [_local(ms, tz) for ms in fired] == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "does not parse"),
        ({"cron": "every day"}, "5 fields"),
        ({"cron": "@fortnightly"}, "unknown cron alias"),
        ({}, "exactly one of cron= and every="),
        ({"cron": "* * * * *", "every": 5}, "exactly one of cron= and every="),
        ({"every": 0}, "every must be positive"),
        ({"every": -3}, "every must be"),
        ({"every": True}, "every must be seconds"),
        ({"every": 5, "tz": "Europe/Atlantis"}, "unknown time zone"),
        (
            {
                "every": 5,
                "start_at": datetime(2027, 2, 1, tzinfo=UTC),
                "end_at": datetime(2027, 1, 1, tzinfo=UTC),
            },
            "end_at .* is before start_at",
        ),
        ({"every": 5, "start_at": datetime(2027, 2, 1)}, "timezone-aware"),
        ({"every": 5, "end_at": datetime(2020, 1, 1, tzinfo=UTC)}, "never fires"),
        ({"every": 5, "priority": "urgent"}, "urgent"),
    ],
)
async def test_bad_input_is_refused_with_nothing_written(
    timed: tuple[vr.Queue, Clock], kwargs: dict[str, Any], message: str
) -> None:
    queue, _ = timed
    with pytest.raises(vr.ConfigurationError, match=message):
        await queue.schedule("bad", Echo(text="x"), **kwargs)
    with pytest.raises(vr.ConfigurationError, match="invalid schedule id"):
        await queue.schedule("no spaces", Echo(text="x"), every=5)
    with pytest.raises(vr.ConfigurationError, match="exactly one"):
        vr.Schedule("declared", Echo(text="x"))
    assert await queue.schedules() == []
    assert await queue.client.redis.exists(queue.keys.schedules, queue.keys.schedule("bad")) == 0


async def test_pause_resume_and_trigger(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    await queue.schedule("tick", Echo(text="hi"), every=10)
    assert await queue.pause_schedule("tick") is True
    info = await queue.get_schedule("tick")
    assert info is not None and info.paused and info.next_at is None
    clock.ms = T0 + 45_000
    assert (await fire_due(queue)).fired == []  # paused: nothing fires, nothing is caught up later
    # Re-declaring a paused schedule does not resume it (an operator paused it).
    await queue.schedule("tick", Echo(text="hi"), every=10)
    assert (await queue.get_schedule("tick")).paused  # type: ignore[union-attr]
    job_id = await queue.trigger_schedule("tick")  # an extra job now, paused or not
    assert job_id is not None
    job = await queue.get(job_id)
    assert job is not None and job.schedule_id == "tick" and job.fire_at == at(clock.ms)
    assert await queue.resume_schedule("tick") is True
    info = await queue.get_schedule("tick")
    assert info is not None and not info.paused
    assert info.next_at == at(T0 + 50_000)
    clock.ms = T0 + 50_000
    assert [f.status for _, f in (await fire_due(queue)).fired] == ["created"]
    assert len(await jobs_of(queue)) == 2
    for missing in (queue.pause_schedule, queue.resume_schedule):
        assert await missing("nope") is False
    assert await queue.trigger_schedule("nope") is None


async def test_a_dedup_key_lets_the_merge_decide(timed: tuple[vr.Queue, Clock]) -> None:
    """A fire whose task's dedup key a pending job holds makes no second job; the
    task's merge decides, as for any enqueue (here: the default, replace)."""
    queue, clock = timed
    await queue.schedule("report", Report(), every=10)
    clock.ms = T0 + 10_000
    [(_, first)] = (await fire_due(queue)).fired
    clock.ms = T0 + 20_000
    [(_, second)] = (await fire_due(queue, tasks={"report": Report})).fired
    assert (first.status, second.status) == ("created", "merged") and second.id == first.id
    [job] = await jobs_of(queue)
    assert [e.event for e in await queue.journal(job.id)] == ["enqueued", "merged"]
    info = await queue.get_schedule("report")
    assert info is not None and info.last_job_id == first.id and info.fires == 2
    # A merge that says independent makes its own job.
    await queue.schedule("kept", ReportKept(name="other"), every=10)
    clock.ms = T0 + 40_000
    await fire_due(queue, tasks={"report": ReportKept})
    clock.ms = T0 + 50_000
    await fire_due(queue, tasks={"report": ReportKept})
    assert len([j for j in await jobs_of(queue) if j.payload == {"name": "other"}]) == 2


async def test_a_worker_declares_and_fires_its_schedules(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    declared = vr.Schedule("fast", Echo(text="tick"), every=0.2, queue=queue_name)
    worker = vr.Worker(queue, schedules=[declared], lease=1.0, handle_signals=False, poll_interval=0.2)
    worker.register(EchoJob)
    with pytest.raises(vr.ConfigurationError, match="names queue"):
        vr.Worker(queue, schedules=[vr.Schedule("x", Echo(text="x"), every=1, queue="elsewhere")])

    async def stop_after_jobs() -> None:
        while len(await queue.list_jobs(state="completed", limit=100)) < 3:
            await asyncio.sleep(0.05)
        worker.shutdown()

    async with asyncio.timeout(20):
        await asyncio.gather(worker.run(), stop_after_jobs())
    info = await queue.get_schedule("fast")
    assert info is not None and info.fires >= 3
    done = await queue.list_jobs(state="completed", limit=100)
    assert {j.schedule_id for j in done} == {"fast"}
    assert len({j.fire_at for j in done}) == len(done)


def test_the_blocking_client_schedules_too(redis_server: Any, queue_name: str) -> None:
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(queue_name)
        info = q.schedule("sync", Echo(text="s"), cron="*/5 * * * *", tz="America/New_York")
        assert info.kind == "cron" and q.get_schedule("sync") == info
        assert [s.id for s in q.schedules()] == ["sync"]
        assert q.pause_schedule("sync") and q.resume_schedule("sync")
        job_id = q.trigger_schedule("sync")
        assert job_id is not None and (job := q.get(job_id)) is not None and job.schedule_id == "sync"
        assert q.unschedule("sync") and q.get_schedule("sync") is None


async def test_an_idle_worker_fires_a_schedule_created_while_it_waits(
    client: vr.Client, queue_name: str
) -> None:
    """The producer's token on the schedules wake list cuts the idle worker's wait short: with
    the default lease its periodic look is a minute away, and the schedule fires within a second."""
    queue = client.queue(queue_name)
    worker = vr.Worker(queue, handle_signals=False).register(EchoJob)
    assert worker._schedulers[0].peek_interval == 60.0

    async def create_then_wait() -> None:
        await asyncio.sleep(0.5)  # the worker is idle, blocked on its wake lists
        await queue.schedule("late", Echo(text="late"), every=0.3)
        while not await queue.list_jobs(state="completed"):
            await asyncio.sleep(0.05)
        worker.shutdown()

    async with asyncio.timeout(10):
        await asyncio.gather(worker.run(), create_then_wait())
    [job] = [j for j in await queue.list_jobs(state="completed", limit=100)][-1:]
    assert job.schedule_id == "late"


async def test_a_worker_whose_clock_is_off_never_fires_early(client: vr.Client, queue_name: str) -> None:
    """The scripts decide what is due by Redis's clock; a worker's own clock only says when
    to look. One that believes it is an hour later looks too early and fires nothing."""
    from venturi_redis._worker.scheduler import Scheduler

    queue = client.queue(queue_name)
    await queue.schedule("hourly", Echo(text="h"), every=3600)
    scheduler = Scheduler(queue, dict, peek_interval=60.0)
    await scheduler.fire_round()  # reads the clock
    assert scheduler._clock is not None
    at_ms, at_mono = scheduler._clock
    scheduler._clock = (at_ms + 3_600_000, at_mono)  # its idea of the server's clock: an hour ahead
    assert (await scheduler.peek() or 0) < time.monotonic() + 1  # so it thinks the fire is due now
    await scheduler.fire_round()
    assert await queue.list_jobs() == []
    info = await queue.get_schedule("hourly")
    assert info is not None and info.fires == 0 and info.last_at is None


async def test_a_scheduled_job_carries_its_tasks_limit_key(timed: tuple[vr.Queue, Clock]) -> None:
    """Flow control's per-key limits count scheduled jobs as enqueued ones (docs/flow-control.md)."""
    queue, clock = timed
    await queue.schedule("sync-a", Sync(account="a"), every=10)
    enqueued = await queue.enqueue(Sync(account="a"))
    clock.ms = T0 + 10_000
    [(_, fired)] = (await fire_due(queue)).fired
    redis = queue.client.redis
    field = await redis.hget(queue.keys.job(fired.id), "limit_key")
    assert field is not None and field == await redis.hget(queue.keys.job(enqueued), "limit_key")


async def test_a_failing_fire_round_is_logged_and_retried(
    timed: tuple[vr.Queue, Clock], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a fire round raises, the scheduler logs it and tries again: it never takes the
    worker (and its jobs) down with it."""
    from venturi_redis._worker import scheduler as sched_mod

    queue, clock = timed
    await queue.schedule("tick", Echo(text="hi"), every=10)
    clock.ms = T0 + 10_000
    real, calls = sched_mod.fire_due, []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a bug")
        return await real(*args, **kwargs)

    monkeypatch.setattr(sched_mod, "fire_due", flaky)
    scheduler = sched_mod.Scheduler(queue, dict, peek_interval=60.0)
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(scheduler.run)
            while not await jobs_of(queue):
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert len(calls) >= 2 and "firing schedules failed (ValueError('a bug'))" in caplog.text
    assert [j.schedule_id for j in await jobs_of(queue)] == ["tick"]


async def test_a_merge_that_raises_is_logged_and_the_fire_stands(
    timed: tuple[vr.Queue, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    queue, clock = timed
    await queue.schedule("refused", ReportRefused(name="r"), every=10)
    clock.ms = T0 + 10_000
    await fire_due(queue, tasks={"report": ReportRefused})
    clock.ms = T0 + 20_000
    [(_, fired)] = (await fire_due(queue, tasks={"report": ReportRefused})).fired
    assert fired.status == "merged" and "no merging today" in caplog.text
    info = await queue.get_schedule("refused")
    assert info is not None and info.fires == 2 and info.next_at == at(T0 + 30_000)
    assert len(await jobs_of(queue)) == 1
