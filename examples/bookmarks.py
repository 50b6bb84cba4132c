"""The seed's bookmark service, end to end: FetchBookmark with a fake fetcher.

Run it with ``make example`` (or ``python examples/bookmarks.py``). It uses
``REDIS_URL`` when set, else the embedded ``memory://`` server.

A producer enqueues one fetch per bookmark (deduplicated per bookmark: a newer
enqueue replaces a pending one); a worker fetches the pages. One URL is gone
(410: a permanent error, the job goes to dead), one is flaky (fails twice,
then succeeds on its third run; the first two retries of the Fibonacci
schedule wait 0 s, see docs/design.md, "Outcomes").

It says first what to expect (the worker logs a WARNING for each failed run
and for the dead job: those are the point of the example, not a failure of
it), then prints one line per job (its URL, final state, runs, failed runs and
last note) and, under it, the job's journal, oldest event first; then the
commands that show the queue in the web dashboard (docs/dashboard.md), which
can read it only when it ran on a real Redis (``REDIS_URL``), not on ``memory://``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from ulid import ULID

import venturi_redis as vr

# ---- The task: identity + enqueue-time policy (producer side) ----


class FetchBookmark(vr.Task):
    KIND: ClassVar[str] = "fetch_bookmark"
    bookmark_id: str
    url: str

    def priority(self) -> vr.Priority:
        return vr.Priority.NORMAL

    # At most one pending fetch per bookmark.
    def dedup_key(self) -> str | None:
        return self.bookmark_id

    # A newer enqueue for the same bookmark supersedes the pending one.
    def merge(self, existing: vr.Pending[FetchBookmark, vr.NoCarry]) -> vr.Merge[FetchBookmark, vr.NoCarry]:
        return vr.Merge.replace()


# ---- The worker's shared dependencies (fakes standing in for HTTP and a DB) ----


class Gone(Exception):
    pass


@dataclass
class FakeHttp:
    pages: dict[str, str]
    flaky: dict[str, int] = field(default_factory=dict)

    async def get(self, url: str) -> str:
        await asyncio.sleep(0.001)
        if url.endswith("/gone"):
            raise Gone(url)
        if self.flaky.get(url, 0) > 0:
            self.flaky[url] -= 1
            raise ConnectionError(f"connection reset fetching {url}")
        return self.pages.get(url, f"<html>{url}</html>")


@dataclass
class App:
    http: FakeHttp
    db: dict[str, str] = field(default_factory=dict)


# ---- The execution side (worker) ----


class FetchBookmarkJob(FetchBookmark, vr.Handler[App]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], app: App) -> vr.Outcome:
        try:
            body = await app.http.get(self.url)  # a transient error raises: retried
        except Gone:
            raise vr.TaskError.permanent("resource gone") from None
        app.db[self.bookmark_id] = body
        ctx.set_attachment({"bytes": len(body)})
        return vr.Outcome.completed_with(f"fetched {len(body)} bytes")


# ---- Wiring it together ----


def venturi_command() -> str:
    """The ``venturi`` command beside this Python (``.venv/bin/venturi`` after ``make``)."""
    here = os.path.join(os.path.dirname(sys.executable), "venturi")
    if not os.path.exists(here):
        return "venturi"  # installed elsewhere: on PATH, as pip puts it
    relative = os.path.relpath(here)
    return here if relative.startswith("..") else relative


def shown_url(url: str) -> str:
    """``url`` to print in a command: as given, unless it holds a password."""
    return '"$REDIS_URL"' if "@" in url else url


async def main() -> dict[str, vr.JobInfo]:
    client = vr.Client.from_url(os.environ.get("REDIS_URL") or "memory://")
    queue = client.queue(f"bookmarks-{uuid.uuid4().hex[:8]}")
    marks = {
        str(ULID()): url
        for url in (
            "https://example.org/a",
            "https://example.org/b",
            "https://example.org/gone",
            "https://example.org/flaky",
        )
    }
    # The producer knows only FetchBookmark, never App.
    ids = await queue.enqueue_many([FetchBookmark(bookmark_id=b, url=u) for b, u in marks.items()])
    # A second enqueue for the first bookmark replaces the pending fetch: same job id.
    first = next(iter(marks))
    again = await queue.enqueue(FetchBookmark(bookmark_id=first, url="https://example.org/a?v=2"))
    assert again == ids[0], "dedup should have merged into the pending job"

    app = App(http=FakeHttp(pages={}, flaky={"https://example.org/flaky": 2}))
    worker = vr.Worker(
        queue,
        state=app,
        concurrency=8,
        lease=10.0,
        backoff=vr.Backoff.fibonacci(base=0.05, cap=1.0),
        handle_signals=False,
    )
    worker.register(FetchBookmarkJob)
    print(
        "Fetching 4 bookmarks. Expect three WARNING lines from the worker: /flaky fails\n"
        "twice (retried, then it succeeds) and /gone is gone for good (its job is dead).\n",
        flush=True,
    )
    await worker.run(until_idle=True)

    results: dict[str, vr.JobInfo] = {}
    print("url, final state, runs, failed runs, last note; then the journal, oldest first")
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None
        results[job_id] = info
        journal = await queue.journal(job_id)
        print(
            f"{info.payload['url']:<32} {info.state.value:<10} runs={info.run_count} "
            f"failures={info.failures} note={info.note!r}"
        )
        print("    journal: " + " -> ".join(e.event for e in journal))
    venturi = venturi_command()
    if os.environ.get("REDIS_URL"):
        print(
            f"\nSee queue {queue.name} in a browser: start the dashboard,\n"
            f"  {venturi} dashboard --redis {shown_url(os.environ['REDIS_URL'])}\n"
            f"then open http://127.0.0.1:8080/queues/{queue.name} (Ctrl-C stops the dashboard)."
        )
    else:
        # memory:// lives in this process: once it exits, nothing can read it.
        print(
            "\nThis ran on memory://, a Redis inside this process: its jobs are gone now, and no\n"
            "dashboard could see them. To see them in a browser, run on a real Redis:\n"
            "  REDIS_URL=redis://127.0.0.1:6379/0 make example\n"
            f"  {venturi} dashboard --redis redis://127.0.0.1:6379/0   # then open http://127.0.0.1:8080/"
        )
    await client.aclose()
    return results


if __name__ == "__main__":
    # The worker's log lines, readable: a level and where they come from.
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    asyncio.run(main())
