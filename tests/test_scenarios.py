"""The issue's crawl scenario and the seed's bookmark service, on every backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import drain
from tests.test_examples import load

pytestmark = pytest.mark.anyio


class Progress(BaseModel):  # a carry: a pydantic model whose fields all have defaults
    pages: int = 0


@dataclass
class App:
    crawled: list[str]


class Crawl(vr.Task[Progress]):
    KIND: ClassVar[str] = "crawl"
    site: str

    def priority(self) -> vr.Priority:
        return vr.Priority.HIGH

    def backoff(self) -> vr.Backoff | None:
        return None


class CrawlJob(Crawl, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[Progress], app: App) -> vr.Outcome:
        ctx.carry.pages += 1
        ctx.set_attachment({"pages": ctx.carry.pages})
        if ctx.carry.pages < 3:
            return vr.Outcome.pause_in(0)
        app.crawled.append(self.site)
        return vr.Outcome.completed_with("crawled")


async def test_crawl_scenario(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Crawl(site="example.org"), delay=0.0)
    ids = await queue.enqueue_many([Crawl(site=s) for s in ("a.org", "b.org")])
    app = App(crawled=[])
    await drain(
        queue,
        CrawlJob,
        state=app,
        concurrency=16,
        lease=30.0,
        max_failures=25,
        backoff=vr.Backoff.fibonacci(base=1.0, cap=600.0),
        jitter=0.25,
    )
    assert sorted(app.crawled) == ["a.org", "b.org", "example.org"]
    for jid in (job_id, *ids):
        info = await queue.get(jid)
        assert info is not None
        assert (info.state, info.priority, info.run_count, info.failures) == (
            vr.JobState.COMPLETED,
            vr.Priority.HIGH,
            3,
            0,
        )
        assert (info.carry, info.attachment, info.note) == ({"pages": 3}, {"pages": 3}, "crawled")
    entries = await queue.journal(job_id)
    assert [e.event for e in entries] == [
        "enqueued",
        "claimed",
        "paused",
        "claimed",
        "paused",
        "claimed",
        "completed",
    ]
    assert [e.attachment for e in entries if e.event in ("paused", "completed")] == [
        {"pages": 1},
        {"pages": 2},
        {"pages": 3},
    ]


async def test_bookmarks_scenario(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    results = await load("bookmarks").main()
    states = sorted((info.payload["url"], info.state.value) for info in results.values())
    assert states == [
        ("https://example.org/a?v=2", "completed"),
        ("https://example.org/b", "completed"),
        ("https://example.org/flaky", "completed"),
        ("https://example.org/gone", "dead"),
    ]
