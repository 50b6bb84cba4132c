"""``venturi queue events QUEUE on|off`` (issue 30): the operator's switch of a queue's event stream."""

from __future__ import annotations

import json
import uuid

import redis
from typer.testing import CliRunner

from tests.servers import RedisServer
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
