"""Screenshots of the web dashboard for docs/dashboard.md, made in a real browser.

    .venv/bin/python scripts/dashboard_screenshots.py docs/images

Starts a throwaway redis-server, fills a queue ``emails`` with jobs in every
state (a worker runs some, fails some for good, leaves one suspended, one
running, a backlog pending), serves the dashboard with ``venturi dashboard``
as a user would, and walks it in headless Chromium (Debian's
``/usr/bin/chromium``, driven by Playwright; no browser is downloaded):
overview, the queue's dead jobs (under their heading, on the first screen),
a dead job, the same job after pressing retry (and a second retry, sent as
JSON, refused with 409), and the queue page of a second tab whose live event
feed shows that retry. tests/test_dashboard_browser.py runs the same walk.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import venturi_redis as vr
from venturi_redis._store import calls

CHROMIUM = os.environ.get("VENTURI_CHROMIUM", "/usr/bin/chromium")
# The flags of docs/dashboard.md's test notes: without the background-networking
# ones Chromium keeps trying hosts a closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUEUE = "emails"


class SendEmail(vr.Task):
    KIND: ClassVar[str] = "send_email"
    to: str
    subject: str


class SendEmailJob(SendEmail, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.to.endswith("@bounce.example"):
            ctx.set_attachment({"smtp": 550, "reply": "mailbox unavailable"})
            raise vr.TaskError.permanent(f"550 mailbox unavailable: {self.to}")
        return vr.Outcome.completed(result={"message_id": f"<{ctx.job_id}@mail.example>"})


class Approve(vr.Task):
    KIND: ClassVar[str] = "approve_refund"
    order: int


class ApproveJob(Approve, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.suspend(output={"question": f"refund order {self.order}?"})


class SyncAccount(vr.Task):
    KIND: ClassVar[str] = "sync_account"
    tenant: str

    def limit_key(self) -> str | None:
        return self.tenant


async def hold(q: vr.Queue, count: int, worker: str) -> None:
    """Claim ``count`` jobs for a worker that is not there: they show as running, with their owner."""
    claim = calls.claim(
        q.keys, q.client._now_arg(), count=count, worker=worker, token_base=worker, default_lease_ms=600_000
    )
    await q.client.sender.call(claim)


async def populate(url: str) -> dict[str, str]:
    """Jobs in every state on queue ``emails``; returns one id per state."""
    client = vr.Client.from_url(url)
    try:
        q = client.queue(QUEUE)
        ids: dict[str, str] = {}
        for i in range(12):
            await q.enqueue(SendEmail(to=f"user{i}@mail.example", subject=f"Welcome #{i}"))
        ids["dead"] = await q.enqueue(SendEmail(to="ghost@bounce.example", subject="Your invoice"))
        await q.enqueue(SendEmail(to="old@bounce.example", subject="Newsletter <b>weekly</b>"))
        ids["suspended"] = await q.enqueue(Approve(order=1042))
        worker = vr.Worker(q, handle_signals=False, check_eviction_policy=False)
        worker.register(SendEmailJob, ApproveJob)
        await asyncio.wait_for(worker.run(until_idle=True), 60)
        ids["running"] = await q.enqueue(SendEmail(to="slow@mail.example", subject="Report"))
        # A job held by a worker that is not there (a claim with no run behind
        # it), so the overview shows one running job and its lease owner.
        await hold(q, 1, "web-1:4242:a1b2")
        for i in range(40):
            await q.enqueue(SendEmail(to=f"later{i}@mail.example", subject="Digest"))
        ids["pending"] = await q.enqueue(SendEmail(to="vip@mail.example", subject="Hi"), priority="high")
        await q.enqueue(SendEmail(to="tomorrow@mail.example", subject="Reminder"), delay=86_400)
        ids["cancelled"] = await q.enqueue(SendEmail(to="oops@mail.example", subject="Sent twice"))
        await q.cancel(ids["cancelled"])
        # What the queue page shows beside its jobs: a schedule, a limit, the live feed.
        digest = SendEmail(to="all@mail.example", subject="Digest")
        await q.schedule("weekly-digest", digest, cron="0 8 * * 1")
        await q.set_limit(SendEmail.KIND, concurrency=4, rate=vr.Rate(100, 60))
        # A per-key limit, one run per tenant at a time: two tenants running,
        # the rest of their jobs waiting their turn (the limits table's keys).
        await q.set_limit(SyncAccount.KIND, concurrency=1, per_key=True)
        for tenant, jobs in (("acme", 4), ("globex", 2), ("initech", 1)):
            for _ in range(jobs):
                await q.enqueue(SyncAccount(tenant=tenant))
        await hold(q, 2, "web-2:4243:c3d4")
        await q.set_events(True)
        return ids
    finally:
        await client.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the dashboard did not answer at {url}")


@contextmanager
def redis_server() -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="venturi-shots-") as d:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", d],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def dashboard(redis_url: str, *extra: str) -> Iterator[str]:
    """``venturi dashboard`` as a user runs it; yields its base URL."""
    port = free_port()
    venturi = shutil.which("venturi", path=str(Path(sys.executable).parent))
    cmd = [venturi] if venturi else [sys.executable, "-m", "venturi_redis.cli"]
    proc = subprocess.Popen([*cmd, "dashboard", "--redis", redis_url, "--port", str(port), *extra])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/static/dashboard.css", proc)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def walk(base: str, out_dir: Path, dead_id: str) -> list[Path]:
    """Overview -> the queue -> its dead jobs -> a dead job -> retry; a screenshot at each step."""
    from playwright.sync_api import expect, sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="venturi-chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 720},
        )
        try:
            page = browser.new_page()
            # A CSP violation or a script error is a bug: collect them all.
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def shot(name: str) -> None:
                path = out_dir / f"dashboard-{name}.png"
                page.screenshot(path=str(path), full_page=True)
                shots.append(path)

            page.goto(base + "/")
            expect(page.locator(f'tr[data-queue="{QUEUE}"]')).to_be_visible()
            page.wait_for_function("window.htmx !== undefined")
            shot("overview")
            page.locator(f'tr[data-queue="{QUEUE}"] a', has_text=QUEUE).first.click()
            page.locator("nav.states a", has_text="dead").click()
            expect(page.locator(f'tr[data-job="{dead_id}"]')).to_be_visible()
            # The filtered list under its own heading, on the first screen (not below the feed).
            expect(page.locator("#jobs-heading")).to_have_text("Dead jobs")
            expect(page.locator("#jobs-heading")).to_be_in_viewport()
            shot("queue-dead")
            page.locator(f'tr[data-job="{dead_id}"] a').first.click()
            expect(page.locator("#job-state")).to_have_text("dead")
            shot("job-dead")
            # A second tab follows the queue's live feed (static/live.js, server-sent events).
            feed = browser.new_page()
            feed.on("pageerror", lambda e: errors.append(str(e)))
            feed.goto(f"{base}/queues/{QUEUE}")
            expect(feed.locator("#events-status")).to_contain_text("Following")
            page.get_by_role("button", name="retry").click()
            expect(page.locator("#job-state")).to_have_text("pending")
            expect(page.locator(".flash")).to_contain_text("moved back to pending")
            shot("job-retried")
            # Retried again, as a script would (JSON): refused with 409 and the reason, not a 200.
            token = page.locator("input[name=csrf_token]").first.get_attribute("value") or ""
            again = page.request.post(
                f"{base}/queues/{QUEUE}/jobs/{dead_id}/retry",
                headers={"Accept": "application/json", "X-CSRF-Token": token},
            )
            assert again.status == 409, again.status
            assert again.json()["error"] == "Nothing done: the job is not dead.", again.json()
            # The retry shows in the other tab's feed, linking to the job.
            expect(feed.locator('ol.feed li[data-event="retried"] a.id')).to_have_text(dead_id)
            feed.screenshot(path=str(out_dir / "dashboard-queue-live.png"), full_page=True)
            shots.append(out_dir / "dashboard-queue-live.png")
            feed.close()
        finally:
            browser.close()
    if errors:
        raise AssertionError(f"the browser reported errors: {errors}")
    return shots


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    with redis_server() as url:
        ids = asyncio.run(populate(url))
        with dashboard(url) as base:
            for path in walk(base, out_dir, ids["dead"]):
                print(path)


if __name__ == "__main__":
    main()
