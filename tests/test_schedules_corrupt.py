"""One corrupt schedule never stops the others (issue 38, item 2).

A schedule whose own data was damaged by hand (`redis-cli HSET ... fires x`,
a key of the wrong type, an interval of -5 ms) is paused with a note saying
what is wrong, before anything is written for it; the other schedules of its
queue keep firing; `queue.schedules()`, `venturi schedules` and the
dashboard show it marked and never fail. A queue-wide key of the wrong type
stops the script before its first write (`vr.CorruptQueueError`). On every
backend, fired by hand with a driven clock as in tests/test_schedules.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import keys_matching, make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis._model.ids import derived_job_id
from venturi_redis._producer.firing import fire_due

pytestmark = pytest.mark.anyio

T0 = 1_800_000_000_000
STEP = 10_000  # both schedules fire every 10 s


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    clock = Clock(T0)
    async with vr.Client.from_url(url, clock=clock) as c:
        yield c.queue(queue_name), clock


async def two_schedules(queue: vr.Queue) -> None:
    """`bad` sorts first, so it is first in line whenever both are due."""
    await queue.schedule("bad", Echo(text="bad"), every=STEP / 1000)
    await queue.schedule("good", Echo(text="good"), every=STEP / 1000)


async def fire_rounds(queue: vr.Queue, clock: Clock, rounds: int = 8) -> None:
    for _ in range(rounds):
        clock.ms += STEP
        await fire_due(queue)


async def made_by(queue: vr.Queue, schedule_id: str) -> int:
    jobs = await queue.list_jobs(state="pending", limit=1000)
    return len([j for j in jobs if j.schedule_id == schedule_id])


async def due_ids(queue: vr.Queue) -> list[str]:
    return [x.decode() for x in await queue.client.redis.zrange(queue.keys.schedules_due, 0, -1)]


# Each: what an operator's redis-cli did to `bad`, and what its note says.
FIELD_DAMAGE: list[tuple[dict[str, str], list[str], str]] = [
    ({"fires": "x"}, [], 'fires field "x" is not a count'),
    ({"fires": "99999999999999999999"}, [], "fires field"),
    ({"version": "v1", "every_ms": "abc"}, [], 'every_ms field "abc" is not a positive whole number'),
    ({"every_ms": "-5"}, [], 'every_ms field "-5" is not a positive whole number'),
    ({"every_ms": "0"}, [], "every_ms field"),
    ({"every_ms": "", "cron": ""}, [], "neither a cron nor an every_ms field"),
    ({"every_ms": "", "cron": "61 * * * *"}, [], 'cron field "61 * * * *" does not parse'),
    ({"tz": "Europe/Atlantis"}, [], 'tz field "Europe/Atlantis"'),
    ({"tz": "localtime"}, [], 'tz field "localtime"'),
    ({"next_at": "soon"}, [], 'next_at field "soon" is not a time in ms'),
    ({"anchor": "x"}, [], 'anchor field "x" is not a time in ms'),
    ({"start_at": "yesterday"}, [], "start_at field"),
    ({"end_at": "99999999999999999999"}, [], "end_at field"),
    ({"paused": "maybe"}, [], 'paused field "maybe" is not 0 or 1'),
    ({"priority": "urgent"}, [], 'priority field "urgent" is not one of'),
    ({"kind": ""}, [], "kind field is missing"),
    ({}, ["payload"], "payload field is missing"),
    ({}, ["version"], "version field is missing"),
]


@pytest.mark.parametrize(("damage", "deleted", "note"), FIELD_DAMAGE)
async def test_a_corrupt_schedule_is_paused_and_the_others_keep_firing(
    timed: tuple[vr.Queue, Clock], damage: dict[str, str], deleted: list[str], note: str
) -> None:
    queue, clock = timed
    await two_schedules(queue)
    key = queue.keys.schedule("bad")
    if damage:
        await queue.client.redis.hset(key, mapping=damage)
    if deleted:
        await queue.client.redis.hdel(key, *deleted)
    # Listed marked before it is even fired (the timing fields are read as a worker would).
    await fire_rounds(queue, clock)
    assert await made_by(queue, "good") == 8  # one job per fire time, none lost to the bad one
    assert await made_by(queue, "bad") == 0  # nothing written for it: its check came first
    assert await due_ids(queue) == ["good"]
    info = await queue.get_schedule("bad")
    assert info is not None and info.paused and info.corrupt and info.next_at is None
    assert info.note is not None and info.note.startswith("schedule is corrupt: ") and note in info.note
    listed = {s.id: s for s in await queue.schedules()}
    assert listed["bad"].corrupt and not listed["good"].corrupt and listed["good"].fires == 8


async def test_a_schedule_key_of_the_wrong_type_is_dropped_from_the_due_index_and_listed_marked(
    timed: tuple[vr.Queue, Clock],
) -> None:
    queue, clock = timed
    await two_schedules(queue)
    redis = queue.client.redis
    await redis.delete(queue.keys.schedule("bad"))
    await redis.rpush(queue.keys.schedule("bad"), "x")
    await fire_rounds(queue, clock)
    assert await made_by(queue, "good") == 8 and await due_ids(queue) == ["good"]
    listed = {s.id: s for s in await queue.schedules()}
    bad = listed["bad"]
    assert bad.corrupt and bad.paused and bad.note == "schedule is corrupt: its key is a list, not a hash"
    assert await queue.get_schedule("bad") == bad
    # An operator's action on it says what is wrong, and writes nothing.
    for action in (queue.trigger_schedule, queue.pause_schedule, queue.resume_schedule):
        with pytest.raises(vr.CorruptQueueError, match="its key is a list, not a hash"):
            await action("bad")
    assert await redis.type(queue.keys.schedule("bad")) == b"list"
    # Declaring it again replaces the key: the declaration is the schedule.
    await queue.schedule("bad", Echo(text="bad"), every=STEP / 1000)
    await fire_rounds(queue, clock, 1)
    assert await made_by(queue, "bad") == 1


async def test_declaring_a_quarantined_schedule_again_repairs_it(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    await two_schedules(queue)
    await queue.client.redis.hset(queue.keys.schedule("bad"), mapping={"fires": "x", "version": "v1"})
    await fire_rounds(queue, clock, 1)
    assert (await queue.get_schedule("bad")).corrupt  # type: ignore[union-attr]
    info = await queue.schedule("bad", Echo(text="bad"), every=STEP / 1000)  # a worker's start does this
    assert not info.paused and not info.corrupt and info.note is None and info.next_at is not None
    await fire_rounds(queue, clock, 2)
    assert await made_by(queue, "bad") == 2


async def test_operators_are_told_what_is_wrong(timed: tuple[vr.Queue, Clock]) -> None:
    queue, _ = timed
    await two_schedules(queue)
    await queue.client.redis.hset(queue.keys.schedule("bad"), mapping={"every_ms": "-5", "version": "v1"})
    assert await queue.pause_schedule("bad") is True  # a non-numeric version does not stop a pause
    with pytest.raises(vr.CorruptQueueError, match='every_ms field "-5"'):
        await queue.resume_schedule("bad")
    assert (await queue.get_schedule("bad")).paused  # type: ignore[union-attr]
    # An operator's trigger is refused and writes nothing (the operator is there to see why).
    await queue.client.redis.hset(queue.keys.schedule("good"), "fires", "x")
    before = await queue.client.redis.hgetall(queue.keys.schedule("good"))
    with pytest.raises(vr.CorruptQueueError, match='fires field "x" is not a count'):
        await queue.trigger_schedule("good")
    assert await queue.client.redis.hgetall(queue.keys.schedule("good")) == before
    assert await made_by(queue, "good") == 0 and "good" in await due_ids(queue)


async def test_an_index_entry_with_no_schedule_or_a_stale_score_is_repaired(
    timed: tuple[vr.Queue, Clock],
) -> None:
    """Either would be due for ever: every round would read it, fire nothing, and come back."""
    queue, clock = timed
    await two_schedules(queue)
    redis = queue.client.redis
    await redis.zadd(queue.keys.schedules_due, {"ghost": T0, "bad": T0})  # bad's next fire is T0 + 10 s
    clock.ms = T0 + 1
    round_ = await fire_due(queue)
    assert await due_ids(queue) == ["bad", "good"]
    assert await redis.zscore(queue.keys.schedules_due, "bad") == T0 + STEP
    assert round_.earliest == T0 + STEP and await made_by(queue, "bad") == 0


async def test_a_new_jobs_journal_key_of_the_wrong_type_pauses_its_schedule(
    timed: tuple[vr.Queue, Clock],
) -> None:
    queue, clock = timed
    await two_schedules(queue)
    fire_at = T0 + STEP
    job_id = derived_job_id(fire_at, f"{queue.name}\0bad\0{fire_at}".encode())
    await queue.client.redis.set(queue.keys.journal(job_id), "x")
    await fire_rounds(queue, clock, 3)
    assert await made_by(queue, "good") == 3 and await made_by(queue, "bad") == 0
    assert await queue.client.redis.exists(queue.keys.job(job_id)) == 0
    info = await queue.get_schedule("bad")
    assert (
        info is not None
        and info.corrupt
        and f"journal key of its job {job_id} is not a stream" in (info.note or "")
    )


@pytest.mark.parametrize("which", ["pending", "dedup", "wake", "meta", "events", "due"])
async def test_a_queue_wide_key_of_the_wrong_type_stops_the_fire_before_any_write(
    timed: tuple[vr.Queue, Clock], which: str
) -> None:
    queue, clock = timed
    await queue.schedule("good", Echo(text="good"), every=STEP / 1000)
    k = queue.keys
    if which == "events":
        await queue.set_events(True)
    key = {
        "pending": k.pending_high_first[2],
        "dedup": k.dedup,
        "wake": k.wake,
        "meta": k.meta,
        "events": k.events,
        "due": k.schedules_due,
    }[which]
    redis = queue.client.redis
    before = await redis.hgetall(k.schedule("good"))
    await redis.delete(key)
    await redis.set(key, "x")
    clock.ms += STEP
    with pytest.raises(vr.CorruptQueueError, match="is not a"):
        await fire_due(queue)
    assert await redis.hgetall(k.schedule("good")) == before
    assert await keys_matching(redis, k.prefix + "job:*") == []


async def test_an_events_cap_no_xadd_takes_is_the_default(timed: tuple[vr.Queue, Clock]) -> None:
    """Issue 38, item 3 (the script half, in the fire script): an operator's cap."""
    queue, clock = timed
    await queue.schedule("good", Echo(text="good"), every=STEP / 1000)
    await queue.set_events(True)
    await queue.client.redis.hset(queue.keys.meta, "events", "99999999999999999999")
    await fire_rounds(queue, clock, 2)
    assert await made_by(queue, "good") == 2


async def test_a_worker_keeps_firing_past_a_corrupt_schedule(
    client: vr.Client, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's own loop (the scheduler), real clock: `bad` is due first, every 50 ms."""
    queue = client.queue(queue_name)
    await queue.schedule("bad", Echo(text="bad"), every=0.05)
    await queue.schedule("good", Echo(text="good"), every=0.05)
    await client.redis.hset(queue.keys.schedule("bad"), "fires", "x")
    worker = make_worker(queue, EchoJob, lease=1.0, poll_interval=0.2)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            while await made_by_any(queue, "good") < 3:
                await anyio.sleep(0.02)
            worker.shutdown()
    assert await made_by_any(queue, "bad") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w for w in warnings if "schedule bad paused" in w and "fires field" in w]


async def made_by_any(queue: vr.Queue, schedule_id: str) -> int:
    total = 0
    for state in ("pending", "running", "completed"):
        jobs = await queue.list_jobs(state=state, limit=1000)  # type: ignore[arg-type]
        total += len([j for j in jobs if j.schedule_id == schedule_id])
    return total


def test_venturi_schedules_shows_the_corrupt_ones_marked(redis_server: RedisServer, queue_name: str) -> None:
    from venturi_redis.cli.commands import app

    async def damage() -> None:
        async with vr.Client.from_url(redis_server.url) as c:
            q = c.queue(queue_name)
            for sid in ("fine", "minus", "wrongtype"):
                await q.schedule(sid, Echo(text=sid), every=60)
            await c.redis.hset(q.keys.schedule("minus"), "every_ms", "-5")
            await c.redis.delete(q.keys.schedule("wrongtype"))
            await c.redis.set(q.keys.schedule("wrongtype"), "x")

    anyio.run(damage)
    runner = CliRunner()
    res = runner.invoke(app, ["schedules", "--redis", redis_server.url, "-q", queue_name, "--json"])
    assert res.exit_code == 0, res.output
    docs = {d["id"]: d for d in json.loads(res.stdout)}
    assert [docs[s]["corrupt"] for s in ("fine", "minus", "wrongtype")] == [False, True, True]
    assert 'every_ms field "-5"' in docs["minus"]["note"]
    assert docs["wrongtype"]["note"] == "schedule is corrupt: its key is a string, not a hash"
    table = runner.invoke(app, ["schedules", "--redis", redis_server.url, "-q", queue_name])
    assert table.exit_code == 0 and table.stdout.count("corrupt") >= 2 and "fine" in table.stdout
    assert "its key is a string, not a hash" in table.stdout


async def test_the_dashboard_shows_the_corrupt_ones_marked(
    redis_server: RedisServer, queue_name: str
) -> None:
    import httpx

    from venturi_redis.dashboard import create_app

    async with vr.Client.from_url(redis_server.url) as c:
        q = c.queue(queue_name)
        for sid in ("fine", "minus", "wrongtype"):
            await q.schedule(sid, Echo(text=sid), every=60)
        await c.redis.hset(q.keys.schedule("minus"), "every_ms", "-5")
        await c.redis.delete(q.keys.schedule("wrongtype"))
        await c.redis.set(q.keys.schedule("wrongtype"), "x")
        transport = httpx.ASGITransport(app=create_app(c))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
            page = await h.get(f"/queues/{queue_name}/schedules")
            api = await h.get(f"/api/queues/{queue_name}/schedules")
    assert page.status_code == 200 and page.text.count("corrupt") >= 2
    rows = {r["id"]: r for r in api.json()["schedules"]}
    assert rows["wrongtype"]["corrupt"] and rows["minus"]["corrupt"] and not rows["fine"]["corrupt"]


async def test_a_wrong_type_schedules_set_is_named(timed: tuple[vr.Queue, Clock]) -> None:
    queue, _ = timed
    await queue.client.redis.set(queue.keys.schedules, "x")
    with pytest.raises(vr.CorruptQueueError, match="schedules"):
        await queue.schedules()
    with pytest.raises(vr.CorruptQueueError, match="is not a set"):
        await queue.schedule("s", Echo(text="s"), every=5)
    assert await queue.client.redis.exists(queue.keys.schedule("s")) == 0


def test_the_scripts_and_the_readers_agree_on_the_corrupt_notes_prefix() -> None:
    from pathlib import Path

    from venturi_redis._model.schedule import CORRUPT

    include = Path(__file__).resolve().parent.parent / "lua/include/schedule.lua"
    assert f"local SCHEDULE_CORRUPT = '{CORRUPT}'" in include.read_text()
