"""venturi_redis.testing: the pytest plugin as a user runs it, and drain() itself.

The user's side is tests/plugin_project: its tasks and a test file that imports
only the plugin's ``drain`` and those tasks. Each run copies it into a fresh
directory and runs pytest there in a child process, so nothing of this suite's
conftest or configuration leaks into it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import redis

import venturi_redis as vr
from tests.servers import RedisServer
from venturi_redis.testing import Clock, DrainLimitError, drain
from venturi_redis.testing._drain import LIMIT_HELD

pytestmark = pytest.mark.anyio

PROJECT = Path(__file__).resolve().parent / "plugin_project"
DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"
# The tests in plugin_project/user_test_tasks.py (6) and user_test_limits_schedules.py (2).
USER_TESTS = 8


def user_project(tmp_path: Path, ini: str = "") -> Path:
    shutil.copy(PROJECT / "tasks.py", tmp_path / "tasks.py")
    shutil.copy(PROJECT / "user_test_tasks.py", tmp_path / "test_tasks.py")
    shutil.copy(PROJECT / "user_test_limits_schedules.py", tmp_path / "test_limits_schedules.py")
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nfilterwarnings = error\n{ini}")
    return tmp_path


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_the_plugin_is_off_unless_enabled(tmp_path: Path) -> None:
    # Installed, the package registers an entry point with pytest; it must not
    # give anyone's suite fixtures it did not ask for.
    proc = run_pytest(user_project(tmp_path), "test_tasks.py::test_an_unknown_order_dies")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fixture 'venturi_queue' not found" in proc.stdout


@pytest.mark.parametrize("how", ["-p", "--venturi-redis", "conftest"])
def test_a_users_tests_run_with_the_plugin_turned_on(tmp_path: Path, how: str) -> None:
    # Each way docs/testing.md offers (the ini flag: the real-server test below).
    project = user_project(tmp_path)
    args = {"-p": ["-p", "venturi_redis.testing"], "--venturi-redis": ["--venturi-redis"]}.get(how, [])
    if how == "conftest":
        (project / "conftest.py").write_text('pytest_plugins = ["venturi_redis.testing"]\n')
    proc = run_pytest(project, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{USER_TESTS} passed" in proc.stdout


def test_a_users_tests_run_on_a_real_server_enabled_in_the_ini(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    project = user_project(tmp_path, ini="venturi_redis = true\n")
    proc = run_pytest(project, f"--venturi-redis-url={redis_server.url}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{USER_TESTS} passed" in proc.stdout
    # The jobs went to that server (and each test had a queue of its own).
    with redis.Redis(port=redis_server.port, **redis_server.connect_kwargs()) as r:
        queues = {k.split(b"{")[1].split(b"}")[0] for k in r.keys(b"venturi:{test-*")}
    assert len(queues) == USER_TESTS - 1  # the last test enqueues nothing


# -- drain() in this suite's own fixtures ---------------------------------------------


class Nap(vr.Task):
    KIND: ClassVar[str] = "plugin-nap"
    n: int


class NapJob(Nap, vr.Handler[list[int]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: list[int]) -> vr.Outcome:
        state.append(self.n)
        return vr.Outcome.completed()


class Forever(vr.Task):
    KIND: ClassVar[str] = "plugin-forever"


class ForeverJob(Forever, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.pause_in(60)


@pytest.fixture
async def clocked(url: str) -> Any:
    c = vr.Client.from_url(url, clock=Clock())
    try:
        yield c
    finally:
        await c.aclose()


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_drain_runs_delayed_jobs_in_due_order_by_moving_the_clock(
    clocked: vr.Client, queue_name: str
) -> None:
    queue = clocked.queue(queue_name)
    start = clocked.clock()  # type: ignore[misc]
    for n, delay in [(1, 7200), (2, 60), (3, 0), (4, 86400)]:
        await queue.enqueue(Nap(n=n), delay=delay)
    seen: list[int] = []

    report = await drain(queue, NapJob, state=seen)

    assert seen == [3, 2, 1, 4]
    assert (report.runs, len(report.completed)) == (4, 4)
    assert report.advanced_ms == 86400 * 1000
    assert clocked.clock() == start + 86400 * 1000  # type: ignore[misc]
    assert await queue.is_drained()
    # A second drain reports nothing new: the four were done before it.
    again = await drain(queue, NapJob, state=seen)
    assert (again.runs, again.completed, again.advanced_ms) == (0, [], 0)


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_drain_gives_up_after_max_runs(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    await queue.enqueue(Forever())
    with pytest.raises(DrainLimitError, match="after 5 runs"):
        await drain(queue, ForeverJob, max_runs=5)


@pytest.mark.parametrize("backend", ["memory"])
async def test_drain_refuses_to_wait_on_a_client_without_a_test_clock(queue: vr.Queue) -> None:
    await queue.enqueue(Nap(n=1))
    await queue.enqueue(Nap(n=2), delay=3600)
    seen: list[int] = []
    with pytest.raises(vr.ConfigurationError, match=r"clock=venturi_redis\.testing\.Clock"):
        await drain(queue, NapJob, state=seen)
    assert seen == [1]  # what was due ran; the delayed job was not waited for


class Tenant(vr.Task):
    KIND: ClassVar[str] = "plugin-tenant"
    tenant: str

    def limit_key(self) -> str | None:
        return self.tenant


class TenantJob(Tenant, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        running = state.setdefault("running", {})
        running[self.tenant] = running.get(self.tenant, 0) + 1
        state["most"] = max(state.get("most", 0), running[self.tenant])
        await anyio.sleep(0.01)  # overlap with the other runs drain lets start
        running[self.tenant] -= 1
        state.setdefault("ran", []).append(self.tenant)
        return vr.Outcome.completed()


class Ping(vr.Task):
    KIND: ClassVar[str] = "plugin-ping"
    n: int
    host: str | None = None

    def limit_key(self) -> str | None:
        return self.host


class PingJob(Ping, vr.Handler[list[int]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: list[int]) -> vr.Outcome:
        state.append(self.n)
        return vr.Outcome.completed()


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_drain_runs_limited_jobs_within_their_limits(clocked: vr.Client, queue_name: str) -> None:
    # Parked on a limit at enqueue (a limit key and a limit): drain used to run none of them.
    queue = clocked.queue(queue_name)
    await queue.set_limit(Tenant.KIND, concurrency=1, per_key=True)
    for tenant in ["a", "a", "a", "b", "b", "c"]:
        await queue.enqueue(Tenant(tenant=tenant))
    assert (await queue.counts())["limited"] == 6
    seen: dict[str, Any] = {}

    report = await drain(queue, TenantJob, state=seen, concurrency=4)

    assert (report.runs, len(report.completed)) == (6, 6)
    assert sorted(seen["ran"]) == ["a", "a", "a", "b", "b", "c"]
    assert seen["most"] == 1  # never two runs of one tenant at once, four slots or not
    assert await queue.is_drained()


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_drain_waits_out_a_rate_limit_on_its_clock(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    for n in range(3):
        await queue.enqueue(Nap(n=n), timeout=5)  # a timeout parks it at enqueue, as a key does
    seen: list[int] = []
    hourly = vr.Limit(Nap.KIND, rate=vr.Rate(1, 3600))

    report = await drain(queue, NapJob, state=seen, limits=[hourly])

    assert (seen, report.advanced_ms) == ([0, 1, 2], 2 * 3600 * 1000)
    assert [x.rate for x in await queue.limits()] == [vr.Rate(1, 3600)]


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_drain_fires_the_schedules_due_on_its_clock(clocked: vr.Client, queue_name: str) -> None:
    queue = clocked.queue(queue_name)
    assert isinstance(clocked.clock, Clock)
    seen: list[int] = []
    await queue.schedule("stored", Nap(n=1), every=600)  # stored beforehand, by anyone
    declared = vr.Schedule("declared", Nap(n=2), every=900)

    report = await drain(queue, NapJob, state=seen, schedules=[declared])
    assert (report.runs, seen) == (0, [])  # none is due yet, and a schedule never moves the clock

    clocked.clock.advance(600)
    report = await drain(queue, NapJob, state=seen, schedules=[declared])
    assert (report.runs, seen, report.advanced_ms) == (1, [1], 0)
    clocked.clock.advance(300)
    report = await drain(queue, NapJob, state=seen)  # declared earlier: stored now
    assert seen == [1, 2] and [j.schedule_id for j in report.completed] == ["declared"]


def test_drain_knows_where_a_held_limit_starts() -> None:
    text = (Path(vr.__file__).resolve().parent.parent / "lua" / "include" / "limits.lua").read_text()
    assert f"local LIMIT_HELD = {LIMIT_HELD}\n" in text


@pytest.mark.parametrize("per_key", [False, True])
async def test_drain_waits_out_a_rate_limit_by_moving_the_clock(
    clocked: vr.Client, queue_name: str, per_key: bool
) -> None:
    """Issue 38's probe of the plugin: jobs parked on a rate limit are not in a
    pending set; drain took the queue for drained and left them parked."""
    queue = clocked.queue(queue_name)
    await queue.set_limit("plugin-ping", rate=vr.Rate(1, 60), per_key=per_key)
    for n in range(3):
        await queue.enqueue(Ping(n=n, host="a.example" if per_key else None))
    seen: list[int] = []
    report = await drain(queue, PingJob, state=seen)
    assert sorted(seen) == [0, 1, 2] and len(report.completed) == 3
    assert report.advanced_ms == 120_000  # two windows: nothing more, nothing slept
    stats = await queue.stats()
    assert (stats.limited, sum(stats.pending.values())) == (0, 0)


@pytest.mark.parametrize("backend", ["memory"])
async def test_drain_of_a_paused_queue_says_so_instead_of_waiting_for_ever(
    clocked: vr.Client, queue_name: str
) -> None:
    queue = clocked.queue(queue_name)
    await queue.enqueue(Nap(n=1))
    await queue.pause()
    with anyio.fail_after(30), pytest.raises(vr.ConfigurationError, match="is paused"):
        await drain(queue, NapJob, state=[])
    await queue.resume_queue()
    assert (await drain(queue, NapJob, state=[])).runs == 1


@pytest.mark.parametrize("backend", ["memory"])
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
async def test_drain_checks_max_runs(clocked: vr.Client, queue_name: str, bad: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="max_runs must be a whole number"):
        await drain(clocked.queue(queue_name), NapJob, max_runs=bad)


def test_clock_moves_only_forward() -> None:
    clock = Clock()
    t = clock()
    clock.advance(1.5)
    clock.advance_to(t)
    assert clock() == t + 1500
    with pytest.raises(vr.ConfigurationError):
        clock.advance(-1)


def test_docs_testing_md_shows_the_tested_code() -> None:
    # Every Python block of docs/testing.md's examples is verbatim in the user
    # project this file runs: the docs cannot drift from what passes.
    doc = DOC.read_text()
    examples = doc.split("## Examples", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in examples.split("```python\n")[1:]]
    code = (PROJECT / "tasks.py").read_text() + (PROJECT / "user_test_tasks.py").read_text()
    assert len(blocks) >= 6
    for block in blocks:
        assert block in code, block


def test_docs_testing_md_shows_a_whole_test_file_of_limits_and_schedules() -> None:
    # Pasted as it stands into a test file, it runs (the user project above runs it).
    doc = DOC.read_text()
    section = doc.split("## Limits and schedules in drain()", 1)[1].split("\n## ", 1)[0]
    (block,) = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert block == (PROJECT / "user_test_limits_schedules.py").read_text()


def test_the_users_test_file_imports_only_pytest_the_plugin_and_its_tasks() -> None:
    # The bar: a user's test file needs nothing of ours but the plugin.
    tree = ast.parse((PROJECT / "user_test_tasks.py").read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"pytest", "tasks", "venturi_redis.testing"}
