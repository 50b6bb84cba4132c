"""examples/fastapi_app.py as a user runs it: uvicorn, a `venturi worker`, requests over HTTP.

And once more on the embedded default (``memory://``, the worker inline in
the lifespan), through httpx's ASGI transport: every example runs in the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

import venturi_redis as vr
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.fixture
def served(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str], Path]]:
    """uvicorn serving the example on a real Redis, without a worker yet."""
    name = f"web-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": redis_server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}
    env.pop("VENTURI_INLINE_WORKER", None)
    env["VENTURI_DASHBOARD_TOKEN"] = "s3cret-for-the-test"
    port = free_port()
    web = start(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port)],
        env,
        tmp_path / "web.log",
    )
    try:
        yield f"http://127.0.0.1:{port}", name, env, tmp_path
    finally:
        code = stop(web)
        assert code in (0, -signal.SIGTERM), (tmp_path / "web.log").read_text()


async def wait_ready(http: httpx.AsyncClient) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                await http.get("/jobs/none")
                return
            except httpx.TransportError:
                await anyio.sleep(0.05)


async def finished_state(http: httpx.AsyncClient, job_id: str) -> dict[str, str]:
    with anyio.fail_after(30):
        while True:
            doc: dict[str, str] = (await http.get(f"/jobs/{job_id}")).json()
            if doc["state"] in ("completed", "dead"):
                return doc
            await anyio.sleep(0.05)


async def test_the_app_over_http_with_a_venturi_worker_beside_it(
    served: tuple[str, str, dict[str, str], Path],
) -> None:
    base, name, env, tmp = served
    async with httpx.AsyncClient(base_url=base, timeout=40) as http:
        await wait_ready(http)
        # No worker yet: the offload waits its time out and answers with the key.
        early = await http.post("/quotes", params={"wait": 0.2}, json={"items": [1, 2]})
        assert early.status_code == 202, early.text
        assert early.json()["status"] == "pending"
        key = early.json()["key"]
        assert (await http.get(f"/quotes/{key}")).json() == {"status": "pending"}

        worker = start(
            [sys.executable, "-m", "venturi_redis.cli", "worker", "examples.fastapi_app:make_worker"],
            env,
            tmp / "worker.log",
        )
        try:
            ok = await http.post("/quotes", params={"wait": 30}, json={"items": [3, 4]})
            assert ok.status_code == 200, ok.text
            assert ok.json() == {"status": "completed", "quote": {"items": [3, 4], "total_cents": 7 * 199}}

            bad = await http.post("/quotes", params={"wait": 30}, json={"items": [-1]})
            assert (bad.status_code, bad.json()) == (422, {"status": "failed", "error": "terminal error"})

            sent = await http.post("/welcome", json={"email": "ada@example.org"})
            assert sent.status_code == 202, sent.text
            doc = await finished_state(http, sent.json()["job_id"])
            assert (doc["state"], doc["note"]) == ("completed", "welcomed ada@example.org")

            # The quote asked for before the worker started was done by it too.
            async with vr.Client.from_url(env["REDIS_URL"]) as client:
                from examples.fastapi_app import price

                res = await vr.resolve(client, price.handle(key), timeout=30)
            assert res.status == "completed" and res.value is not None and res.value.total_cents == 3 * 199
            assert (await http.get(f"/quotes/{key}")).json()["status"] == "completed"
            assert (await http.get("/quotes/not-a-key")).status_code == 404
            assert (await http.get("/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV")).status_code == 404
            # The dashboard, mounted in the lifespan: the token is asked for, and it shows the queue.
            anonymous = await http.get("/dashboard/")
            assert anonymous.status_code == 303 and "login" in anonymous.headers["location"]
            # Filtered by name: the overview shows 100 queues a page, and the suite's shared
            # server holds hundreds of other tests' queues.
            page = await http.get(
                "/dashboard/", params={"q": name}, headers={"Authorization": "Bearer s3cret-for-the-test"}
            )
            assert page.status_code == 200 and name in page.text
        finally:
            code = stop(worker)
        assert code == 0, (tmp / "worker.log").read_text()


@pytest.fixture
async def embedded_app(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.delenv("REDIS_URL", raising=False)
    from examples.fastapi_app import app

    # httpx's ASGI transport does not run the lifespan: run it around the requests.
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=40) as http:
            yield http


async def test_the_app_on_the_embedded_default_runs_its_worker_inline(
    embedded_app: httpx.AsyncClient,
) -> None:
    ok = await embedded_app.post("/quotes", params={"wait": 30}, json={"items": [5]})
    assert ok.json() == {"status": "completed", "quote": {"items": [5], "total_cents": 5 * 199}}
    sent = await embedded_app.post("/welcome", json={"email": "grace@example.org"})
    doc = await finished_state(embedded_app, sent.json()["job_id"])
    assert doc["note"] == "welcomed grace@example.org"


async def test_the_lifespan_opens_one_client_and_closes_it_at_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    from examples.fastapi_app import app

    closed: list[vr.Client] = []
    real_aclose = vr.Client.aclose

    async def aclose(self: vr.Client) -> None:
        closed.append(self)
        await real_aclose(self)

    monkeypatch.setattr(vr.Client, "aclose", aclose)
    async with app.router.lifespan_context(app):
        client = app.state.client
        assert isinstance(client, vr.Client) and client not in closed
        assert "/dashboard" in [getattr(r, "path", "") for r in app.router.routes]
    assert closed.count(client) == 1
    assert "/dashboard" not in [getattr(r, "path", "") for r in app.router.routes]  # taken down with it
