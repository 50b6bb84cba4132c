"""The dashboard issue's points that tests/test_dashboard.py leaves open, one test each:
the journal's merges and lease expiries, carry and result, lag and the paused
flag, the waiting state, search by a finished job's dedup key, every action's
answer (page and JSON), CSRF under a login session, read-only without any
action, and the CLI's flags and loopback default.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import claim_raw, run_until_event
from tests.servers import RedisServer
from tests.tasks import Echo, Steps, StepsJob
from tests.test_dashboard import Login, World, csrf_of, http, world_on
from venturi_redis._store import calls
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio
DOC = (Path(__file__).resolve().parent.parent / "docs/dashboard.md").read_text()


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    async with world_on(redis_server) as w:
        yield w


async def test_journal_timeline_shows_a_merge_and_a_lease_expiry_with_its_worker(world: World) -> None:
    q = world.queue
    merged = await q.enqueue(Login(user="cy", password="pw"))
    assert await q.enqueue(Login(user="cy", password="pw2")) == merged  # same dedup key: merged
    orphan = await q.enqueue(Echo(text="orphan"), priority="critical")
    await claim_raw(q, 1, worker="w-gone", lease_ms=1)  # claimed, never finished: its worker "died"
    await anyio.sleep(0.05)
    c = q.client
    await c.sender.call(calls.reclaim(q.keys, c._now_arg(), batch=10, max_failures="25"))
    async with http(create_app(world.client)) as h:
        m = await h.get(f"/queues/mail/jobs/{merged}")
        o = await h.get(f"/queues/mail/jobs/{orphan}")
        doc = (await h.get(f"/api/queues/mail/jobs/{orphan}")).json()
    assert 'class="event enqueued"' in m.text and 'class="event merged"' in m.text
    assert [e["event"] for e in doc["journal"]] == ["enqueued", "claimed", "lease_expired"]
    assert doc["journal"][1]["details"]["worker"] == "w-gone"
    claimed = o.text.split('class="event claimed"')[1].split("</li>")[0]
    assert '<span class="who">by w-gone</span>' in claimed
    assert 'class="event lease_expired"' in o.text
    assert 'id="job-state">pending<' in o.text  # back to pending, to run again


async def test_job_page_shows_carry_attachment_and_result_masked_unless_asked(world: World) -> None:
    job_id = await world.queue.enqueue(Steps(steps=2))
    await run_until_event(world.queue, job_id, "completed", StepsJob)
    async with http(create_app(world.client)) as h:
        masked = (await h.get(f"/api/queues/mail/jobs/{job_id}")).json()["job"]
    assert masked["carry"] == {"n": "***", "seen": "***"} and masked["result"] == {"n": "***"}
    assert masked["attachment"] == {"n": "***"}
    async with http(create_app(world.client, show_payloads=True)) as h:
        page = await h.get(f"/queues/mail/jobs/{job_id}")
        shown = (await h.get(f"/api/queues/mail/jobs/{job_id}")).json()["job"]
    assert shown["carry"] == {"n": 2, "seen": []} and shown["result"] == {"n": 2}
    assert shown["attachment"] == {"n": 2} and shown["payload"] == {"steps": 2}
    for name in ("payload", "carry", "attachment", "result"):
        assert f"<h2>{name}</h2>" in page.text, name
    assert page.text.count('class="event claimed"') == 2  # two runs on the timeline


async def test_overview_shows_lag_and_the_paused_flag(world: World) -> None:
    # A client whose clock runs two hours ahead sees the oldest eligible job two hours old.
    ahead = vr.Client.from_url(
        world.client.url, namespace=world.client.namespace, clock=lambda: int(time.time() * 1000) + 7_200_000
    )
    try:
        await world.queue.pause()
        async with http(create_app(ahead)) as h:
            page = await h.get("/")
            (row,) = (await h.get("/api/queues")).json()["queues"]
    finally:
        await ahead.aclose()
    assert row["paused"] is True and 7_190 < row["lag_seconds"] < 7_300
    mail = page.text.split('data-queue="mail"')[1].split("</tr>")[0]
    assert '<span class="badge paused">paused</span>' in mail
    assert '<td class="num">2.0 h</td>' in mail
    assert "resume" in mail and ">pause<" not in mail  # the button follows the flag


async def test_a_waiting_job_is_listed_counted_and_shown(world: World) -> None:
    q = world.queue
    waits = await q.enqueue(Echo(text="after"), after=[world.ids["pending"]])
    async with http(create_app(world.client)) as h:
        (row,) = (await h.get("/api/queues")).json()["queues"]
        listed = (await h.get("/api/queues/mail/jobs", params={"state": "waiting"})).json()["jobs"]
        overview = await h.get("/")
        page = await h.get("/queues/mail", params={"state": "waiting"})
        job = await h.get(f"/queues/mail/jobs/{waits}")
    assert row["waiting"] == 1 and [j["id"] for j in listed] == [waits]
    assert 'href="/queues/mail?state=waiting"' in overview.text
    assert f'data-job="{waits}"' in page.text and 'class="state waiting"' in page.text
    assert 'id="job-state">waiting<' in job.text
    assert f'href="/queues/mail/jobs/{world.ids["pending"]}"' in job.text  # what it waits on


async def test_search_finds_a_finished_job_by_its_dedup_key(world: World) -> None:
    """The dedup hash holds pending jobs only; a job that ran keeps its key in its own hash."""
    async with http(create_app(world.client)) as h:
        by_key = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login"})).json()
        assert by_key["found"] == [world.ids["pending"]]
        await world.queue.cancel(world.ids["pending"])
        gone = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login"})).json()
        assert gone["found"] == [world.ids["pending"]]  # found among the cancelled
        kind = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login", "kind": "login"})).json()
        assert kind["found"] == [world.ids["pending"]]
        other = (await h.get("/api/queues/mail/jobs", params={"q": "ann-login", "kind": "echo"})).json()
        assert other["found"] == []
        part = (await h.get("/api/queues/mail/jobs", params={"q": "login"})).json()
        assert part["found"] == []  # the whole key, not a suffix of it
        page = await h.get("/queues/mail", params={"q": "ann-login"})
    assert f'href="/queues/mail/jobs/{world.ids["pending"]}"' in page.text


async def test_each_action_answers_with_the_page_updated_or_json(world: World) -> None:
    q, ids = world.queue, world.ids
    async with http(create_app(world.client)) as h:
        token = csrf_of((await h.get("/queues/mail")).text)
        form = {"csrf_token": token}

        async def post(path: str, **headers: str) -> Any:
            return await h.post(path, data=form, headers=headers)

        r = await post(f"/queues/mail/jobs/{ids['pending']}/cancel")
        page = await h.get(r.headers["location"])
        assert "Job cancelled." in page.text and 'id="job-state">cancelled<' in page.text
        r = await post(f"/queues/mail/jobs/{ids['running']}/cancel", accept="application/json")
        assert r.json() == {"done": "requested", "job_id": ids["running"]}
        r = await post("/queues/mail/pause")
        page = await h.get(r.headers["location"])
        assert r.headers["location"] == "/queues/mail?done=paused"
        assert "Queue paused" in page.text and '<span class="badge paused">paused</span>' in page.text
        r = await post("/queues/mail/resume", accept="application/json")
        assert r.json() == {"done": "resumed"} and not (await q.stats()).paused
        # From the overview's button, back to the overview, the flag shown.
        r = await h.post("/queues/mail/pause", data=form, headers={"referer": "http://dash/"})
        assert r.headers["location"] == "/?done=paused"
        overview = await h.get(r.headers["location"])
        assert "Queue paused" in overview.text and "badge paused" in overview.text
        r = await post("/queues/mail/resume")
        page = await h.get(r.headers["location"])
        assert "Queue resumed." in page.text and "badge paused" not in page.text
        r = await post("/queues/mail/dead/retry")
        page = await h.get(r.headers["location"])
        assert "Dead jobs moved back to pending." in page.text and "· dead 0 ·" in page.text
        r = await post(f"/queues/mail/jobs/{ids['dead']}/cancel", accept="application/json")
        assert r.json() == {"done": "cancelled", "job_id": ids["dead"]}  # pending again: cancellable
        r = await post(f"/queues/mail/jobs/{ids['completed']}/cancel")
        assert "Nothing done: the job has already finished." in (await h.get(r.headers["location"])).text


async def test_a_logged_in_session_still_needs_the_csrf_token(world: World) -> None:
    before = (await world.queue.stats()).paused, (await world.queue.get(world.ids["dead"])).state  # type: ignore[union-attr]
    async with http(create_app(world.client, token="s3cret")) as h:
        login = csrf_of((await h.get("/login")).text)
        await h.post("/login", data={"csrf_token": login, "token": "s3cret", "next": "/"})
        assert (await h.get("/queues/mail")).status_code == 200  # logged in by cookie
        for path in ("/queues/mail/pause", f"/queues/mail/jobs/{world.ids['dead']}/retry"):
            for data in ({}, {"csrf_token": "0" * 64}):
                r = await h.post(path, data=data)
                assert r.status_code == 403 and "CSRF" in r.text, (path, data)
        # Logging out needs it too, and ends the session.
        assert (await h.post("/logout", data={})).status_code == 403
        page = await h.get("/queues/mail")
        out = await h.post("/logout", data={"csrf_token": csrf_of(page.text)})
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
        assert (await h.get("/queues/mail")).status_code == 303  # to the login form
    after = (await world.queue.stats()).paused, (await world.queue.get(world.ids["dead"])).state  # type: ignore[union-attr]
    assert after == before == (False, vr.JobState.DEAD)


def _action_paths(app: Starlette) -> list[str]:
    return [
        r.path  # type: ignore[attr-defined]
        for r in app.routes
        if "POST" in (getattr(r, "methods", None) or ()) and r.path not in ("/login", "/logout")  # type: ignore[attr-defined]
    ]


async def test_read_only_leaves_out_every_action_route_and_button(world: World) -> None:
    q = world.queue
    await q.schedule("hourly", Echo(text="tick"), cron="0 * * * *")
    paths = _action_paths(create_app(world.client))
    assert len(paths) == 6  # retry, cancel, pause, resume, dead retry, the schedule's three
    fill = {"queue": "mail", "job_id": world.ids["dead"], "schedule_id": "hourly"}
    before = (await q.stats()).to_dict()
    for moving in ("at", "lag_seconds"):
        before.pop(moving)
    app = create_app(world.client, read_only=True)
    assert _action_paths(app) == []
    async with http(app) as h:
        for path in paths:
            for action in ("pause", "resume", "trigger") if "{action}" in path else ("",):
                url = path.format(**fill, action=action)
                assert (await h.post(url, data={})).status_code in (404, 405), url
        pages = ["/", "/queues/mail", "/queues/mail/schedules"]
        pages += [f"/queues/mail/jobs/{j}" for j in world.ids.values()]
        for path in pages:
            text = (await h.get(path)).text
            assert not re.search(r'method="post"', text, re.I), path
            assert "<button" not in text.replace('<button type="submit">filter</button>', ""), path
    after = (await q.stats()).to_dict()
    for moving in ("at", "lag_seconds"):
        after.pop(moving)
    assert after == before and not (await q.get_schedule("hourly")).paused  # type: ignore[union-attr]


def _served(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """Run ``venturi dashboard ARGS`` with uvicorn's run replaced: the config it would serve."""
    from venturi_redis.cli.commands import app

    got: dict[str, Any] = {}
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, sockets=None: got.setdefault("config", self.config)
    )
    monkeypatch.delenv("VENTURI_DASHBOARD_TOKEN", raising=False)
    res = CliRunner().invoke(app, ["dashboard", *args])
    assert res.exit_code == 0, res.output
    return got["config"], res.output


async def _answers(app: Any) -> tuple[int, int]:
    # Through the app's lifespan, which closes the client the CLI made for it.
    async with app.router.lifespan_context(app), http(app) as h:
        return (await h.get("/queues/mail")).status_code, (await h.get("/api/queues")).status_code


def test_cli_binds_loopback_by_default_and_takes_every_flag(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, output = _served(monkeypatch, "--redis", redis_server.url)
    assert (config.host, config.port) == ("127.0.0.1", 8080)
    assert "on http://127.0.0.1:8080/" in output
    assert anyio.run(_answers, config.app) == (404, 200)  # no token asked; no queue "mail" there
    assert len(_action_paths(config.app)) == 6
    flags = ["--host", "0.0.0.0", "--port", "9001", "--read-only", "--token", "tok-en"]
    config, output = _served(monkeypatch, *flags, "--redis", redis_server.url)
    assert (config.host, config.port) == ("0.0.0.0", 9001)
    assert anyio.run(_answers, config.app) == (303, 401)  # the token is asked for
    assert _action_paths(config.app) == []  # read-only


def test_a_newcomer_runs_the_example_then_venturi_dashboard_and_sees_its_queue(
    redis_server: RedisServer,
) -> None:
    """The issue's "done when": `make example` on a real Redis, then `venturi dashboard` shows its queue."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys
    import urllib.request

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location(
        "dashboard_screenshots", root / "scripts/dashboard_screenshots.py"
    )
    assert spec is not None and spec.loader is not None
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    env = {**os.environ, "REDIS_URL": redis_server.url}
    ran = subprocess.run(
        [sys.executable, "examples/bookmarks.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    # It says first that the WARNING lines to come are expected, then walks the
    # newcomer to the dashboard command by command (issue 39): a command that
    # runs as printed (the venturi beside this Python, the Redis it ran on)...
    assert ran.stdout.startswith("Fetching 4 bookmarks. Expect three WARNING lines")
    m = re.search(
        r"See queue (bookmarks-[0-9a-f]{8}) in a browser: start the dashboard,\n"
        r"  (\S+) dashboard --redis (\S+)\n"
        r"then open http://127\.0\.0\.1:8080(/queues/bookmarks-[0-9a-f]{8}) ",
        ran.stdout,
    )
    assert m, ran.stdout
    name, venturi, url, path = m.groups()
    # The venturi beside the Python running the suite: .venv/bin/venturi under
    # `make test`, .venv-py3XX/bin/venturi under `make test-python`.
    beside = Path(sys.executable).parent / "venturi"
    expected = str(beside.relative_to(root)) if beside.is_relative_to(root) else str(beside)
    assert (venturi, url, path) == (expected, redis_server.url, f"/queues/{name}")
    assert (root / venturi).exists()
    port = str(shots.free_port())  # the printed command on a port of the test's own
    proc = subprocess.Popen([str(root / venturi), "dashboard", "--redis", url, "--port", port], cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        shots.wait_http(base + "/static/dashboard.css", proc)
        with urllib.request.urlopen(base + path, timeout=10) as r:
            assert '<h2 id="jobs-heading">Jobs</h2>' in r.read().decode()
        with urllib.request.urlopen(base + "/api/queues", timeout=10) as r:
            (row,) = [q for q in json.loads(r.read())["queues"] if q["queue"] == name]
        with urllib.request.urlopen(f"{base}{path}?state=dead", timeout=10) as r:
            dead = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
    assert (row["completed"], row["dead"]) == (3, 1)
    assert "resource gone" in dead
    # On memory:// the example says the dashboard cannot see it, and how to run it so it can.
    env.pop("REDIS_URL")
    alone = subprocess.run(
        [sys.executable, "examples/bookmarks.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 0, alone.stderr
    assert "This ran on memory://" in alone.stdout
    assert "REDIS_URL=redis://127.0.0.1:6379/0 make example" in alone.stdout
    assert f"{expected} dashboard --redis redis://127.0.0.1:6379/0" in alone.stdout


async def test_an_empty_overview_explains_memory_urls(redis_server: RedisServer) -> None:
    client = vr.Client.from_url(redis_server.url, namespace="nothing-here")
    try:
        async with http(create_app(client)) as h:
            page = await h.get("/")
    finally:
        await client.aclose()
    assert "No queue found" in page.text and "<code>memory://</code>" in page.text


async def test_the_docs_fastapi_mount_behind_the_apps_own_authentication(world: World) -> None:
    """docs/dashboard.md's block, run as written: only the app's operators reach the dashboard."""
    from dataclasses import dataclass

    section = DOC.split("## Mount it in your FastAPI")[1]
    code = section.split("```python\n")[1].split("```")[0]
    assert 'app.mount("/venturi", guarded)' in code

    @dataclass
    class User:
        is_operator: bool

    async def your_current_user(request: Any) -> User | None:
        role = request.headers.get("x-role")
        return None if role is None else User(is_operator=role == "operator")

    ours = f"vr.Client.from_url({world.client.url!r}, namespace={world.client.namespace!r})"
    code = code.replace('vr.Client.from_url("redis://127.0.0.1:6379/0")', ours)
    assert ours in code
    scope: dict[str, Any] = {"your_current_user": your_current_user, "SendEmail": Login}
    exec(compile(code, "docs/dashboard.md", "exec"), scope)
    try:
        async with http(scope["app"]) as h:
            assert (await h.get("/venturi/")).status_code == 403
            assert (await h.get("/venturi/", headers={"x-role": "viewer"})).status_code == 403
            op = {"x-role": "operator"}
            page = await h.get("/venturi/queues/mail", headers=op)
            assert page.status_code == 200 and 'href="/venturi/queues/mail/schedules"' in page.text
            # The dashboard's own CSRF check still applies behind the app's authentication.
            assert (await h.post("/venturi/queues/mail/pause", headers=op, data={})).status_code == 403
            done = await h.post(
                "/venturi/queues/mail/pause", headers=op, data={"csrf_token": csrf_of(page.text)}
            )
            assert done.status_code == 303 and done.headers["location"] == "/venturi/queues/mail?done=paused"
    finally:
        await scope["client"].aclose()
    assert (await world.queue.stats()).paused


def test_the_dashboard_extra_covers_what_the_dashboard_imports() -> None:
    """`pip install 'venturi-redis[dashboard]'` (with `[cli]` for the command) is all it needs."""
    import ast
    import sys
    import tomllib

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[\[<>=;! ]", r, maxsplit=1)[0].lower().replace("-", "_") for r in reqs}

    core = names(project["dependencies"]) | {"ulid"}  # python-ulid's module
    extra = names(project["optional-dependencies"]["dashboard"])
    assert extra == {"starlette", "jinja2", "uvicorn"}
    sources = [*(root / "venturi_redis/dashboard").glob("*.py"), root / "venturi_redis/cli/dashboard.py"]
    imported: set[str] = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"venturi_redis", "__future__", "typer"}
    assert third_party - core - extra == set()
    assert {"starlette", "jinja2", "uvicorn"} <= third_party
