"""The queue page's "retry these N" (issue 41): the dead jobs of the kind filtered on, counted,
confirmed, and only those dead when the page was read."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import run_until_event
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob
from tests.test_dashboard import World, csrf_of, http, world_on
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    async with world_on(redis_server) as w:
        yield w


async def test_retry_these_n_dead_of_a_kind_with_confirmation(world: World) -> None:
    q = world.queue
    async with http(create_app(world.client)) as h:
        everything = (await h.get("/queues/mail")).text
        assert "retry all 2 dead" in everything and "retry these" not in everything
        page = (await h.get("/queues/mail", params={"kind": "doomed"})).text
        assert "retry these 1 dead" in page
        assert 'data-confirm="Move these 1 dead jobs of kind doomed back to pending?' in page
        until_ms = re.search(r'name="until_ms" value="(\d+)"', page)
        assert until_ms
        await anyio.sleep(0.01)
        later = await q.enqueue(Doomed())  # dies after the page was read: not one of "these"
        await run_until_event(q, later, "dead", DoomedJob)
        r = await h.post(
            "/queues/mail/dead/retry",
            data={"csrf_token": csrf_of(page), "kind": "doomed", "until_ms": until_ms.group(1)},
            headers={"accept": "application/json"},
        )
        assert r.json()["moved"] == [world.ids["dead"]]
        assert (await q.get(later)).state == vr.JobState.DEAD  # type: ignore[union-attr]
        assert (await q.get(world.ids["hostile"])).state == vr.JobState.DEAD  # type: ignore[union-attr]
        none = (await h.get("/queues/mail", params={"kind": "echo"})).text
        assert "retry these" not in none and "retry all" not in none
