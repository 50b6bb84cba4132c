"""`venturi dead retry` by filter (issue 41): the count first, --dry-run, the filters, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob
from tests.test_cli import drain, qname, venturi
from venturi_redis.cli.admin import when

__all__ = ["qname"]  # the fixture, shared with tests/test_cli.py


class Flawed(vr.Task):
    KIND: ClassVar[str] = "flawed"


class FlawedJob(Flawed, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise ValueError("flawed input")


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def sq(rurl: str, qname: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(rurl) as sc:
        yield sc.queue(qname)


def test_dead_retry_counts_first_dry_runs_and_filters(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    doomed = sq.enqueue_many([Doomed() for _ in range(3)])
    flawed = sq.enqueue_many([Flawed() for _ in range(2)], max_failures=1)
    drain(rurl, qname, DoomedJob, FlawedJob)
    base = ("dead", "retry", "--redis", rurl, "-q", qname)

    res = venturi(*base, "--error-type", "ValueError", "--dry-run")
    assert res.exit_code == 0 and "2 dead job(s) match; nothing done (--dry-run)" in res.stdout
    res = venturi(*base, "--error-type", "ValueError", "--since", "1h", "--dry-run", "--json")
    assert json.loads(res.stdout) == {"queue": qname, "kind": None, "matched": 2, "dry_run": True}
    assert sq.counts()["dead"] == 5  # nothing done

    res = venturi(*base, "--note-contains", "flawed", "--limit", "1", "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["matched"] == 1 and doc["retried"] == flawed[:1]
    res = venturi(*base, "--error-type", "ValueError", "--all")
    assert res.exit_code == 0
    assert res.stdout.splitlines()[0] == f"queue {qname}: 1 dead job(s) match; retrying"
    assert "1 dead job(s) moved back to pending" in res.stdout
    res = venturi(*base, "--kind", "doomed", "--until", "2000-01-01T00:00Z", "--all")
    assert res.exit_code == 0 and "0 dead job(s) of kind doomed moved" in res.stdout
    res = venturi(*base, "--kind", "doomed", "--since", "1d", "--all")
    assert res.exit_code == 0 and "3 dead job(s) of kind doomed moved" in res.stdout
    assert sq.counts()["dead"] == 0
    assert {j.id for j in sq.list_jobs(state="pending")} == {*doomed, *flawed}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--since", "yesterday"], "give a duration back from now"),
        (["--since", "2026-12-06T10:00"], "has no timezone"),
        (["--since", "1h", "--until", "2h"], "is after until"),
        (["--kind", ""], "kind must be a non-empty string"),
    ],
)
def test_dead_retry_refuses_bad_filters_with_nothing_done(
    rurl: str, qname: str, sq: vr.SyncQueue, args: list[str], said: str
) -> None:
    sq.enqueue(Doomed())
    drain(rurl, qname, DoomedJob)
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname, "--all", *args)
    assert res.exit_code == 2 and said in res.stderr, res.output
    assert sq.counts()["dead"] == 1


def test_durations() -> None:
    assert when("90s", "--since") == timedelta(seconds=90)
    assert when("1.5h", "--since") == timedelta(minutes=90)
    assert when("2w", "--since") == timedelta(days=14)
    assert when(None, "--since") is None
