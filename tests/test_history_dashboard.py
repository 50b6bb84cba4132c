"""The metrics history in the dashboard (issue 41): a chart with axes and a scale, server-rendered
SVG, on each queue page (its own route, on a slower cadence than the page's counts) and on the
overview (for a queue whose history is on, within the overview's command bound)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis._producer.reads import COUNT_COMMANDS
from venturi_redis.dashboard import create_app
from venturi_redis.dashboard._chart import chart, nice_max

pytestmark = pytest.mark.anyio


def http(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # its own: the overview's test counts every command
        yield server


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_server.url, namespace=f"h{uuid.uuid4().hex[:10]}")
    try:
        yield c
    finally:
        await c.aclose()


def test_the_chart_has_axes_and_a_round_scale() -> None:
    assert [nice_max(v) for v in (0, 1, 3, 7, 10, 11, 180, 4999)] == [1, 1, 5, 10, 10, 20, 200, 5000]
    t0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    points = [vr.HistoryPoint(at=t0 + timedelta(minutes=i), enqueued=i, completed=i // 2) for i in range(60)]
    c = chart(points, width=600, height=150)
    assert c["top"] == 100 and [t["label"] for t in c["y_ticks"]] == ["0", "50", "100"]
    assert [t["label"] for t in c["x_ticks"]] == ["09:00", "09:29", "09:59"]
    enqueued = c["lines"][0]
    assert enqueued["name"] == "enqueued" and enqueued["total"] == sum(range(60)) and enqueued["peak"] == 59
    first, last = enqueued["points"].split()[0], enqueued["points"].split()[-1]
    assert first == f"{c['box']['x0']},{c['box']['y1']}"  # 0 at the left, on the x axis
    assert last.startswith(f"{c['box']['x1']},")
    assert "per minute, scale 0 to 100" in c["label"]


async def test_the_queue_page_loads_its_history_chart(client: vr.Client) -> None:
    queue = client.queue("mail")
    await queue.set_history(True)
    await queue.enqueue_many([Echo(text="a"), Echo(text="b"), Doomed()])
    await drain(queue, EchoJob, DoomedJob)
    async with http(create_app(client)) as h:
        page = (await h.get("/queues/mail")).text
        assert 'hx-get="/queues/mail/history"' in page and "<h2>History</h2>" in page
        fragment = await h.get("/queues/mail/history", headers={"HX-Request": "true"})
        full = await h.get("/queues/mail/history", params={"span": "24h", "kind": "echo"})
        api = (await h.get("/api/queues/mail/history", params={"span": "7d"})).json()
        bad = await h.get("/queues/mail/history", params={"span": "2y"})
    assert fragment.status_code == 200 and "<html" not in fragment.text
    svg = fragment.text
    for part in ('<svg class="history"', 'class="axis y-axis"', 'class="axis x-axis"', "series completed"):
        assert part in svg, part
    assert re.search(r'<text class="tick"[^>]*>5</text>', svg)  # the scale's top: 3 enqueued at once
    assert "enqueued 3" in svg and "completed 2" in svg and "failed 1" in svg and "dead 1" in svg
    assert "history-off" not in svg and 'hx-trigger="every 60s"' in svg
    assert full.status_code == 200 and "<html" in full.text and "the last 24h" in full.text
    assert "kind <code>echo</code>" in full.text and "dead 0" in full.text
    assert api["on"] is True and len(api["points"]) == 168 and sum(p["enqueued"] for p in api["points"]) == 3
    assert bad.status_code == 400


async def test_a_page_says_when_the_history_is_off(client: vr.Client) -> None:
    queue = client.queue("quiet")
    await queue.enqueue(Echo(text="a"))
    async with http(create_app(client)) as h:
        svg = (await h.get("/queues/quiet/history", headers={"HX-Request": "true"})).text
    assert 'id="history-off"' in svg and "venturi queue history quiet on" in svg and "<svg" in svg


def test_the_overview_draws_the_history_within_its_command_bound(own_server: RedisServer) -> None:
    import anyio

    async def go() -> tuple[str, dict[str, Any], int, dict[str, int]]:
        async with vr.Client.from_url(own_server.url) as c:
            on, off = c.queue("orders"), c.queue("mail")
            await on.set_history(True)
            await on.enqueue_many([Echo(text="a"), Doomed()])
            await off.enqueue(Echo(text="b"))
            await drain(on, EchoJob, DoomedJob)
            web = create_app(c)
            async with http(web) as h:
                page = (await h.get("/")).text
                await c.redis.config_resetstat()
                api = (await h.get("/api/queues")).json()["queues"]
                stats = await c.redis.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        total = sum(n for name, n in calls.items() if name not in ("info", "config|resetstat"))
        return page, {q["queue"]: q for q in api}, total, calls

    page, api, total, calls = anyio.run(go)
    row = page.split('data-queue="orders"')[1].split("</tr>")[0]
    assert '<svg class="history"' in row and 'class="axis x-axis"' in row and "enqueued 2" in row
    other = page.split('data-queue="mail"')[1].split("</tr>")[0]
    assert '<svg class="history"' not in other and 'class="scale"' in other  # its sets' bars
    chart_ = api["orders"]["throughput_per_minute"]
    assert chart_["source"] == "history" and sum(chart_["enqueued"]) == 2 and sum(chart_["failed"]) == 1
    assert "source" not in api["mail"]["throughput_per_minute"]
    # The bound of tests/test_no_scan.py: the history's open minute replaces the two open bars.
    assert total <= (COUNT_COMMANDS + 2) * 2 + 2 * 2, (total, calls)
    assert calls.get("hgetall", 0) <= 2 and "time" not in calls
