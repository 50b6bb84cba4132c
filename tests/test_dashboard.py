"""The web dashboard over HTTP (httpx's ASGI transport) against a real Redis holding jobs in every state.

Each test's client has a namespace of its own, so the overview (which lists
the queues of its namespace's registry) shows only that test's queues.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest
from pydantic import BaseModel, Field

import venturi_redis as vr
import venturi_redis.dashboard
from tests.helpers import claim_raw, drain, run_until_event
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

XSS = "<script>alert(1)</script>"


class Login(vr.Task):
    """A task with a field declared sensitive (masked even when payloads are shown)."""

    KIND: ClassVar[str] = "login"
    user: str
    password: str = Field(json_schema_extra={"sensitive": True})

    def dedup_key(self) -> str | None:
        return f"{self.user}-login"


class Asks(vr.Task):
    KIND: ClassVar[str] = "asks"


class AsksJob(Asks, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.suspend(output={"q": "approve?"})


class VaultCarry(BaseModel):
    step: int = 0
    token: str = Field(default="", json_schema_extra={"sensitive": True})
    password: str = ""  # the task's sensitive field's name: masked in the carry too


class Vault(vr.Task[VaultCarry]):
    KIND: ClassVar[str] = "vault"
    password: str = Field(json_schema_extra={"sensitive": True})


class VaultJob(Vault, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[VaultCarry], state: Any) -> vr.Outcome:
        ctx.carry = VaultCarry(step=2, token="tok-s3cret", password=self.password)
        return vr.Outcome.suspend(output={"q": "go on?"})


class Hostile(vr.Task):
    KIND: ClassVar[str] = "hostile"
    text: str


class HostileJob(Hostile, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise vr.TaskError.permanent(f"bad input {self.text}")


@dataclass
class World:
    client: vr.Client
    queue: vr.Queue
    ids: dict[str, str]


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    async with world_on(redis_server) as w:
        yield w


@contextlib.asynccontextmanager
async def world_on(redis_server: RedisServer) -> AsyncIterator[World]:
    """One queue with a job in every state: pending, delayed, running, suspended,
    completed, dead (one with a hostile note), cancelled (tests/test_dashboard_requirements.py
    adds a waiting one)."""
    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    queue = client.queue("mail")
    ids: dict[str, str] = {}
    ids["completed"] = await queue.enqueue(Echo(text="done"))
    ids["dead"] = await queue.enqueue(Doomed())
    ids["hostile"] = await queue.enqueue(Hostile(text=XSS))
    ids["suspended"] = await queue.enqueue(Asks())
    await drain(queue, EchoJob, DoomedJob, AsksJob, HostileJob)
    ids["running"] = await queue.enqueue(Echo(text="runs"))
    await claim_raw(queue, 1, worker="w-test", lease_ms=60_000)
    ids["pending"] = await queue.enqueue(Login(user="ann", password="hunter22"))
    ids["delayed"] = await queue.enqueue(Echo(text="later"), delay=3600)
    ids["cancelled"] = await queue.enqueue(Echo(text="never"))
    assert await queue.cancel(ids["cancelled"]) == "cancelled"
    try:
        yield World(client, queue, ids)
    finally:
        await client.aclose()


def http(app: Any, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash", headers=headers)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


# -- pages -------------------------------------------------------------------------


async def test_overview_lists_the_queue_with_counts_and_workers(world: World) -> None:
    async with http(create_app(world.client)) as h:
        r = await h.get("/")
        assert r.status_code == 200
        assert 'data-queue="mail"' in r.text
        # running holds w-test's lease; the drained jobs were run by the test worker
        assert "w-test" in r.text
        api = (await h.get("/api/queues")).json()
    (q,) = api["queues"]
    assert q["queue"] == "mail"
    assert (q["eligible"], q["delayed"], q["running"], q["suspended"]) == (1, 1, 1, 1)
    assert (q["completed"], q["dead"], q["cancelled"]) == (1, 2, 1)
    assert sum(q["throughput_per_minute"]["completed"]) == 1
    assert sum(q["throughput_per_minute"]["dead"]) == 2
    assert len(q["throughput_per_minute"]["completed"]) == 60
    assert "w-test" in q["workers"] and len(q["workers"]) == 2


async def test_queue_page_filters_by_state_and_kind(world: World) -> None:
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail")
        assert page.status_code == 200
        for job_id in world.ids.values():
            assert f'data-job="{job_id}"' in page.text
        dead = (await h.get("/api/queues/mail/jobs", params={"state": "dead"})).json()
        assert {j["id"] for j in dead["jobs"]} == {world.ids["dead"], world.ids["hostile"]}
        assert dead["next_cursor"] is None
        echo = (await h.get("/api/queues/mail/jobs", params={"kind": "echo"})).json()
        assert {j["id"] for j in echo["jobs"]} == {
            world.ids[s] for s in ("completed", "running", "delayed", "cancelled")
        }
        assert all(j["kind"] == "echo" for j in echo["jobs"])
        html = await h.get("/queues/mail", params={"state": "dead", "kind": "doomed"})
        assert f'data-job="{world.ids["dead"]}"' in html.text
        assert world.ids["hostile"] not in html.text
        assert (await h.get("/queues/mail", params={"state": "zombie"})).status_code == 400


async def test_search_by_job_id_and_dedup_key(world: World) -> None:
    async with http(create_app(world.client)) as h:
        by_id = (await h.get("/api/queues/mail/jobs", params={"q": world.ids["dead"]})).json()
        assert by_id["found"] == [world.ids["dead"]]
        by_key = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login"})).json()
        assert by_key["found"] == [world.ids["pending"]]
        by_kind = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login", "kind": "login"})).json()
        assert by_kind["found"] == [world.ids["pending"]]
        page = await h.get("/queues/mail", params={"q": "no-such-thing"})
        assert page.status_code == 200 and "No job with that id" in page.text


async def test_job_page_shows_fields_and_journal_timeline(world: World) -> None:
    async with http(create_app(world.client, show_payloads=True)) as h:
        r = await h.get(f"/queues/mail/jobs/{world.ids['dead']}")
        assert r.status_code == 200
        assert "resource gone" in r.text and "410" in r.text  # note, attachment
        for event in ("enqueued", "claimed", "dead"):
            assert f'class="event {event}"' in r.text
        # The death's exception type among the details, its traceback folded under them.
        assert "error_type=venturi_redis.TaskError" in r.text
        assert '<details class="traceback"><summary>traceback</summary><pre>Traceback (most recent' in r.text
        doc = (await h.get(f"/api/queues/mail/jobs/{world.ids['dead']}")).json()
    assert doc["job"]["state"] == "dead"
    assert doc["job"]["attachment"] == {"status": 410}
    assert [e["event"] for e in doc["journal"]][:2] == ["enqueued", "claimed"]
    assert doc["journal"][1]["details"]["worker"]


async def test_job_page_lists_a_batch_jobs_batch_mates(redis_server: RedisServer) -> None:
    from tests.test_batch_handlers import Mail, SendMails

    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    try:
        queue = client.queue("mail")
        ids = await queue.enqueue_many([Mail(to=f"u{i}") for i in range(3)])
        alone = await queue.enqueue(Echo(text="alone"))
        await drain(queue, SendMails, EchoJob, state={})
        async with http(create_app(client)) as h:
            docs = [(await h.get(f"/api/queues/mail/jobs/{i}")).json()["job"] for i in ids]
            page = await h.get(f"/queues/mail/jobs/{ids[2]}")
            lone = (await h.get(f"/api/queues/mail/jobs/{alone}")).json()["job"]
    finally:
        await client.aclose()
    for job_id, doc in zip(ids, docs, strict=True):
        assert doc["batch"]["size"] == 3 and doc["batch"]["lead"] == docs[0]["batch"]["lead"]
        assert sorted(doc["batch"]["mates"]) == sorted(set(ids) - {job_id})
    assert 'id="job-batch"' in page.text and f'/queues/mail/jobs/{ids[0]}"' in page.text
    assert lone["batch"] is None


async def test_payloads_masked_by_default_and_sensitive_fields_always(world: World) -> None:
    pending = world.ids["pending"]
    async with http(create_app(world.client)) as h:
        masked = (await h.get(f"/api/queues/mail/jobs/{pending}")).json()["job"]["payload"]
        page = await h.get(f"/queues/mail/jobs/{pending}")
    assert masked == {"user": "***", "password": "***"}
    assert "hunter22" not in page.text and "ann" not in page.text.replace("ann-login", "")
    async with http(create_app(world.client, show_payloads=True, tasks=[Login])) as h:
        shown = (await h.get(f"/api/queues/mail/jobs/{pending}")).json()["job"]["payload"]
        page = await h.get(f"/queues/mail/jobs/{pending}")
    assert shown == {"user": "ann", "password": "***"}
    assert "hunter22" not in page.text


async def test_a_carrys_sensitive_fields_stay_masked_when_values_are_shown(redis_server: RedisServer) -> None:
    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    try:
        queue = client.queue("vault")
        job_id = await queue.enqueue(Vault(password="pw-hunter2"))
        await drain(queue, VaultJob)
        async with http(create_app(client, show_payloads=True, tasks=[Vault])) as h:
            job = (await h.get(f"/api/queues/vault/jobs/{job_id}")).json()["job"]
            page = await h.get(f"/queues/vault/jobs/{job_id}")
        async with http(create_app(client)) as h:
            default = (await h.get(f"/api/queues/vault/jobs/{job_id}")).json()["job"]
    finally:
        await client.aclose()
    assert job["state"] == "suspended"
    assert job["carry"] == {"step": 2, "token": "***", "password": "***"}
    assert job["payload"] == {"password": "***"}
    assert "tok-s3cret" not in page.text and "pw-hunter2" not in page.text
    # By default every value is masked, the carry's as the payload's.
    assert default["carry"] == {"step": "***", "token": "***", "password": "***"}


async def test_hostile_text_is_escaped(world: World) -> None:
    async with http(create_app(world.client, show_payloads=True)) as h:
        job = await h.get(f"/queues/mail/jobs/{world.ids['hostile']}")
        listing = await h.get("/queues/mail", params={"state": "dead"})
    for r in (job, listing):
        assert XSS not in r.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text


async def test_unknown_queue_missing_job_and_malformed_id_are_404_pages(world: World) -> None:
    async with http(create_app(world.client)) as h:
        for path in (
            "/queues/nope",
            "/queues/bad%7Bname",
            "/queues/mail/jobs/01J9ZQ4K8V3M0S5B2N7XWYQ1RT",
            "/queues/mail/jobs/not-an-id!",
        ):
            r = await h.get(path)
            assert r.status_code == 404, path
            assert "Traceback" not in r.text and 'class="error"' in r.text
        api = await h.get("/api/queues/mail/jobs/01J9ZQ4K8V3M0S5B2N7XWYQ1RT")
        assert api.status_code == 404 and "error" in api.json()
        assert (await h.get("/queues/mail", params={"cursor": "garbage"})).status_code == 400


async def test_corrupt_hash_shows_an_error_row_not_a_traceback(world: World) -> None:
    redis, k = world.client.redis, world.queue.keys
    bad = world.ids["completed"]
    await redis.hset(k.job(bad), mapping={"state": "zombie", "failures": "xyz", "payload": b"\xc1"})
    wrong_type = "01J9ZQ4K8V3M0S5B2N7XWYQ1RT"
    await redis.zadd(k.dead, {wrong_type: 1})
    await redis.set(k.job(wrong_type), "not a hash")
    async with http(create_app(world.client)) as h:
        listing = await h.get("/queues/mail")
        assert listing.status_code == 200
        assert f'<tr class="corrupt" data-job="{bad}">' in listing.text
        assert f'<tr class="corrupt" data-job="{wrong_type}">' in listing.text
        assert "failures=xyz" in listing.text
        job = await h.get(f"/queues/mail/jobs/{bad}")
        assert job.status_code == 200 and "Corrupt fields" in job.text
        broken = await h.get(f"/queues/mail/jobs/{wrong_type}")
        assert broken.status_code == 404 and "is corrupt" in broken.text and "Traceback" not in broken.text


async def test_a_queue_with_a_wrong_type_key_is_named_and_the_others_still_shown(world: World) -> None:
    # A key written by hand with the wrong type makes that queue's stats fail
    # with WRONGTYPE; the overview names it and still shows every other queue.
    broken = world.client.queue("broken")
    await broken.enqueue(Echo(text="x"))
    await world.client.redis.set(broken.keys.pending_high_first[-1], "not a zset")
    async with http(create_app(world.client)) as h:
        page = await h.get("/")
        api = (await h.get("/api/queues")).json()
    assert page.status_code == 200
    assert 'data-queue="mail"' in page.text and 'data-unreadable="broken"' in page.text
    assert [q["queue"] for q in api["queues"]] == ["mail"]
    ((unreadable),) = api["unreadable"]
    assert unreadable["queue"] == "broken" and "WRONGTYPE" in unreadable["error"]


async def test_mounted_under_a_path(world: World) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/ops/venturi", app=create_app(world.client))])
    async with http(outer) as h:
        r = await h.get("/ops/venturi/")
        assert r.status_code == 200
        assert 'href="/ops/venturi/queues/mail"' in r.text
        assert 'src="/ops/venturi/static/htmx.min.js"' in r.text
        assert "/ops/venturi" in r.headers["set-cookie"]
        js = await h.get("/ops/venturi/static/htmx.min.js")
        assert js.status_code == 200 and "htmx" in js.text[:200]
        page = await h.get("/ops/venturi/queues/mail")
        assert 'href="/ops/venturi/queues/mail/schedules"' in page.text
        token = csrf_of(page.text)
        done = await h.post("/ops/venturi/queues/mail/pause", data={"csrf_token": token})
        assert done.status_code == 303 and done.headers["location"].startswith("/ops/venturi/queues/mail")
    assert (await world.queue.stats()).paused


# -- actions -------------------------------------------------------------------------


async def test_retry_cancel_pause_resume_and_dead_retry(world: World) -> None:
    q, ids = world.queue, world.ids
    async with http(create_app(world.client)) as h:
        token = csrf_of((await h.get("/queues/mail")).text)
        r = await h.post(f"/queues/mail/jobs/{ids['dead']}/retry", data={"csrf_token": token})
        assert r.status_code == 303
        follow = await h.get(r.headers["location"])
        assert "Job moved back to pending." in follow.text and 'id="job-state">pending<' in follow.text
        r = await h.post(f"/queues/mail/jobs/{ids['delayed']}/cancel", data={"csrf_token": token})
        assert r.status_code == 303
        assert (await q.get(ids["delayed"])).state == vr.JobState.CANCELLED  # type: ignore[union-attr]
        await h.post("/queues/mail/pause", data={"csrf_token": token})
        assert (await q.stats()).paused
        await h.post("/queues/mail/resume", data={"csrf_token": token})
        assert not (await q.stats()).paused
        r = await h.post(
            "/queues/mail/dead/retry", data={"csrf_token": token}, headers={"accept": "application/json"}
        )
        assert r.json() == {"done": "dead-retried", "moved": [ids["hostile"]]}
        again = await h.post(
            f"/queues/mail/jobs/{ids['hostile']}/retry",
            data={"csrf_token": token},
            headers={"accept": "application/json"},
        )
        # Refused (the job is not dead any more): 409 with the reason, never a 200 (issue 39).
        assert again.status_code == 409
        assert again.json() == {
            "done": "not-dead",
            "job_id": ids["hostile"],
            "error": "Nothing done: the job is not dead.",
        }
        # No such job: 404, as cancel answers, not "not dead".
        for action in ("retry", "cancel"):
            missing = await h.post(
                f"/queues/mail/jobs/01JNOSUCHJOB0000000000000/{action}",
                data={"csrf_token": token},
                headers={"accept": "application/json"},
            )
            assert (missing.status_code, missing.json()["done"]) == (404, "not_found"), action
            assert missing.json()["error"] == "Nothing done: no such job."
        gone = await h.post(
            f"/queues/mail/jobs/{ids['delayed']}/cancel",
            data={"csrf_token": token},
            headers={"accept": "application/json"},
        )
        assert (gone.status_code, gone.json()["done"]) == (409, "finished")  # cancelled above
        none = await h.post(
            "/queues/mail/schedules/nope/trigger",
            data={"csrf_token": token},
            headers={"accept": "application/json"},
        )
        assert (none.status_code, none.json()["error"]) == (404, "Nothing done: no such schedule.")
    assert (await q.stats()).dead == 0


async def test_actions_on_a_corrupt_job_answer_400_naming_it_and_write_nothing(world: World) -> None:
    """Issue 26: a job whose journal was overwritten (SET journal:<id> x) is refused by
    retry and cancel with the job named (400, nothing written); the dead retry of the
    queue moves the healthy dead job and leaves it; pause and resume are unaffected."""
    q, ids, r = world.queue, world.ids, world.client.redis
    for name in ("dead", "delayed"):
        await r.delete(q.keys.journal(ids[name]))
        await r.set(q.keys.journal(ids[name]), "x")
    json = {"accept": "application/json"}
    async with http(create_app(world.client)) as h:
        token = csrf_of((await h.get("/queues/mail")).text)
        for name, action in (("dead", "retry"), ("delayed", "cancel")):
            path = f"/queues/mail/jobs/{ids[name]}/{action}"
            got = await h.post(path, data={"csrf_token": token}, headers=json)
            assert got.status_code == 400
            said = f"job {ids[name]}: journal key is not a stream; nothing was written"
            assert got.json()["error"].startswith(said)
        assert (await h.post("/queues/mail/pause", data={"csrf_token": token})).status_code == 303
        assert (await h.post("/queues/mail/resume", data={"csrf_token": token})).status_code == 303
        got = await h.post("/queues/mail/dead/retry", data={"csrf_token": token}, headers=json)
        assert got.json() == {"done": "dead-retried", "moved": [ids["hostile"]]}
    assert [m.decode() for m in await r.zrange(q.keys.dead, 0, -1)] == [ids["dead"]]
    assert await r.hget(q.keys.job(ids["dead"]), "state") == b"dead"
    assert await r.hget(q.keys.job(ids["delayed"]), "state") == b"pending"
    assert await r.zscore(q.keys.pending(vr.Priority.NORMAL), ids["delayed"]) is not None


async def test_dead_retry_of_one_kind(world: World) -> None:
    async with http(create_app(world.client)) as h:
        token = csrf_of((await h.get("/queues/mail")).text)
        r = await h.post(
            "/queues/mail/dead/retry",
            data={"csrf_token": token, "kind": "doomed"},
            headers={"accept": "application/json"},
        )
    assert r.json()["moved"] == [world.ids["dead"]]
    assert (await world.queue.get(world.ids["hostile"])).state == vr.JobState.DEAD  # type: ignore[union-attr]


async def _snapshot(world: World) -> tuple[Any, ...]:
    st = await world.queue.stats()
    states = [(await world.queue.get(j)).state for j in world.ids.values()]  # type: ignore[union-attr]
    return st.paused, st.dead, st.cancelled, tuple(states)


async def test_csrf_refusals_change_nothing(world: World) -> None:
    before = await _snapshot(world)
    ids = world.ids
    posts = [
        f"/queues/mail/jobs/{ids['dead']}/retry",
        f"/queues/mail/jobs/{ids['pending']}/cancel",
        "/queues/mail/pause",
        "/queues/mail/dead/retry",
    ]
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail")
        good = csrf_of(page.text)
        for path in posts:
            for data in ({}, {"csrf_token": "0" * 64}, {"csrf_token": good[:-1]}):
                r = await h.post(path, data=data)
                assert r.status_code == 403, (path, data)
                assert "CSRF" in r.text
    # another browser (no session cookie) with a token lifted from this one's page
    async with http(create_app(world.client)) as other:
        r = await other.post("/queues/mail/pause", data={"csrf_token": good})
        assert r.status_code == 403
    # a GET never acts
    async with http(create_app(world.client)) as h:
        assert (await h.get("/queues/mail/pause")).status_code in (404, 405)
    assert await _snapshot(world) == before


async def test_read_only_has_no_actions(world: World) -> None:
    before = await _snapshot(world)
    async with http(create_app(world.client, read_only=True)) as h:
        page = await h.get("/queues/mail")
        assert "read-only" in page.text and "pause queue" not in page.text
        job = await h.get(f"/queues/mail/jobs/{world.ids['dead']}")
        assert "/retry" not in job.text
        for path in (f"/queues/mail/jobs/{world.ids['dead']}/retry", "/queues/mail/pause"):
            r = await h.post(path, data={})
            assert r.status_code in (404, 405)
    assert await _snapshot(world) == before


# -- authentication and headers -----------------------------------------------------------


async def test_token_required_bearer_or_login_cookie(world: World) -> None:
    before = await _snapshot(world)
    app = create_app(world.client, token="s3cret-token")
    async with http(app) as h:
        r = await h.get("/queues/mail")
        assert r.status_code == 303 and "/login?next=%2Fqueues%2Fmail" in r.headers["location"]
        assert (await h.get("/api/queues")).status_code == 401
        assert (await h.post("/queues/mail/pause", data={})).status_code == 401
        login = await h.get("/login")
        token = csrf_of(login.text)
        wrong = await h.post("/login", data={"csrf_token": token, "token": "nope", "next": "/"})
        assert wrong.status_code == 401 and "Wrong token" in wrong.text
        assert (await h.get("/")).status_code == 303
        ok = await h.post(
            "/login", data={"csrf_token": token, "token": "s3cret-token", "next": "/queues/mail"}
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/queues/mail"
        assert "SameSite=Strict" in ok.headers["set-cookie"] and "HttpOnly" in ok.headers["set-cookie"]
        assert (await h.get("/queues/mail")).status_code == 200
        # an open redirect through next= is refused
        bad = await h.post("/login", data={"csrf_token": token, "token": "s3cret-token", "next": "//evil"})
        assert bad.headers["location"] == "/"
    assert await _snapshot(world) == before
    async with http(app, authorization="Bearer s3cret-token") as api:
        assert (await api.get("/api/queues")).status_code == 200
        # with the bearer header no CSRF token is needed (a browser never adds it by itself)
        r = await api.post("/queues/mail/pause", headers={"accept": "application/json"})
        assert r.json() == {"done": "paused"}
    async with http(app, authorization="Bearer wrong") as api:
        assert (await api.get("/api/queues")).status_code == 401
        assert (await api.post("/queues/mail/resume")).status_code == 401
    assert (await world.queue.stats()).paused


async def test_security_headers_on_every_response(world: World) -> None:
    async with http(create_app(world.client)) as h:
        for path in ("/", "/queues/mail", "/queues/nope", "/static/htmx.min.js", "/api/queues"):
            r = await h.get(path)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
            assert "unsafe-inline" not in csp
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
        first = await h.get("/")
        assert "<script>" not in first.text  # no inline script: the CSP would block it


# -- pagination -------------------------------------------------------------------------


async def test_cursor_pagination_over_10000_jobs(redis_server: RedisServer) -> None:
    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    try:
        queue = client.queue("big")
        for start in range(0, 10_000, 1000):
            await queue.enqueue_many([Echo(text=str(i)) for i in range(start, start + 1000)])
        await queue.enqueue_many([Echo(text="hi")] * 5, priority="high")
        seen: list[str] = []
        cursor: str | None = ""
        pages = 0
        async with http(create_app(client)) as h:
            while cursor is not None:
                r = await h.get("/api/queues/big/jobs", params={"state": "pending", "cursor": cursor})
                doc = r.json()
                seen += [j["id"] for j in doc["jobs"]]
                cursor = doc["next_cursor"]
                pages += 1
                if pages == 3:
                    # a job claimed between two pages does not shift the next one
                    await claim_raw(queue, 1)
            html = await h.get("/queues/big", params={"state": "pending"})
            assert 'class="next"' in html.text
        # The claim took a high job, already listed: with an offset the next
        # page would have started one job too far and skipped one.
        assert len(seen) == len(set(seen)) == 10_005
        first_high = seen[:5]
        infos = [await queue.get(j) for j in first_high]
        assert all(i is not None and i.priority == vr.Priority.HIGH for i in infos)
    finally:
        await client.aclose()


async def test_cursor_resumes_when_its_job_left(world: World) -> None:
    """The cursor's own job is claimed before the next page: the next page starts right after it."""
    q = world.queue
    extra = [await q.enqueue(Echo(text=str(i))) for i in range(4)]
    from venturi_redis.dashboard import _listing

    first = await _listing.page_jobs(q, state=vr.JobState.PENDING, kind="echo", limit=2)
    assert [j.id for j in first.jobs] == extra[:2]
    await q.cancel(extra[1])  # the cursor's job leaves the pending index
    rest = await _listing.page_jobs(q, state=vr.JobState.PENDING, kind="echo", cursor=first.next_cursor)
    assert [j.id for j in rest.jobs] == [*extra[2:], world.ids["delayed"]]  # eligible later: last
    assert rest.next_cursor is None


async def test_rare_kind_pages_stop_after_a_bounded_scan(world: World) -> None:
    q = world.queue
    await q.enqueue_many([Echo(text=str(i)) for i in range(30)])
    needle = await q.enqueue(Doomed())
    from venturi_redis.dashboard import _listing

    found: list[str] = []
    cursor = None
    rounds = 0
    while True:
        page = await _listing.page_jobs(
            q, state=vr.JobState.PENDING, kind="doomed", cursor=cursor, limit=5, max_scan=10
        )
        assert page.scanned <= 10
        found += [j.id for j in page.jobs]
        rounds += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert found == [needle] and rounds >= 3


async def test_overview_refreshes_after_work(world: World) -> None:
    """The live part: the page polled by htmx reflects new work (no timing asserted)."""
    async with http(create_app(world.client)) as h:
        before = (await h.get("/api/queues")).json()["queues"][0]["completed"]
        job_id = await world.queue.enqueue(Echo(text="more"), priority="critical")
        await run_until_event(world.queue, job_id, "completed", EchoJob, AsksJob, DoomedJob, HostileJob)
        after = (await h.get("/api/queues")).json()["queues"][0]["completed"]
        page = await h.get("/")
        queue_page = await h.get("/queues/mail")
        running = await h.get(f"/queues/mail/jobs/{world.ids['running']}")
        finished = await h.get(f"/queues/mail/jobs/{world.ids['dead']}")
    assert after > before
    assert 'hx-trigger="every 5s"' in page.text and 'hx-select="#queues"' in page.text
    assert 'hx-select="#counts"' in queue_page.text
    # a job page follows the job while it can still change, and stops once it has finished
    assert 'hx-select="#job"' in running.text
    assert 'hx-select="#job"' not in finished.text


def test_layering_producer_never_imports_the_dashboard_nor_it_the_worker() -> None:
    import subprocess
    import sys

    code = (
        "import sys, venturi_redis;"
        "assert 'venturi_redis.dashboard' not in sys.modules, 'producer imported the dashboard';"
        "before = set(sys.modules);"
        "import venturi_redis.dashboard, venturi_redis.dashboard._app;"
        "bad = sorted(m for m in set(sys.modules) - before if m.startswith('venturi_redis._worker'));"
        "assert not bad and 'venturi_redis._worker.worker' not in sys.modules, bad"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    sources = Path(venturi_redis.dashboard.__file__).parent.glob("*.py")
    assert not [p.name for p in sources if "_worker" in p.read_text()]


def test_cli_refuses_a_public_bind_without_a_token() -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    res = CliRunner().invoke(app, ["dashboard", "--host", "0.0.0.0", "--port", "1"], env={})
    assert res.exit_code == 2
    assert "without a token" in res.output


async def test_discovery_keeps_names_for_its_interval(world: World) -> None:
    """The overview reads the registry of queues again only after ``discovery_interval``."""
    async with http(create_app(world.client, discovery_interval=3600)) as h:
        assert [q["queue"] for q in (await h.get("/api/queues")).json()["queues"]] == ["mail"]
        await world.client.queue("other").enqueue(Echo(text="x"))
        cached = (await h.get("/api/queues")).json()["queues"]
        assert [q["queue"] for q in cached] == ["mail"]
    async with http(create_app(world.client, discovery_interval=0)) as h:
        fresh = (await h.get("/api/queues")).json()["queues"]
        assert [q["queue"] for q in fresh] == ["mail", "other"]


async def test_stale_queue_names_are_found_again_in_the_background(world: World) -> None:
    async with http(create_app(world.client, discovery_interval=1e-6)) as h:
        assert [q["queue"] for q in (await h.get("/api/queues")).json()["queues"]] == ["mail"]
        await world.client.queue("other").enqueue(Echo(text="x"))
        # The request that finds the names stale answers with them and reads them again.
        stale = (await h.get("/api/queues")).json()["queues"]
        assert [q["queue"] for q in stale] == ["mail"]
        with anyio.fail_after(10):
            while len((await h.get("/api/queues")).json()["queues"]) < 2:
                await anyio.sleep(0.01)


def test_cli_serves_with_the_token_from_the_environment(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`venturi dashboard` as run by a user, VENTURI_DASHBOARD_TOKEN set: every request needs it."""
    import importlib.util
    import urllib.error
    import urllib.request

    path = Path(__file__).resolve().parent.parent / "scripts/dashboard_screenshots.py"
    spec = importlib.util.spec_from_file_location("dashboard_screenshots", path)
    assert spec is not None and spec.loader is not None
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    monkeypatch.setenv("VENTURI_DASHBOARD_TOKEN", "from-the-env")
    name = f"feed-{uuid.uuid4().hex[:8]}"

    async def events_on() -> None:
        async with vr.Client.from_url(redis_server.url) as client:
            await client.queue(name).set_events(True)

    anyio.run(events_on)
    bearer = {"Authorization": "Bearer from-the-env"}
    with shots.dashboard(redis_server.url, "--read-only") as base:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/api/queues", timeout=10)
        refused.value.close()
        assert refused.value.code == 401
        ask = urllib.request.Request(base + "/api/queues", headers={"Authorization": "Bearer from-the-env"})
        with urllib.request.urlopen(ask, timeout=10) as ok:
            assert ok.status == 200 and "queues" in ok.read().decode()
        # A tab following a queue's live feed does not hold the stop: leaving this
        # block terminates the dashboard and waits at most 10 s for it to exit.
        feed_url = f"{base}/queues/{name}/events"
        feed = urllib.request.urlopen(urllib.request.Request(feed_url, headers=bearer), timeout=10)
        assert feed.readline() == b"retry: 3000\n"
    feed.close()


# -- schedules, limits, progress, live events (issues 27, 28, 30) -------------------------


class Reports(vr.Task):
    KIND: ClassVar[str] = "reports"


class ReportsJob(Reports, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress({"done": 3, "of": 10, "step": XSS})
        return vr.Outcome.suspend(output={"q": "go on?"})


async def test_schedules_page_json_and_actions(world: World) -> None:
    q = world.queue
    await q.schedule("hourly", Echo(text="tick"), cron="0 * * * *", tz="Europe/Paris")
    await q.schedule("often", Echo(text="tock"), every=90)
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail")
        assert 'href="/queues/mail/schedules" id="schedules-link">schedules (2)<' in page.text
        listing = await h.get("/queues/mail/schedules")
        assert listing.status_code == 200
        assert 'data-schedule="hourly"' in listing.text and "<code>0 * * * *</code>" in listing.text
        assert "Europe/Paris" in listing.text and "every 90 s" in listing.text
        api = (await h.get("/api/queues/mail/schedules")).json()["schedules"]
        assert [(s["id"], s["kind"], s["cron"], s["every"], s["tz"]) for s in api] == [
            ("hourly", "cron", "0 * * * *", None, "Europe/Paris"),
            ("often", "every", None, 90.0, "UTC"),
        ]
        assert api[0]["next_at"] and api[0]["last_job_id"] is None and not api[0]["paused"]
        token = csrf_of(listing.text)
        base = "/queues/mail/schedules/hourly"
        assert (await h.post(base + "/pause", data={})).status_code == 403
        assert not (await q.get_schedule("hourly")).paused  # type: ignore[union-attr]
        r = await h.post(base + "/pause", data={"csrf_token": token})
        assert r.status_code == 303 and r.headers["location"] == "/queues/mail/schedules?done=schedule-paused"
        assert (await q.get_schedule("hourly")).paused  # type: ignore[union-attr]
        paused = await h.get(r.headers["location"])
        assert "Schedule paused" in paused.text and f"{base}/resume" in paused.text
        r = await h.post(base + "/resume", data={"csrf_token": token}, headers={"accept": "application/json"})
        assert r.json() == {"done": "schedule-resumed", "schedule_id": "hourly"}
        assert not (await q.get_schedule("hourly")).paused  # type: ignore[union-attr]
        r = await h.post(base + "/trigger", data={"csrf_token": token})
        assert r.status_code == 303
        job_page = await h.get(r.headers["location"])
        assert "Schedule fired once now" in job_page.text
        job_id = r.headers["location"].split("/jobs/")[1].split("?")[0]
        assert (await q.get(job_id)).schedule_id == "hourly"  # type: ignore[union-attr]
        # The job links back to its schedule, with its fire time.
        assert 'href="/queues/mail/schedules#schedule-hourly">hourly</a>, fire time 20' in job_page.text
        doc = (await h.get(f"/api/queues/mail/jobs/{job_id}")).json()["job"]
        assert doc["schedule_id"] == "hourly" and doc["fire_at"]
        gone = await h.post(
            "/queues/mail/schedules/nope/trigger",
            data={"csrf_token": token},
            headers={"accept": "application/json"},
        )
        assert gone.status_code == 404
        assert gone.json() == {
            "done": "no-schedule",
            "schedule_id": "nope",
            "error": "Nothing done: no such schedule.",
        }
        assert (await h.post(base + "/explode", data={"csrf_token": token})).status_code == 404
        assert (
            await h.post("/queues/mail/schedules/bad%20id/pause", data={"csrf_token": token})
        ).status_code == 404
        fired = (await h.get("/api/queues/mail/schedules")).json()["schedules"][0]
        assert fired["last_job_id"] == job_id and fired["fires"] == 1
        linked = await h.get("/queues/mail/schedules")
        assert f'href="/queues/mail/jobs/{job_id}">{job_id}</a>' in linked.text
    # A queue that holds only a schedule (no job yet) has its pages.
    await world.client.queue("cron-only").schedule("daily", Echo(text="x"), cron="0 3 * * *")
    async with http(create_app(world.client)) as h:
        only = await h.get("/queues/cron-only/schedules")
        empty = await h.get("/queues/cron-only")
    assert only.status_code == 200 and 'data-schedule="daily"' in only.text
    assert empty.status_code == 200 and '<div id="limits"></div>' in empty.text
    async with http(create_app(world.client, read_only=True)) as h:
        ro = await h.get("/queues/mail/schedules")
        assert (
            'data-schedule="hourly"' in ro.text and "/trigger" not in ro.text and "csrf_token" not in ro.text
        )
        assert (await h.post(base + "/trigger", data={"csrf_token": token})).status_code in (404, 405)


async def test_a_schedule_hash_edited_by_hand_is_shown_escaped(world: World) -> None:
    q = world.queue
    await q.schedule("hourly", Echo(text="tick"), cron="0 * * * *")
    await world.client.redis.hset(q.keys.schedule("hourly"), mapping={"cron": XSS, "last_job_id": "x/<y>"})
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail/schedules")
    assert page.status_code == 200 and XSS not in page.text and "<y>" not in page.text
    # Shown as text, and the id that is no job id is not made a link.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "x/&lt;y&gt;" in page.text


async def test_limits_on_the_queue_page_and_limited_in_the_counts(world: World) -> None:
    q = world.queue
    await q.set_limit("login", concurrency=1)
    await q.set_limit("echo", rate=vr.Rate(5, 60), per_key=True)
    await q.enqueue(Login(user="bob", password="pw"))
    # Two eligible login jobs, one slot: the claim takes one and parks the other.
    await claim_raw(q, 2, worker="w-lim", lease_ms=60_000)
    assert (await q.stats()).limited == 1
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail")
        api = (await h.get("/api/queues/mail/limits")).json()
        overview = await h.get("/")
        counts = (await h.get("/api/queues")).json()["queues"][0]
    assert 'data-limit="login"' in page.text and 'data-limit="echo per key"' in page.text
    # The counts' 5 s refresh brings the limits table along (one request).
    assert 'hx-select-oob="#limits,#workers"' in page.text and "5 / 1 min" in page.text
    assert "limited 1" in page.text
    assert api["limited"] == 1
    assert api["limits"] == [
        {
            "kind": "echo",
            "per_key": True,
            "concurrency": None,
            "rate": {"count": 5, "per_seconds": 60.0},
            "running": 0,
            "waiting": 0,
            "keys": [],
            "keys_total": 0,
        },
        {
            "kind": "login",
            "per_key": False,
            "concurrency": 1,
            "rate": None,
            "running": 1,
            "waiting": 1,
            "keys": [],
            "keys_total": 0,
        },
    ]
    row = overview.text.split('data-queue="mail"')[1].split("</tr>")[0]
    assert '<a href="/queues/mail?state=limited">1</a>' in row  # a column of its own
    assert counts["limited"] == 1 and counts["waiting"] == 0


async def test_job_page_shows_progress_escaped(world: World) -> None:
    job_id = await world.queue.enqueue(Reports())
    await run_until_event(world.queue, job_id, "suspended", ReportsJob)
    async with http(create_app(world.client)) as h:
        page = await h.get(f"/queues/mail/jobs/{job_id}")
        doc = (await h.get(f"/api/queues/mail/jobs/{job_id}")).json()["job"]
    assert doc["progress"] == {"done": 3, "of": 10, "step": XSS}
    assert 'id="job-progress"' in page.text and "&#34;of&#34;: 10" in page.text
    assert XSS not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


class Digest(vr.Task):
    KIND: ClassVar[str] = "digest"

    def dedup_key(self) -> str | None:
        return "daily"

    @classmethod
    def dedup_window(cls) -> float:
        return 3600


class DigestJob(Digest, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def test_job_page_shows_a_throttled_keys_window(world: World) -> None:
    job_id = await world.queue.enqueue(Digest())
    await run_until_event(world.queue, job_id, "completed", DigestJob)
    info = await world.queue.get(job_id)
    assert info is not None and info.dedup_until is not None
    async with http(create_app(world.client)) as h:
        page = await h.get(f"/queues/mail/jobs/{job_id}")
        doc = (await h.get(f"/api/queues/mail/jobs/{job_id}")).json()["job"]
        plain = await h.get(f"/queues/mail/jobs/{world.ids['completed']}")
    assert 'id="job-throttle"' in page.text and "dedup key held until" in page.text
    assert doc["dedup_until"]
    assert 'id="job-throttle"' not in plain.text


async def test_live_events_off_shows_how_to_turn_them_on(world: World) -> None:
    await world.queue.set_events(False)
    async with http(create_app(world.client)) as h:
        page = await h.get("/queues/mail")
        feed = await h.get("/queues/mail/events")
    assert 'id="events-off"' in page.text and "<code>venturi queue events mail on</code>" in page.text
    assert "live.js" not in page.text
    assert feed.status_code == 204  # EventSource stops, no reconnect loop
    js = (Path(venturi_redis.dashboard.__file__).parent / "static/live.js").read_text()
    assert "innerHTML" not in js and "textContent" in js  # event text is never parsed as HTML


async def test_live_events_stream_ends_when_the_client_leaves(world: World) -> None:
    """Over real HTTP (uvicorn): one event after an enqueue, then the client closes;
    the server's feed ends and no XREAD stays blocked on Redis."""
    import json
    import socket

    import uvicorn

    from venturi_redis.dashboard import _live

    await world.queue.set_events(True)

    async def blocked() -> int:
        return sum("b" in c["flags"] for c in await world.client.redis.client_list())

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(world.client), log_level="warning", lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        try:
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as h:
                page = await h.get("/queues/mail")
                assert 'data-src="/queues/mail/events"' in page.text and "static/live.js" in page.text
                async with h.stream("GET", "/queues/mail/events") as r:
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/event-stream")
                    lines = r.aiter_lines()
                    with anyio.fail_after(10):
                        assert await anext(lines) == "retry: 3000"
                        job_id = await world.queue.enqueue(Hostile(text=XSS))
                        seen: dict[str, Any] = {}
                        async for line in lines:
                            if line.startswith("id: "):
                                seen["id"] = line[4:]
                            if line.startswith("data: "):
                                seen.update(json.loads(line[6:]))
                                break
                    assert (
                        seen["event"] == "enqueued" and seen["job_id"] == job_id and seen["kind"] == "hostile"
                    )
                    assert re.fullmatch(r"\d+-\d+", seen["id"]) and _live.OPEN == 1
            with anyio.fail_after(10):
                while _live.OPEN or await blocked():
                    await anyio.sleep(0.02)
        finally:
            server.should_exit = True


async def test_live_feed_beats_while_quiet_resumes_after_last_event_id_and_ends(world: World) -> None:
    from venturi_redis.dashboard import _live

    await world.queue.set_events(True)
    mark = await _last_event(world.queue)  # the world's own events before it
    first = await world.queue.enqueue(Echo(text="one"))
    second = await world.queue.enqueue(Echo(text="two"))
    (ev1,) = [e async for e in _take(world.queue.events(since=mark), 1)]
    assert ev1.job_id == first
    assert _live.resume_point(ev1.id) == ev1.id and _live.resume_point("x<y") == "$"
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    feed = _live.EventFeed(world.queue, ev1.id, heartbeat=0.05, lifetime=0.5)
    with anyio.fail_after(10):
        await feed({"type": "http"}, receive, send)  # ends by itself after its lifetime
    body = b"".join(sent).decode()
    assert f'"job_id":"{second}"' in body and f'"job_id":"{first}"' not in body
    assert ": quiet" in body and _live.OPEN == 0


async def _last_event(queue: vr.Queue) -> str:
    (entry,) = await queue.client.redis.xrevrange(queue.keys.events, count=1)
    return str(entry[0].decode())


async def _take(events: Any, n: int) -> AsyncIterator[Any]:
    async for e in events:
        yield e
        n -= 1
        if n == 0:
            return


async def test_registered_workers_on_the_queue_page(world: World) -> None:
    from tests.helpers import make_worker

    worker = make_worker(world.queue, EchoJob)
    async with anyio.create_task_group() as tg, http(create_app(world.client)) as h:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while not await world.queue.workers():
                await anyio.sleep(0.02)
        page = await h.get("/queues/mail")
        api = (await h.get("/api/queues/mail/workers")).json()["workers"]
        worker.shutdown()
    ((w,),) = [api]
    assert w["queues"] == ["mail"] and w["pid"] > 0 and w["heartbeat_at"]
    assert f'data-worker="{w["name"]}"' in page.text and "<h2>Workers</h2>" in page.text
