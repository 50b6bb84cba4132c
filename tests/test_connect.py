"""Which server a client, the CLI and a worker use when no URL is given, and what they say about it.

The default is the Redis ecosystem's: ``REDIS_URL``, else
``redis://127.0.0.1:6379/0``. The in-process ``memory://`` server is used only
when asked for by name (a producer that silently enqueued into it would lose
every job at exit). None of these tests needs a server on port 6379: they
look at where a client would connect, not at what it finds there.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis._transport.connect import DEFAULT_URL, default_url
from venturi_redis._transport.urls import redact_url

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def _address(client: vr.Client) -> tuple[str, int, int]:
    kwargs = client.redis.connection_pool.connection_kwargs
    return kwargs["host"], kwargs["port"], kwargs.get("db", 0)


async def test_no_url_and_no_redis_url_means_local_redis_not_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert default_url() == DEFAULT_URL == "redis://127.0.0.1:6379/0"
    async with vr.Client.from_url() as client:
        assert client.url == DEFAULT_URL
        assert _address(client) == ("127.0.0.1", 6379, 0)
        assert not type(client.redis).__module__.startswith("fakeredis")
    q = vr.Queue.from_url(name="q")
    try:
        assert q.client.url == DEFAULT_URL
    finally:
        await q.client.aclose()


async def test_redis_url_wins_and_memory_is_used_only_by_name(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    async with vr.Client.from_url() as client:
        assert client.url == redis_server.url and _address(client)[1] == redis_server.port
    async with vr.Client.from_url(f"memory://{uuid.uuid4().hex}") as client:
        assert type(client.redis).__module__.startswith("fakeredis")


def test_the_sync_client_has_the_same_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with vr.SyncClient() as client:
        assert client.client.url == DEFAULT_URL


def test_redact_url_masks_every_password() -> None:
    assert redact_url("redis://:hunter2@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("rediss://app:hunter2@h:6380/1?ssl_ca_certs=/ca.pem") == (
        "rediss://app:***@h:6380/1?ssl_ca_certs=/ca.pem"
    )
    assert redact_url("redis+sentinel://:a@s1,s2/m/0?x=1&sentinel_password=b") == (
        "redis+sentinel://:***@s1,s2/m/0?x=1&sentinel_password=***"
    )
    assert redact_url("redis://u:p@s/s@h:6379/0") == "redis://u:***@h:6379/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert redact_url("memory://") == "memory://"


FACTORY = textwrap.dedent(
    """
    import os

    def make():
        # The CLI reports a failing factory in one line with its message.
        raise RuntimeError("REDIS_URL=" + os.environ.get("REDIS_URL", "<unset>"))
    """
)


@pytest.mark.parametrize("given", [None, "redis://:pw@127.0.0.1:1/3"])
def test_the_cli_exports_its_resolved_url_to_the_worker_factory(tmp_path: Path, given: str | None) -> None:
    (tmp_path / "factory_app.py").write_text(FACTORY)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    args = [sys.executable, "-m", "venturi_redis.cli", "worker", "factory_app:make"]
    if given:
        args += ["--redis", given]
    res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert f"RuntimeError: REDIS_URL={given or DEFAULT_URL}" in res.stderr, res.stderr


async def test_a_worker_logs_the_server_it_is_on_with_the_password_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(password="hunter2") as server:
        async with vr.Client.from_url(server.url) as client:
            q = client.queue(f"c-{uuid.uuid4().hex[:8]}")
            await q.enqueue(Echo(text="x"))
            worker = make_worker(q, EchoJob)
            with caplog.at_level(logging.INFO, logger="venturi_redis"), anyio.fail_after(30):
                await worker.run(until_idle=True)
    (line,) = [r.getMessage() for r in caplog.records if "starting on" in r.getMessage()]
    assert f"at redis://:***@127.0.0.1:{server.port}/0 " in line, line
    assert "hunter2" not in caplog.text
