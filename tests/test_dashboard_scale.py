"""The autoscaling signal, ``GET /api/queues/{queue}/scale`` (issue 41), through the ASGI app:
its fields, in read-only mode and behind a token, and its reads (O(log n), never a scan)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from tests.test_dashboard import World, http, world_on
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

FIELDS = {"queue", "ready", "running", "due_soon", "limited", "workers", "lag_seconds", "paused", "at_ms"}


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    async with world_on(redis_server) as w:
        yield w


async def test_scale_counts_ready_running_due_soon_limited_and_workers(world: World) -> None:
    q = world.queue
    await q.enqueue(Echo(text="soon"), delay=30)  # within the minute; the world's other is in an hour
    await q.set_limit("limited", concurrency=1)
    worker = make_worker(q, EchoJob, concurrency=1)
    await q.pause()  # the worker registers, and claims nothing
    async with anyio.create_task_group() as tg, http(create_app(world.client, read_only=True)) as h:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while not await q.workers():
                await anyio.sleep(0.02)
        r = await h.get("/api/queues/mail/scale")
        worker.shutdown()
    assert r.status_code == 200
    doc = r.json()
    assert set(doc) == FIELDS
    stats = await q.stats()
    assert doc["queue"] == "mail" and doc["paused"] is True
    assert doc["ready"] == stats.eligible == 1  # the pending login
    assert doc["running"] == 1  # the world's claimed job
    assert doc["due_soon"] == 1
    assert doc["limited"] == stats.limited
    assert doc["workers"] == 1
    assert doc["lag_seconds"] >= 0


async def test_scale_of_a_queue_with_no_jobs_yet_is_zero_and_a_bad_name_is_404(world: World) -> None:
    async with http(create_app(world.client)) as h:
        empty = (await h.get("/api/queues/not-yet/scale")).json()
        assert empty["ready"] == empty["running"] == empty["workers"] == empty["due_soon"] == 0
        assert empty["lag_seconds"] == 0.0
        assert (await h.get("/api/queues/no{pe/scale")).status_code == 404


async def test_scale_needs_the_token_when_the_dashboard_has_one(world: World) -> None:
    app = create_app(world.client, token="s3cret-token", read_only=True)
    async with http(app) as h:
        assert (await h.get("/api/queues/mail/scale")).status_code == 401
    async with http(app, authorization="Bearer s3cret-token") as h:
        assert (await h.get("/api/queues/mail/scale")).json()["ready"] == 1


async def test_scale_reads_no_job_and_scans_nothing(world: World) -> None:
    """Its reads are index counts: COMMANDSTATS shows no SCAN, no HGETALL, no read of a job."""
    redis = world.client.redis
    await redis.config_resetstat()
    async with http(create_app(world.client)) as h:
        assert (await h.get("/api/queues/mail/scale")).status_code == 200
    stats = await redis.info("commandstats")
    called = {name.removeprefix("cmdstat_").lower().split("|")[0] for name in stats}
    assert called <= {"time", "multi", "exec", "zcount", "zrangebyscore", "zcard", "hget", "exists", "config"}
