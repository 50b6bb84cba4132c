"""Managed Redis and least-privilege ACL users (issue 45, docs/deployment.md).

Three server set-ups (tests/servers.py, MANAGED_SETUPS): CONFIG renamed away
(as managed services do); an application user with Redis's own
least-privilege pattern, ``+@all -@dangerous`` on ``~venturi:* &venturi:*``;
the same with ``+info``. On each: the worker's server check reads what it
may and starts (one WARNING for what it may not), a drain of every feature
finishes with nothing stuck, the CLI and the dashboard read the queue.
And no password in anything a user sees: a failing start, a refused check,
a lost connection, a repr, the CLI's lines. (`.ci/run` also runs the whole
contract suite on each set-up: VENTURI_REDIS_SETUP in tests/conftest.py.)
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import ACL_KEYS, APP_PASSWORD, MANAGED_SETUPS, RedisServer
from venturi_redis._producer.server import check_server
from venturi_redis.cli.commands import app
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

SETUPS = [s for s in MANAGED_SETUPS if s]
ROOT = Path(__file__).resolve().parent.parent
VENTURI = Path(sys.executable).parent / "venturi"
runner = CliRunner()


def make_app_worker() -> vr.Worker[Any]:
    """``venturi worker tests.test_managed_redis:make_app_worker`` (REDIS_URL and MANAGED_QUEUE set)."""
    worker: vr.Worker[Any] = vr.Worker(vr.Client.from_url().queue(os.environ["MANAGED_QUEUE"]), state={})
    return worker.register(StepJob)


async def cli_worker(url: str, queue_name: str, *options: str) -> str:
    """``venturi worker`` as a user starts it: what it prints in its first two seconds, and on SIGTERM."""
    env = {**os.environ, "MANAGED_QUEUE": queue_name}
    cmd = [str(VENTURI), "worker", "tests.test_managed_redis:make_app_worker", "--redis", url, *options]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await anyio.to_thread.run_sync(lambda: proc.wait(2) if True else None)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
    out, _ = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    return out.decode()


async def cli(args: list[str]) -> Any:
    """The ``venturi`` command, in a thread (it runs its own event loop)."""
    return await anyio.to_thread.run_sync(runner.invoke, app, args)


@pytest.fixture(scope="module", params=SETUPS)
def managed(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    with RedisServer(setup=request.param) as server:
        yield server


class Step(vr.Task):
    KIND: ClassVar[str] = "managed.step"
    name: str
    fail_first: bool = False

    def limit_key(self) -> str | None:
        return "tenant"


class StepJob(Step, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        await ctx.report_progress({"percent": 50})
        if self.fail_first and ctx.run_count == 1:
            raise RuntimeError("first run fails")
        state.setdefault("ran", []).append(self.name)
        return vr.Outcome.completed_with(self.name)


class Total(BaseModel):
    value: int


async def add(a: int, b: int) -> Total:
    return Total(value=a + b)


async def test_the_server_check_reads_what_the_user_may_and_warns_once_for_the_rest(
    managed: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with vr.Client.from_url(managed.url) as client:
        with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
            await check_server(client)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if managed.setup == "acl":  # neither CONFIG nor INFO: the version comes from HELLO
        assert len(warned) == 1 and "cannot read maxmemory-policy" in warned[0], warned
        assert "noeviction" in warned[0]
    else:  # CONFIG refused, INFO memory read
        assert warned == []
    assert all(APP_PASSWORD not in w for w in warned)


async def test_an_evicting_policy_read_from_info_is_refused() -> None:
    with RedisServer("--maxmemory-policy", "allkeys-lru", setup="noconfig") as server:
        async with vr.Client.from_url(server.url) as client:
            with pytest.raises(vr.ConfigurationError, match="maxmemory-policy allkeys-lru"):
                await check_server(client)


async def test_every_feature_drains_with_nothing_stuck(managed: RedisServer, queue_name: str) -> None:
    total = vr.offload(kind="managed.add", queue=queue_name)(add)
    async with vr.Client.from_url(managed.url) as client:
        queue = client.queue(queue_name)
        await queue.set_limit(Step.KIND, concurrency=1)
        await queue.enqueue(Step(name="single"))
        await queue.enqueue_many([Step(name=f"many{i}") for i in range(5)])
        await queue.enqueue(Step(name="retried", fail_first=True))
        flow = await queue.enqueue_flow(Step(name="parent"), [Step(name="child1"), Step(name="child2")])
        await queue.schedule("tick", Step(name="scheduled"), every=timedelta(hours=1))
        fired = await queue.trigger_schedule("tick")
        handle = await total.offload(client, 2, 3)
        state: dict[str, Any] = {}
        worker = make_worker(queue, StepJob, total, state=state)  # the server check on, as deployed
        with anyio.fail_after(60):
            await worker.run(until_idle=True)
        assert sorted(state["ran"]) == sorted(
            ["single", *(f"many{i}" for i in range(5)), "retried", "parent", "child1", "child2", "scheduled"]
        )
        counts = await queue.counts()
        assert counts["completed"] == 12 and counts["pending"] == counts["running"] == counts["dead"] == 0
        assert (await queue.get(flow.parent_id)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]
        assert fired is not None and (await queue.get(fired)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]
        assert (await vr.resolve(client, handle, timeout=5)).value == Total(value=5)
        events = {f[b"event"] for _, f in await client.redis.xrange(queue.keys.events)}
        assert {b"enqueued", b"claimed", b"failed", b"completed"} <= events
        # The CLI and the dashboard read it as that user.
        res = await cli(["stats", "--redis", managed.url, "-q", queue_name])
        assert res.exit_code == 0, res.output
        assert APP_PASSWORD not in res.output
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(client, read_only=True)), base_url="http://dash"
        ) as http:
            page = await http.get(f"/queues/{queue_name}")
            assert page.status_code == 200 and "completed" in page.text
            assert APP_PASSWORD not in page.text


async def test_no_password_in_what_a_failing_start_a_refused_check_or_a_lost_connection_shows(
    caplog: pytest.LogCaptureFixture, queue_name: str
) -> None:
    seen: list[str] = []
    with RedisServer("--maxmemory-policy", "allkeys-lru", setup="acl+info") as server:
        url = server.url
        assert APP_PASSWORD in url  # the URL carries it: everything below must hide it
        async with vr.Client.from_url(url) as client:
            queue = client.queue(queue_name)
            seen.append(repr(queue))
            # A refused check: the worker does not start.
            with pytest.raises(vr.ConfigurationError) as refused:
                await make_worker(queue, StepJob).run(until_idle=True)
            seen.append(str(refused.value))
            # The CLI's worker, refused, then started (its start-up line names the server).
            seen.append(await cli_worker(url, queue_name))
            seen.append(await cli_worker(url, queue_name, "--no-eviction-check"))
            wrong = url.replace(APP_PASSWORD, APP_PASSWORD[::-1])
            res = await cli(["stats", "--redis", wrong])
            assert res.exit_code != 0
            seen.append(res.output)
            # A lost connection, with the worker running.
            caplog.set_level(logging.DEBUG)
            worker = make_worker(queue, StepJob, check_eviction_policy=False, state={})
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await anyio.sleep(0.3)
                server.stop()
                await anyio.sleep(1.5)
                worker.shutdown(grace=0.1)
    seen += [r.getMessage() for r in caplog.records]
    seen += [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
    leaked = [s for s in seen if APP_PASSWORD in s]
    assert leaked == []
    assert any("***" in s for s in seen)  # the URL was shown, masked


def test_the_documented_acl_line_is_the_one_the_suite_runs() -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    lines = [line.split() for line in text.splitlines() if line.startswith("ACL SETUSER ")]
    assert len(lines) == 1
    assert lines[0][5:] == [*ACL_KEYS, *MANAGED_SETUPS["acl"][1]]  # type: ignore[misc]
