"""``venturi queue events QUEUE on|off`` (issue 30): the operator's switch of a queue's event stream."""

from __future__ import annotations

import json
import re
import uuid

import redis
from typer.testing import CliRunner

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Doomed, Echo
from venturi_redis.cli.commands import app

runner = CliRunner()


def test_switch_on_and_off(redis_server: RedisServer) -> None:
    name = f"cli-ev-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_server.url)
    url = redis_server.url
    res = runner.invoke(app, ["queue", "events", name, "on", "--maxlen", "500", "--redis", url, "--create"])
    assert res.exit_code == 0, res.output
    assert f"queue {name}: events on, capped near 500 entries" in res.output
    assert r.hget(f"venturi:{{{name}}}:meta", "events") == b"500"
    res = runner.invoke(app, ["queue", "events", name, "off", "--redis", url, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"queue": name, "events": False, "maxlen": 0}
    assert r.hget(f"venturi:{{{name}}}:meta", "events") == b"0"
    res = runner.invoke(app, ["queue", "events", name, "maybe", "--redis", url])
    assert res.exit_code == 2 and "expected 'on' or 'off'" in res.output
    r.close()


def test_follow_a_queue(redis_server: RedisServer) -> None:
    name = f"cli-ev-{uuid.uuid4().hex[:8]}"
    url = redis_server.url
    with vr.SyncClient(url) as sc:
        q = sc.queue(name)
        runner.invoke(app, ["queue", "events", name, "on", "--redis", url, "--create"])
        first = q.enqueue(Echo(text="one"))
        q.enqueue(Doomed())
        second = q.enqueue(Echo(text="two"))
    res = runner.invoke(
        app, ["events", name, "--since", "0", "--count", "2", "--kind", "echo", "--redis", url]
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split()[1:4] for line in lines] == [
        ["enqueued", first, "echo"],
        ["enqueued", second, "echo"],
    ]
    # Each line starts with its time as every table shows one: UTC to the millisecond, with a Z.
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line.split()[0]) for line in lines), (
        lines
    )
    res = runner.invoke(app, ["events", name, "--since", "0", "--count", "2", "--json", "--redis", url])
    on, doc = (json.loads(line) for line in res.output.splitlines())
    assert (on["event"], on["job_id"]) == ("events_on", "")
    assert (doc["event"], doc["job_id"], doc["run"]) == ("enqueued", first, 0)
    res = runner.invoke(app, ["events", "no-such-queue-here", "--redis", url])
    assert res.exit_code == 1 and "unknown" in res.output.lower()


def test_follow_a_queue_whose_events_are_off_exits_with_the_hint(redis_server: RedisServer) -> None:
    # It used to print the hint and wait forever for events that could not come (issue 39).
    name = f"cli-ev-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as sc:
        sc.queue(name).enqueue(Echo(text="one"))
        sc.queue(name).set_events(False)  # on by default: switched off
    res = runner.invoke(app, ["events", name, "--redis", redis_server.url])
    assert res.exit_code == 1
    assert res.stderr == f"venturi: events are off for queue {name}: venturi queue events {name} on\n"
    assert res.stdout == ""
