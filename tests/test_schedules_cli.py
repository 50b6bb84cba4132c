"""``venturi schedules`` and ``venturi schedule remove|pause|resume|trigger`` (issue 27)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo
from venturi_redis.cli.commands import app

runner = CliRunner()


def venturi(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


def define(url: str, queue: str, *schedules: tuple[str, dict[str, Any]]) -> None:
    async def go() -> None:
        async with vr.Client.from_url(url) as c:
            for sid, kwargs in schedules:
                await c.queue(queue).schedule(sid, Echo(text=sid), **kwargs)

    anyio.run(go)


def test_list_pause_resume_trigger_remove(rurl: str) -> None:
    q = f"cli-sched-{uuid.uuid4().hex[:8]}"
    tick = f"tick-{uuid.uuid4().hex[:8]}"  # found in the registry below: unique on the shared server
    define(rurl, q, ("nightly", {"cron": "0 3 * * *", "tz": "Europe/Berlin"}), (tick, {"every": 30}))
    res = venturi("schedules", "--redis", rurl, "-q", q, "--json")
    assert res.exit_code == 0, res.output
    docs = {d["id"]: d for d in json.loads(res.stdout)}
    assert docs["nightly"]["kind"] == "cron" and docs["nightly"]["cron"] == "0 3 * * *"
    assert docs["nightly"]["tz"] == "Europe/Berlin" and docs["nightly"]["next_at"]
    assert docs[tick]["kind"] == "every" and docs[tick]["every"] == 30.0
    assert docs[tick]["last_at"] is None and docs[tick]["last_job_id"] is None
    table = venturi("schedules", "--redis", rurl, "-q", q)
    assert table.exit_code == 0 and "0 3 * * * Europe/Berlin" in table.stdout and "every 30s" in table.stdout
    # Without -q the schedule is found among the registered queues.
    res = venturi("schedule", "pause", tick, "--redis", rurl, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"id": tick, "queue": q, "action": "pause", "done": True}
    assert "paused" in venturi("schedules", "--redis", rurl, "-q", q).stdout
    res = venturi("schedule", "trigger", tick, "--redis", rurl, "-q", q, "--json")
    job_id = json.loads(res.stdout)["job_id"]
    job = venturi("job", "show", job_id, "--redis", rurl, "-q", q, "--json")
    assert job.exit_code == 0 and json.loads(job.stdout)["job"]["schedule_id"] == tick
    res = venturi("schedule", "resume", tick, "--redis", rurl, "-q", q)
    assert res.exit_code == 0 and "resumed" in res.stdout and "next fire" in res.stdout
    res = venturi("schedule", "remove", tick, "--redis", rurl, "-q", q)
    assert res.exit_code == 0 and "removed" in res.stdout
    res = venturi("schedule", "remove", tick, "--redis", rurl, "-q", q)
    assert res.exit_code == 1 and "does not exist" in res.stderr
    res = venturi("schedule", "pause", "nope-nope", "--redis", rurl)
    assert res.exit_code == 1 and "not found in any queue" in res.stderr
    assert [d["id"] for d in json.loads(venturi("schedules", "--redis", rurl, "-q", q, "--json").stdout)] == [
        "nightly"
    ]


def test_a_queue_with_only_a_schedule_is_listed_by_stats(rurl: str) -> None:
    # Its only index key is `schedules:due`: `venturi stats` (and the dashboard's
    # overview, which discovers queues the same way) list it, with its counts at 0.
    q = f"cli-only-sched-{uuid.uuid4().hex[:8]}"
    define(rurl, q, ("weekly", {"cron": "0 3 * * 1"}))
    res = venturi("stats", "--redis", rurl, "--json")
    assert res.exit_code in (0, 1), res.output  # 1: another test's deliberately broken queue
    (row,) = [r for r in json.loads(res.stdout) if r["queue"] == q]
    assert sum(row["pending"].values()) == 0 and row["running"] == 0
