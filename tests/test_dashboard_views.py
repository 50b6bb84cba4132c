"""The dashboard as issue 39 (item 6) asked for it: what a new user met first, fixed.

The job list under a heading of its own, right under the filters (above the
limits, workers and live feed); the views of the pending jobs (retrying,
delayed, limited) as filters; confirmations on the actions that act on many
jobs or cannot be undone; no "log out" on the login page; progress as a bar;
field labels for people; the overview's charts with a scale and waiting,
delayed, retrying and limited in columns of their own; schedule times in the
schedule's own zone too. (The 409 of a refused action: tests/test_dashboard.py;
the heading in a browser: tests/test_dashboard_browser.py.)
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo
from tests.test_dashboard import World, csrf_of, http, world_on
from venturi_redis.dashboard import _listing, _render, create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
async def world(redis_server: RedisServer) -> Any:
    async with world_on(redis_server) as w:
        yield w


class Pages(vr.Task):
    KIND: ClassVar[str] = "pages"


class PagesJob(Pages, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress({"page": 3, "of": 12})
        await anyio.sleep(3600)  # still running while the page is read
        return vr.Outcome.completed()


async def test_the_job_list_has_a_heading_and_comes_before_the_rest(world: World) -> None:
    await world.queue.set_events(True)
    async with http(create_app(world.client)) as h:
        page = (await h.get("/queues/mail", params={"state": "dead"})).text
        everything = (await h.get("/queues/mail")).text
    assert '<h2 id="jobs-heading">Dead jobs</h2>' in page
    assert '<h2 id="jobs-heading">Jobs</h2>' in everything
    # Under the filters, before the limits, the workers and the live feed.
    assert page.index('class="filters"') < page.index("jobs-heading") < page.index("<h2>Live events</h2>")
    assert page.index("jobs-heading") < page.index('<div id="limits">') < page.index('<div id="workers">')
    # The live feed can hide progress events and keep one event or kind.
    for control in ('id="feed-event"', 'id="feed-kind"', 'type="checkbox" id="feed-progress"'):
        assert control in page


async def test_retrying_delayed_and_limited_are_filters(world: World) -> None:
    q = world.queue
    async with http(create_app(world.client)) as h:
        page = (await h.get("/queues/mail")).text
        for view in ("retrying", "delayed", "limited"):
            assert f'href="?state={view}"' in page
        delayed = (await h.get("/api/queues/mail/jobs", params={"state": "delayed"})).json()
        assert [j["id"] for j in delayed["jobs"]] == [world.ids["delayed"]]
        assert (await h.get("/api/queues/mail/jobs", params={"state": "retrying"})).json()["jobs"] == []
        shown = (await h.get("/queues/mail", params={"state": "delayed"})).text
        assert "Delayed jobs (eligible later)" in shown and world.ids["pending"] not in shown
        assert (await h.get("/queues/mail", params={"state": "sleeping"})).status_code == 400

        # Limited jobs, page by page: the cursor of limits:parked names its member.
        await q.set_limit("echo", concurrency=1)
        ids = [await q.enqueue(Echo(text=str(n)), timeout=60) for n in range(5)]  # parked at enqueue
        seen: list[str] = []
        cursor = None
        while True:
            page_ = await _listing.page_jobs(q, state="limited", cursor=cursor, limit=2)
            seen += [j.id for j in page_.jobs]
            if page_.next_cursor is None:
                break
            cursor = page_.next_cursor
            assert "~L~" in cursor
        assert seen == ids
        api = (await h.get("/api/queues/mail/jobs", params={"state": "limited"})).json()
        assert [j["id"] for j in api["jobs"]] == ids


async def test_actions_that_cannot_be_undone_ask_first(world: World) -> None:
    await world.queue.schedule("nightly", Echo(text="n"), cron="30 2 * * *", tz="Europe/Berlin")
    async with http(create_app(world.client)) as h:
        queue_page = (await h.get("/queues/mail")).text
        job_page = (await h.get(f"/queues/mail/jobs/{world.ids['pending']}")).text
        schedules = (await h.get("/queues/mail/schedules")).text
    assert 'data-confirm="Move all 2 dead back to pending? Workers will run them again."' in queue_page
    assert f'data-confirm="Cancel job {world.ids["pending"]} (login)? It will not run."' in job_page
    assert 'data-confirm="Fire schedule nightly now? It enqueues one extra echo job' in schedules
    assert "confirm.js" in queue_page  # the script that asks (no inline script: the CSP)
    # And the schedule's times in its own zone, beside UTC.
    assert "(Europe/Berlin)" in schedules and ("02:30 CET" in schedules or "02:30 CEST" in schedules)


async def test_the_login_page_offers_no_log_out(world: World) -> None:
    async with http(create_app(world.client, token="s3cret")) as h:
        login = await h.get("/login")
        assert "log out" not in login.text
        token = csrf_of(login.text)
        await h.post("/login", data={"csrf_token": token, "token": "s3cret", "next": "/"})
        assert "log out" in (await h.get("/")).text


async def test_progress_is_a_bar_with_the_runs_time_and_fields_have_labels(world: World) -> None:
    job_id = await world.queue.enqueue(Pages())
    worker = make_worker(world.queue, PagesJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (info := await world.queue.get(job_id)) is None or info.progress is None:
                await anyio.sleep(0.02)
        async with http(create_app(world.client)) as h:
            page = (await h.get(f"/queues/mail/jobs/{job_id}")).text
        worker.shutdown(grace=0)
    assert '<progress value="3.0" max="12.0">25%</progress>' in page
    assert 'id="job-elapsed">running for ' in page
    assert "<th>failed runs</th>" in page and "<th>run_count</th>" not in page


async def test_overview_columns_and_chart_scales(world: World) -> None:
    async with http(create_app(world.client)) as h:
        page = (await h.get("/")).text
    row = page.split('data-queue="mail"')[1].split("</tr>")[0]
    for view, n in (("delayed", 1), ("retrying", 0), ("waiting", 0), ("limited", 0)):
        assert f'<a href="/queues/mail?state={view}">{n}</a>' in row or f'state={view}">{n}</a>' in row
    assert '<span class="scale" title="the tallest bar: completed' in row and ">1/min</span>" in row
    assert ">2/min</span>" in row  # the two deaths of the same minute


def test_progress_bars_from_what_handlers_report() -> None:
    assert _render.progress_bar(0.25) == {"value": 0.25, "max": 1.0, "percent": 25}
    assert _render.progress_bar(40) == {"value": 40.0, "max": 100.0, "percent": 40}
    assert _render.progress_bar({"done": 3, "of": 4})["percent"] == 75  # type: ignore[index]
    assert _render.progress_bar({"page": 2, "of": 8})["percent"] == 25  # type: ignore[index]
    for raw in (250, True, "half", {"of": 4}, {"done": 5, "of": 4}, {"a": 1, "b": 2, "of": 4}, [1, 2]):
        assert _render.progress_bar(raw) is None, raw
