"""Nothing walks the keyspace (issue 46): no SCAN or KEYS behind the CLI's read commands or a
dashboard session (counted by the server, INFO commandstats), none in the package's code but
``venturi queues rebuild``, and an open overview's refresh costs a bounded number of commands.

On a redis-server of this module's own, so that the counts are only ours.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from tests.test_flow_control import Mail
from venturi_redis._producer.reads import COUNT_COMMANDS
from venturi_redis.cli.commands import app
from venturi_redis.dashboard import create_app

PACKAGE = Path(vr.__file__).resolve().parent
LUA = PACKAGE.parent / "lua"
# The one module allowed to SCAN: the operator's migration.
REBUILD = PACKAGE / "_producer" / "rebuild.py"


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def _calls(redis: Any) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@pytest.fixture(scope="module")
def ids(own_server: RedisServer) -> dict[str, str]:
    """A queue with pending, dead and completed jobs, a schedule, a limit; and a second queue."""
    url = own_server.url

    async def go() -> dict[str, str]:
        async with vr.Client.from_url(url) as client:
            q = client.queue("orders")
            dead = await q.enqueue(Doomed())
            done = await q.enqueue(Echo(text="done"))
            await drain(q, DoomedJob, EchoJob)
            pending = await q.enqueue(Echo(text="waits"))
            await q.schedule("nightly", Echo(text="n"), cron="0 3 * * *")
            await q.set_limit("mail", concurrency=1, per_key=True)
            await q.enqueue(Mail(domain="example.com"))
            await client.queue("mail").enqueue(Echo(text="other queue"))
            return {"dead": dead, "done": done, "pending": pending}

    return anyio.run(go)


def test_no_scan_behind_the_cli_read_commands_nor_a_dashboard_session(
    own_server: RedisServer, ids: dict[str, str]
) -> None:
    url = own_server.url

    async def reset() -> None:
        async with vr.Client.from_url(url) as client:
            await client.redis.config_resetstat()

    anyio.run(reset)
    runner = CliRunner()
    commands = [
        ["stats"],
        ["stats", "--json"],
        ["stats", "-q", "orders"],
        ["workers"],
        ["jobs", "-q", "orders"],
        ["jobs", "-q", "orders", "-s", "dead", "--json"],
        ["job", "show", ids["dead"]],  # no -q: its queue is found in the registry
        ["job", "show", ids["done"], "-q", "orders", "--json"],
        ["schedules"],
        ["schedules", "-q", "orders"],
        ["limits"],
        ["limits", "-q", "orders", "--json"],
        ["jobs", "-q", "typo"],  # an unknown queue: the hint lists the queues there are
    ]
    for argv in commands:
        res = runner.invoke(app, [*argv, "--redis", url])
        assert res.exit_code == (1 if "typo" in argv else 0), (argv, res.output)
    assert "queues here: mail, orders" in res.stderr

    async def dashboard_session() -> dict[str, int]:
        async with vr.Client.from_url(url) as client:
            web = create_app(client, discovery_interval=0)  # the registry read on every overview
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
                paths = [
                    "/",
                    "/api/queues",
                    "/queues/orders",
                    "/queues/orders?state=dead",
                    "/queues/orders?q=nightly",
                    f"/queues/orders?q={ids['pending']}",
                    f"/queues/orders/jobs/{ids['dead']}",
                    "/queues/orders/schedules",
                    "/api/queues/orders/jobs?state=completed",
                    f"/api/queues/orders/jobs/{ids['done']}",
                    "/api/queues/orders/schedules",
                    "/api/queues/orders/workers",
                    "/api/queues/orders/limits",
                    # (Not the live feed, /queues/orders/events: events are on by
                    # default and it streams; it reads by XREAD, never SCAN.)
                    "/queues/nosuch",
                    "/",
                ]
                for path in paths:
                    r = await h.get(path)
                    assert r.status_code in (200, 204, 404), (path, r.status_code)
            return await _calls(client.redis)

    calls = anyio.run(dashboard_session)
    assert calls.get("zrange", 0) > 0 and calls.get("evalsha", 0) == 0  # ours, and only reads
    assert "scan" not in calls and "keys" not in calls, sorted(calls)


def test_an_open_overview_refresh_reads_a_bounded_number_of_commands(
    own_server: RedisServer, ids: dict[str, str]
) -> None:
    """Once open, a refresh of the overview costs COUNT_COMMANDS + 2 commands per queue
    (24: a 5 s refresh, 4.8 commands/s per queue shown, under issue 46's 5): the last
    hour's past minutes, the lease owners of finished jobs and Redis's clock are not
    read again."""

    async def go() -> tuple[int, int, list[int], dict[str, int]]:
        async with vr.Client.from_url(url) as client:
            web = create_app(client)
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
                first = (await h.get("/api/queues")).json()["queues"]
                await client.redis.config_resetstat()
                again = (await h.get("/api/queues")).json()["queues"]
                calls = await _calls(client.redis)
        assert [q["queue"] for q in again] == [q["queue"] for q in first] == ["mail", "orders"]
        assert again[1]["workers"] == first[1]["workers"] and first[1]["workers"]
        chart = again[1]["throughput_per_minute"]
        return (
            sum(n for name, n in calls.items() if name not in ("info", "config|resetstat")),
            len(again),
            [sum(chart["completed"]), sum(chart["dead"])],
            calls,
        )

    url = own_server.url
    total, queues, finished, calls = anyio.run(go)
    assert finished == [1, 1]  # the chart kept its bars
    # Per queue the reads of stats() and the two open bars (Redis's clock is read once
    # per discovery_interval, 30 s, not per refresh; a minute's first seconds add two).
    assert total <= (COUNT_COMMANDS + 2) * queues + 2 * queues, (total, calls)
    assert "time" not in calls


def _calls_in_python(path: Path) -> list[str]:
    """The SCAN / KEYS calls in a module: redis-py's scan/scan_iter/keys, or the raw command."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            if func.attr in ("scan", "scan_iter"):
                found.append(f"{path.name}:{node.lineno} {func.attr}")
            # dict.keys() takes no argument; redis-py's keys(pattern) is called on a client.
            if func.attr == "keys" and (node.args or node.keywords or "redis" in receiver):
                found.append(f"{path.name}:{node.lineno} keys")
            if func.attr == "execute_command" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and str(first.value).upper() in ("SCAN", "KEYS"):
                    found.append(f"{path.name}:{node.lineno} {first.value}")
    return found


def test_nothing_in_the_package_scans_but_the_rebuild() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert REBUILD in modules and len(modules) > 50
    offenders = [hit for path in modules if path != REBUILD for hit in _calls_in_python(path)]
    assert offenders == []
    assert [hit.split(" ")[1] for hit in _calls_in_python(REBUILD)] == ["scan", "scan"]
    scripts = sorted(LUA.rglob("*.lua"))
    assert scripts
    called = re.compile(r"redis\.p?call\(\s*['\"](scan|keys)['\"]", re.IGNORECASE)
    assert [p.name for p in scripts if called.search(p.read_text())] == []


def test_the_check_itself_sees_a_scan(tmp_path: Path) -> None:
    """The AST check above finds each form it looks for (so its silence means something)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "async def f(client, d):\n"
        "    async for k in client.redis.scan_iter(match='x*'):\n"
        "        pass\n"
        "    await client.redis.keys('venturi:*')\n"
        "    await client.redis.execute_command('SCAN', 0)\n"
        "    return list(d.keys())\n"
    )
    assert [hit.split(" ")[1] for hit in _calls_in_python(sample)] == ["scan_iter", "keys", "SCAN"]
