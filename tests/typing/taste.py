"""README.md's "A taste", as a user writes it, with the types a checker must see.

Checked by tests/test_typing_users.py under mypy --strict and pyright's strict
mode; never run (pytest collects no file here).
"""

from dataclasses import dataclass
from typing import ClassVar, assert_type

from pydantic import BaseModel

import venturi_redis as vr


@dataclass
class App:
    user_agent: str = "taste/1.0"


class Progress(BaseModel):
    pages: int = 0


class Crawl(vr.Task[Progress]):
    KIND: ClassVar[str] = "crawl"
    site: str

    def priority(self) -> vr.Priority:
        return vr.Priority.HIGH


class CrawlJob(Crawl, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[Progress], app: App) -> vr.Outcome:
        assert_type(self.site, str)
        assert_type(ctx.carry, Progress)
        ctx.carry.pages += 1
        ctx.set_attachment({"pages": ctx.carry.pages, "agent": app.user_agent})
        if ctx.carry.pages < 3:
            return vr.Outcome.pause_in(0)
        return vr.Outcome.completed_with("crawled")


async def main(url: str) -> None:
    async with vr.Client.from_url(url) as client:
        assert_type(client, vr.Client)
        queue = client.queue("taste")
        assert_type(queue, vr.Queue)
        job_id = await queue.enqueue(Crawl(site="example.org"))
        assert_type(job_id, str)

        worker = vr.Worker(queue, state=App(), concurrency=16, lease=30.0)
        assert_type(worker, vr.Worker[App])
        assert_type(worker.register(CrawlJob), vr.Worker[App])
        await worker.run(until_idle=True)

        info = await queue.get(job_id)
        assert_type(info, vr.JobInfo | None)
        assert info is not None
        assert_type(info.state, vr.JobState)
        assert_type(info.run_count, int)
        for entry in await queue.journal(job_id):
            assert_type(entry, vr.JournalEntry)
            assert_type(entry.note, str | None)
