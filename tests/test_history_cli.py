"""``venturi stats --history SPAN`` and ``venturi queue history QUEUE on|off`` (issue 41)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Doomed, Echo
from venturi_redis.cli.commands import app
from venturi_redis.cli.history import parse_span

runner = CliRunner()


def venturi(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


def test_spans() -> None:
    assert parse_span("1h") == timedelta(hours=1)
    assert parse_span("1h30m") == timedelta(minutes=90)
    assert parse_span(" 2D ") == timedelta(days=2)
    for bad in ("", "1", "h", "1x", "1h 30m", "-1h", "1.5h"):
        with pytest.raises(vr.ConfigurationError, match="not a span"):
            parse_span(bad)


def test_switch_then_history_as_json_and_a_table(rurl: str) -> None:
    name = f"hist-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(rurl) as sc:
        sc.queue(name).enqueue(Echo(text="before"))  # the queue exists; history off: not counted
    res = venturi("queue", "history", name, "on", "--redis", rurl)
    assert res.exit_code == 0 and res.stdout.strip() == f"queue {name}: history on", res.output
    with vr.SyncClient(rurl) as sc:
        sc.queue(name).enqueue_many([Echo(text="a"), Echo(text="b"), Doomed()])
    res = venturi("stats", "--redis", rurl, "-q", name, "--history", "10m", "--json")
    assert res.exit_code == 0, res.output
    points = json.loads(res.stdout)[name]
    assert len(points) == 10 and sum(p["enqueued"] for p in points) == 3
    assert set(points[0]) == {"at", "enqueued", "completed", "failed", "dead", "run_ms_mean"}
    res = venturi("stats", "--redis", rurl, "-q", name, "--history", "10m", "--kind", "echo", "--json")
    assert sum(p["enqueued"] for p in json.loads(res.stdout)[name]) == 2
    table = venturi("stats", "--redis", rurl, "-q", name, "--history", "1h", "--step", "15m")
    assert table.exit_code == 0, table.output
    assert "enqueued" in table.stdout and "run ms" in table.stdout and "by 15m" in table.stdout
    off = venturi("queue", "history", name, "off", "--redis", rurl, "--json")
    assert json.loads(off.stdout) == {"queue": name, "history": False}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--history", "31d"], "at most 30 days"),
        (["--history", "1h", "--step", "90s"], "whole multiple of a minute"),
        (["--history", "3d", "--step", "30m"], "whole multiple of an hour"),
        (["--history", "soon"], "not a span"),
    ],
)
def test_bad_spans_are_one_line_errors(rurl: str, args: list[str], message: str) -> None:
    name = f"hist-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(rurl) as sc:
        sc.queue(name).enqueue(Echo(text="x"))
    res = venturi("stats", "--redis", rurl, "-q", name, *args)
    assert res.exit_code != 0 and message in res.stderr and "Traceback" not in res.output, res.output
