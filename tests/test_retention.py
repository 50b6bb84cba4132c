"""Retention that keeps up (issue 47): count bounds as well as ages, bounded defaults,
trimming in the completing call under load, and stats that say how far trimming is behind."""

from __future__ import annotations

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, keys_matching, make_worker
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis._producer import ops as _ops
from venturi_redis._producer.retention import bounds_of_field

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000


def test_the_defaults_are_bounded_by_count_and_keep_the_dead_longest() -> None:
    bounds = vr.Retention().bounds()
    assert {state: most for state, (_, most) in bounds.items()} == {
        "completed": 10_000,
        "dead": 10_000,
        "cancelled": 10_000,
    }
    periods = {state: period for state, (period, _) in bounds.items()}
    assert periods["dead"] == 7 * 86_400_000 > periods["completed"] == periods["cancelled"] == 86_400_000
    with pytest.raises(vr.ConfigurationError, match="max_dead"):
        vr.Retention(max_dead=-1)
    with pytest.raises(vr.ConfigurationError, match="max_completed"):
        vr.Retention(max_completed=True)  # type: ignore[arg-type]


def test_the_recorded_retention_reads_back_and_anything_else_is_the_defaults() -> None:
    r = vr.Retention(completed=5, dead=None, max_cancelled=None)
    assert bounds_of_field(r.to_field().encode()) == r.bounds()
    assert bounds_of_field(b"none") == {s: (None, None) for s in ("completed", "dead", "cancelled")}
    for junk in (
        None,
        b"",
        b"{",
        b'{"completed": [1, 2]}',
        b'{"completed": [-1, 2], "dead": [1, 1], "cancelled": [1, 1]}',
    ):
        assert bounds_of_field(junk) == vr.Retention().bounds()


async def test_a_count_bound_keeps_the_newest_and_trims_in_the_completing_call(queue: vr.Queue) -> None:
    ids = [await queue.enqueue(Echo(text=str(i))) for i in range(30)]
    # No age bound, and no reclaim tick in the run: the completions trim alone.
    await drain(
        queue, EchoJob, retention=vr.Retention(completed=None, max_completed=5), reclaim_interval=3600
    )
    kept = [j for j in ids if await queue.get(j) is not None]
    assert (await queue.stats()).completed == len(kept) == 5
    order = await queue.client.redis.zrange(queue.keys.completed, 0, -1, withscores=True)
    newest = sorted(order, key=lambda m: m[1])[-5:]
    assert sorted(m.decode() for m, _ in newest) == sorted(kept)
    gone = [j for j in ids if j not in kept]
    assert await queue.client.redis.exists(*(queue.keys.journal(j) for j in gone)) == 0


async def test_dead_and_cancelled_count_bounds_are_kept_by_the_sweep(queue: vr.Queue) -> None:
    dead = [await queue.enqueue(Doomed()) for _ in range(6)]
    cancelled = [await queue.enqueue(Echo(text=f"c{i}")) for i in range(4)]
    for job_id in cancelled:
        assert await queue.cancel(job_id) == "cancelled"
    await drain(queue, DoomedJob, max_failures=1)
    assert (await queue.stats()).dead == 6
    removed = await _ops.trim(queue, vr.Retention(max_dead=2, max_cancelled=1))
    assert removed == 4 + 3
    stats = await queue.stats()
    assert (stats.dead, stats.cancelled) == (2, 1)
    assert [await queue.get(j) is not None for j in dead].count(True) == 2


async def test_trimming_keeps_pace_with_a_busy_worker(redis_server: object, queue_name: str) -> None:
    """A count bound holds at every instant of a drain at full speed: each completing
    call trims what it pushed past the bound (never the reclaim tick's work)."""
    async with vr.Client.from_url(redis_server.url) as client:  # type: ignore[attr-defined]
        queue = client.queue(queue_name)
        for start in range(0, 4_000, 500):
            await queue.enqueue_many([Echo(text=str(i)) for i in range(start, start + 500)])
        worker = make_worker(
            queue,
            EchoJob,
            concurrency=100,
            retention=vr.Retention(completed=3600, max_completed=150),
            reclaim_interval=3600,
        )
        held: list[int] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(until_idle=True))
            with anyio.fail_after(120):
                while True:
                    held.append(await client.redis.zcard(queue.keys.completed))
                    counts = await queue.counts()
                    if counts["pending"] == counts["running"] == 0:
                        break
                    await anyio.sleep(0.005)
        assert len(held) > 5  # it was watched while it ran
        assert max(held) <= 150
        assert await client.redis.zcard(queue.keys.completed) == 150
        journals = await keys_matching(client.redis, f"{queue.keys.prefix}journal:*")
        assert len(journals) == 150  # each trimmed job's journal went with it


async def test_stats_say_how_far_trimming_is_behind(client: vr.Client, queue_name: str) -> None:
    t = [BASE]
    c = vr.Client(client.redis, clock=lambda: t[0], url=client.url)
    queue = c.queue(queue_name)
    await queue.enqueue_many([Echo(text=str(i)) for i in range(5)])
    await drain(queue, EchoJob, retention=None)  # a worker that keeps everything records so
    assert await c.redis.hget(queue.keys.meta, "retention") == b"none"
    t[0] = BASE + 60_000
    stats = await queue.stats()
    assert (stats.completed, stats.trim_lag_seconds, stats.over_retention) == (5, 0.0, 0)
    # A fleet that keeps 10 s and at most 2: three jobs too many, the oldest 50 s too old.
    await _ops.record_retention(queue, vr.Retention(completed=10, max_completed=2))
    stats = await queue.stats()
    assert (stats.trim_lag_seconds, stats.over_retention) == (50.0, 3)
    assert stats.to_dict()["trim_lag_seconds"] == 50.0
    await _ops.trim(queue, vr.Retention(completed=10, max_completed=2))
    stats = await queue.stats()
    assert (stats.completed, stats.trim_lag_seconds, stats.over_retention) == (0, 0.0, 0)


async def test_a_worker_records_the_retention_it_trims_by(queue: vr.Queue) -> None:
    retention = vr.Retention(completed=30, max_dead=7)
    await queue.enqueue(Echo(text="x"))
    await drain(queue, EchoJob, retention=retention)
    raw = await queue.client.redis.hget(queue.keys.meta, "retention")
    assert raw is not None and bounds_of_field(raw) == retention.bounds()
