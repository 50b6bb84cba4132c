"""Security promises that a mutation campaign found no test defending (docs/dashboard.md,
"Security"; docs/guarantees.md, "Sensitive fields stay out of what operators read").

Each test here failed with its mutant applied: a dropped CSRF check, a secret let
through, a guard loosened.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import pydantic
import pytest
from pydantic import Field

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo
from venturi_redis._model.redact import document_secrets
from venturi_redis._transport.sentinel import SentinelURL
from venturi_redis._transport.urls import redact_url
from venturi_redis.dashboard import create_app
from venturi_redis.dashboard._security import Keys, safe_next

pytestmark = pytest.mark.anyio

CARD = "4242424242424242"


class PinCarry(pydantic.BaseModel):
    pin: str = Field("", json_schema_extra={"sensitive": True})


class Charge(vr.Task):
    KIND: ClassVar[str] = "sec-charge"
    card: str = Field(json_schema_extra={"sensitive": True})


class ChargeJob(Charge, vr.Handler[PinCarry]):
    async def handle(self, ctx: vr.Context[PinCarry], state: Any) -> vr.Outcome:
        ctx.carry = PinCarry(pin="9876-secret")
        raise ValueError(f"card {self.card} declined (pin {ctx.carry.pin})")


async def test_a_failed_runs_log_line_masks_the_secrets_even_at_debug(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG the failed-run WARNING carries the run's traceback: scrubbed as the note is."""
    caplog.set_level(logging.DEBUG, logger="venturi_redis.worker")
    job_id = await queue.enqueue(Charge(card=CARD), max_failures=1)
    await drain(queue, ChargeJob)
    assert (await queue.get(job_id)).note == "card *** declined (pin ***)"  # type: ignore[union-attr]
    (line,) = [r for r in caplog.records if "failed:" in r.getMessage() and job_id in r.getMessage()]
    text = logging.Formatter().format(line)
    assert "card *** declined (pin ***)" in text and "Traceback" in text
    assert CARD not in text and "9876-secret" not in text


@contextlib.asynccontextmanager
async def paused_queue(redis_server: RedisServer) -> AsyncIterator[vr.Queue]:
    """A queue of its own namespace, paused, holding one dead job and one schedule."""
    client = vr.Client.from_url(redis_server.url, namespace=f"s{uuid.uuid4().hex[:10]}")
    try:
        queue = client.queue("mail")
        await queue.enqueue(Doomed())
        await drain(queue, DoomedJob)
        await queue.schedule("hourly", Echo(text="tick"), cron="0 * * * *")
        await queue.pause()
        yield queue
    finally:
        await client.aclose()


def http(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


async def state_of(queue: vr.Queue) -> tuple[Any, ...]:
    stats = await queue.stats()
    schedule = await queue.get_schedule("hourly")
    return stats.paused, stats.dead, stats.pending, schedule.paused if schedule else None


async def test_every_post_action_without_the_csrf_token_is_refused_and_changes_nothing(
    redis_server: RedisServer,
) -> None:
    """Each action route, resume and the schedule's three included: CSRF on every POST."""
    async with paused_queue(redis_server) as queue:
        (dead,) = [j.id for j in await queue.list_jobs(state=vr.JobState.DEAD)]
        app = create_app(queue.client)
        fill = {"queue": "mail", "job_id": dead, "schedule_id": "hourly"}
        before = await state_of(queue)
        async with http(app) as h:
            await h.get("/")  # a session cookie, as a browser would hold
            for route in app.routes:
                if "POST" not in (getattr(route, "methods", None) or ()) or route.path == "/login":  # type: ignore[attr-defined]
                    continue
                path: str = route.path  # type: ignore[attr-defined]
                for action in ("pause", "resume", "trigger") if "{action}" in path else ("",):
                    r = await h.post(path.format(**fill, action=action), data={"csrf_token": ""})
                    assert r.status_code == 403 and "CSRF" in r.text, path
        assert await state_of(queue) == before


async def test_the_login_form_without_its_csrf_token_logs_no_one_in(redis_server: RedisServer) -> None:
    """A page elsewhere cannot post the operator's token into their browser's session (login CSRF)."""
    async with paused_queue(redis_server) as queue, http(create_app(queue.client, token="s3cret")) as h:
        r = await h.post("/login", data={"token": "s3cret", "next": "/"})
        assert r.status_code == 403 and "venturi_auth" not in r.headers.get("set-cookie", "")
        assert (await h.get("/queues/mail")).status_code == 303  # still sent to the login form


async def test_an_action_on_a_malformed_job_id_is_a_404_before_anything_is_read(
    redis_server: RedisServer,
) -> None:
    """A job id from the URL reaches no key unless it is one (a brace would leave the queue's hash tag)."""
    async with paused_queue(redis_server) as queue, http(create_app(queue.client)) as h:
        page = await h.get("/queues/mail")
        csrf = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
        assert csrf is not None
        for action in ("retry", "cancel"):
            r = await h.post(f"/queues/mail/jobs/x%7D%7Bother/{action}", data={"csrf_token": csrf.group(1)})
            assert r.status_code == 404 and "not a job id" in r.text, action


async def test_a_login_cookie_is_worthless_on_another_session_and_a_token_prefix_logs_no_one_in(
    redis_server: RedisServer,
) -> None:
    async with paused_queue(redis_server) as queue:
        app = create_app(queue.client, token="s3cret")
        async with http(app) as h:
            login = re.search(r'name="csrf_token" value="([0-9a-f]+)"', (await h.get("/login")).text)
            assert login is not None
            for wrong in ("", "s3c", "s3cret-and-more"):
                r = await h.post("/login", data={"csrf_token": login.group(1), "token": wrong, "next": "/"})
                assert r.status_code == 401, wrong
            r = await h.post("/login", data={"csrf_token": login.group(1), "token": "s3cret", "next": "/"})
            auth = r.cookies["venturi_auth"]
            assert (await h.get("/queues/mail")).status_code == 200
        async with http(app) as other:  # another browser, holding the stolen login cookie only
            other.cookies.set("venturi_auth", auth)
            assert (await other.get("/queues/mail")).status_code == 303


def test_without_a_token_two_dashboards_sign_one_session_differently() -> None:
    """The CSRF key is random per app when no token derives it: no one can compute a form's token."""
    session = "a" * 32
    assert Keys.make(None).csrf(session) != Keys.make(None).csrf(session)
    assert Keys.make("tok").csrf(session) == Keys.make("tok").csrf(session)  # shared by a token's processes


def test_next_never_leaves_the_dashboard() -> None:
    for target in ("//evil.example", "/\\\\evil.example", "https://evil.example", "\\\\evil", ""):
        assert safe_next(target) == "/", target
    assert safe_next("/queues/mail?state=dead") == "/queues/mail?state=dead"


async def test_a_csrf_token_lifted_from_one_browser_is_refused_in_another_of_the_same_app(
    redis_server: RedisServer,
) -> None:
    """The token signs the session: the same app, another session, refused."""
    async with paused_queue(redis_server) as queue:
        app = create_app(queue.client)
        async with http(app) as h:
            lifted = re.search(r'name="csrf_token" value="([0-9a-f]+)"', (await h.get("/queues/mail")).text)
            assert lifted is not None
        async with http(app) as other:
            r = await other.post("/queues/mail/resume", data={"csrf_token": lifted.group(1)})
            assert r.status_code == 403
        assert (await queue.stats()).paused


async def test_the_json_listing_masks_payloads_as_the_job_page_does(redis_server: RedisServer) -> None:
    async with paused_queue(redis_server) as queue, http(create_app(queue.client)) as h:
        await queue.enqueue(Charge(card=CARD))
        listing = await h.get("/api/queues/mail/jobs", params={"kind": "sec-charge"})
        (job,) = listing.json()["jobs"]
        assert job["payload"] == {"card": "***"} and CARD not in listing.text


async def test_the_journal_masks_its_attachments_as_the_job_does(redis_server: RedisServer) -> None:
    """The dead run's journal entry holds the attachment too: masked there, not only on the job."""
    async with paused_queue(redis_server) as queue, http(create_app(queue.client)) as h:
        (dead,) = [j.id for j in await queue.list_jobs(state=vr.JobState.DEAD)]
        doc = (await h.get(f"/api/queues/mail/jobs/{dead}")).json()
    attached = [e["attachment"] for e in doc["journal"] if e["attachment"] is not None]
    assert attached == [{"status": "***"}] and doc["job"]["attachment"] == {"status": "***"}


class VaultCarry(pydantic.BaseModel):
    pin: str = Field("", json_schema_extra={"sensitive": True})


class VaultCarryV2(pydantic.BaseModel):
    """``pin`` renamed ``code``: an old job's carry holds a key this model no longer declares."""

    code: str = Field("", json_schema_extra={"sensitive": True})


class Vault(vr.Task[VaultCarry]):
    KIND: ClassVar[str] = "sec-vault"
    card: str = Field(json_schema_extra={"sensitive": True})


class VaultJob(Vault, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[VaultCarry], state: Any) -> vr.Outcome:
        ctx.carry = VaultCarry(pin="9876-secret")
        ctx.set_attachment({"card": self.card, "tries": 1})
        return vr.Outcome.completed(result={"card": self.card, "ok": True})


class VaultV2(vr.Task[VaultCarryV2]):
    KIND: ClassVar[str] = "sec-vault"
    card: str = Field(json_schema_extra={"sensitive": True})


async def test_shown_payloads_still_mask_the_tasks_sensitive_fields_everywhere_they_are_stored(
    queue: vr.Queue,
) -> None:
    """With show_payloads, the result, the attachment (the job's and the journal's) mask the
    task's sensitive fields, and the carry a key its model no longer declares."""
    job_id = await queue.enqueue(Vault(card=CARD))
    await drain(queue, VaultJob)
    async with http(create_app(queue.client, show_payloads=True, tasks=[VaultV2])) as h:
        doc = (await h.get(f"/api/queues/{queue.name}/jobs/{job_id}")).json()
        page = await h.get(f"/queues/{queue.name}/jobs/{job_id}")
    job = doc["job"]
    assert job["result"] == {"card": "***", "ok": True} and job["carry"] == {"pin": "***"}
    assert job["attachment"] == {"card": "***", "tries": 1} == doc["journal"][-1]["attachment"]
    for text in (str(doc), page.text):
        assert CARD not in text and "9876-secret" not in text


async def test_the_500_page_says_nothing_of_the_exception(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error's text can quote a value or a URL's password: it goes to the log only."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"card {CARD} declined")

    async with paused_queue(redis_server) as queue:
        (dead,) = [j.id for j in await queue.list_jobs(state=vr.JobState.DEAD)]
        monkeypatch.setattr(vr.Queue, "get", broken)
        transport = httpx.ASGITransport(app=create_app(queue.client), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
            for path in (f"/queues/mail/jobs/{dead}", f"/api/queues/mail/jobs/{dead}"):
                r = await h.get(path)
                assert r.status_code == 500 and "its log has the details" in r.text, path
                assert CARD not in r.text and "RuntimeError" not in r.text, path


async def test_the_cookies_are_secure_on_https_and_never_readable_by_script(
    redis_server: RedisServer,
) -> None:
    async with paused_queue(redis_server) as queue:
        app = create_app(queue.client, token="s3cret")
        for scheme in ("https", "http"):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://dash") as h:
                form = await h.get("/login")
                login = re.search(r'name="csrf_token" value="([0-9a-f]+)"', form.text)
                assert login is not None
                given = {"csrf_token": login.group(1), "token": "s3cret", "next": "/"}
                r = await h.post("/login", data=given)
                for cookie in (form.headers["set-cookie"], r.headers["set-cookie"]):
                    flags = cookie.split("; ")[1:]
                    assert "HttpOnly" in flags and ("Secure" in flags) == (scheme == "https"), cookie


def test_a_urls_secret_options_are_masked_whatever_their_name_or_case() -> None:
    url = "rediss://h:6379/0?Password=p4ss&sentinel_token=t0k&client_secret=s3c&ssl_auth=a&db=2"
    shown = redact_url(url)
    assert shown.endswith("?Password=***&sentinel_token=***&client_secret=***&ssl_auth=***&db=2"), shown


class Pinned(vr.Task):
    KIND: ClassVar[str] = "sec-pinned"
    pin: str

    @classmethod
    def sensitive_fields(cls) -> frozenset[str]:
        return frozenset({"pin"})  # a hook, no field marked


def test_an_old_documents_secrets_follow_the_models_hook() -> None:
    """The note about a payload that no longer validates masks what the hook names too."""
    assert document_secrets(Pinned, {"pin": "123456", "other": "shown"}) == ["123456"]


class Refused(vr.Task[PinCarry]):
    KIND: ClassVar[str] = "sec-refused"
    card: str = Field(json_schema_extra={"sensitive": True})


class RefusedJob(Refused, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[PinCarry], state: Any) -> vr.Outcome:
        ctx.carry = PinCarry(pin="9876-secret")
        raise vr.TaskError.permanent(f"card {self.card} refused (pin {ctx.carry.pin})")


async def test_a_task_errors_note_and_traceback_mask_the_task_and_carry_secrets(queue: vr.Queue) -> None:
    """The TaskError path scrubs as a plain exception's does: the carry's values, the traceback."""
    job_id = await queue.enqueue(Refused(card=CARD))
    await drain(queue, RefusedJob)
    info = await queue.get(job_id)
    assert info is not None and info.note == "card *** refused (pin ***)"
    stored = str([info.note, [(e.note, e.details) for e in await queue.journal(job_id)]])
    assert CARD not in stored and "9876-secret" not in stored


async def test_a_queues_repr_and_a_bad_sentinel_urls_error_hide_the_password() -> None:
    client = vr.Client.from_url("redis://:hunter22@localhost:1/0")
    try:
        assert "hunter22" not in repr(client.queue("mail"))
    finally:
        await client.aclose()
    with pytest.raises(vr.ConfigurationError) as raised:
        SentinelURL("redis+sentinel://:hunter22@h:26379/mymaster?socket_timeout=soon")
    assert "hunter22" not in str(raised.value) and "socket_timeout" in str(raised.value)
