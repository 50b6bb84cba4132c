"""The tokenless dashboard answers only to its own host (issue 38, item 5: DNS rebinding).

A page at ``http://evil.example:8080/`` whose name is re-resolved to 127.0.0.1
is same-origin with a dashboard on 127.0.0.1:8080 for the browser; its
requests still say ``Host: evil.example:8080``. In process (httpx's ASGI
transport: the server is "dash") and through ``venturi dashboard`` under
uvicorn on 127.0.0.1, as a user runs it.
"""

from __future__ import annotations

import importlib.util
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo
from venturi_redis.cli.commands import app as cli
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

EVIL = "evil.example:8080"


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_server.url, namespace=f"h{uuid.uuid4().hex[:10]}")
    await c.queue("mail").enqueue(Echo(text="x"))
    try:
        yield c
    finally:
        await c.aclose()


def http(web: Any, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://dash", headers=headers)


async def test_a_rebound_name_reads_nothing_and_changes_nothing(client: vr.Client) -> None:
    async with http(create_app(client), host=EVIL) as evil:
        for path in ("/", "/api/queues", "/queues/mail", "/static/htmx.min.js", "/login"):
            r = await evil.get(path)
            assert r.status_code == 421, path
            assert "csrf_token" not in r.text and "set-cookie" not in r.headers
            assert "--allow-host" in r.json()["error"] and r.headers["x-frame-options"] == "DENY"
        assert (await evil.post("/queues/mail/pause", data={})).status_code == 421
    async with http(create_app(client), host="a b") as broken:
        assert (await broken.get("/")).status_code == 400
    assert not (await client.queue("mail").stats()).paused


async def test_its_own_host_and_the_allowed_names_are_served(client: vr.Client) -> None:
    async with http(create_app(client)) as own, http(create_app(client), host="dash:8080") as port:
        assert (await own.get("/api/queues")).status_code == 200
        assert (await port.get("/api/queues")).status_code == 200  # any port: the name matters
    web = create_app(client, allowed_hosts=["Evil.Example", "10.0.0.5", "::1"])
    for host in (EVIL, "EVIL.example.", "10.0.0.5", "[::1]:8080", "dash"):
        async with http(web, host=host) as h:
            assert (await h.get("/api/queues")).status_code == 200, host
    async with http(web, host="other.example") as h:
        assert (await h.get("/api/queues")).status_code == 421
    async with http(create_app(client, allowed_hosts=["*"]), host="anything.example") as h:
        assert (await h.get("/api/queues")).status_code == 200


async def test_with_a_token_the_token_guards_whatever_the_host(client: vr.Client) -> None:
    async with http(create_app(client, token="t0ken"), host=EVIL, authorization="Bearer t0ken") as h:
        assert (await h.get("/api/queues")).status_code == 200
    # names given with a token are checked too
    web = create_app(client, token="t0ken", allowed_hosts=["dash"])
    async with http(web, host=EVIL, authorization="Bearer t0ken") as h:
        assert (await h.get("/api/queues")).status_code == 421


async def test_a_post_from_another_origin_is_refused(client: vr.Client) -> None:
    queue = client.queue("mail")
    async with http(create_app(client)) as h:
        page = await h.get("/queues/mail")
        csrf = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        for origin in ("http://evil.example", "null", "https://evil.example:8080", "file://"):
            r = await h.post("/queues/mail/pause", data={"csrf_token": csrf}, headers={"origin": origin})
            assert r.status_code == 403 and "Origin" in r.json()["error"], origin
        assert not (await queue.stats()).paused
        same = await h.post(
            "/queues/mail/pause", data={"csrf_token": csrf}, headers={"origin": "http://dash"}
        )
        assert same.status_code == 303 and (await queue.stats()).paused
        # a GET's Origin is not checked (nothing acts on a GET)
        assert (await h.get("/api/queues", headers={"origin": "http://evil.example"})).status_code == 200


async def test_bad_arguments_are_refused(client: vr.Client) -> None:
    for token in ("", "   ", "\t"):
        with pytest.raises(vr.ConfigurationError, match="blank"):
            create_app(client, token=token)
    for hosts in (["dash:8080"], ["http://dash"], ["a/b"], "dash"):
        with pytest.raises(vr.ConfigurationError):
            create_app(client, allowed_hosts=hosts)  # type: ignore[arg-type]


def test_cli_a_blank_token_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--token " "` (or a blank VENTURI_DASHBOARD_TOKEN) must not open a public bind."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: served.append(self.config.host))
    runner = CliRunner()
    res = runner.invoke(cli, ["dashboard", "--host", "0.0.0.0", "--port", "1", "--token", " "], env={})
    assert res.exit_code == 2 and "without a token" in res.output
    res = runner.invoke(
        cli, ["dashboard", "--host", "0.0.0.0", "--port", "1"], env={"VENTURI_DASHBOARD_TOKEN": "  "}
    )
    assert res.exit_code == 2 and "without a token" in res.output
    res = runner.invoke(cli, ["dashboard", "--port", "1", "--allow-host", "x:80"], env={})
    assert res.exit_code == 2 and "no port" in res.output
    assert served == []


def _shots() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "scripts/dashboard_screenshots.py"
    spec = importlib.util.spec_from_file_location("dashboard_screenshots", path)
    assert spec is not None and spec.loader is not None
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    return shots


def _status(url: str, host: str, method: str = "GET") -> int:
    ask = urllib.request.Request(
        url, headers={"Host": host}, method=method, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(ask, timeout=10) as ok:
            return int(ok.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def test_venturi_dashboard_answers_only_to_its_address(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VENTURI_DASHBOARD_TOKEN", raising=False)
    shots = _shots()
    with shots.dashboard(redis_server.url) as base:
        port = base.rsplit(":", 1)[1]
        assert _status(base + "/api/queues", f"127.0.0.1:{port}") == 200
        assert _status(base + "/api/queues", f"localhost:{port}") == 200
        assert _status(base + "/api/queues", f"evil.example:{port}") == 421
        assert _status(base + "/queues/x/pause", f"evil.example:{port}", "POST") == 421
    with shots.dashboard(redis_server.url, "--allow-host", "evil.example", "--read-only") as base:
        port = base.rsplit(":", 1)[1]
        assert _status(base + "/api/queues", f"evil.example:{port}") == 200
        assert _status(base + "/api/queues", f"other.example:{port}") == 421
