"""`venturi dead retry` by filter (issue 41): the count first, --dry-run, the filters, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from tests.test_cli import drain, qname, venturi
from venturi_redis.cli.bulk import when

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
    assert json.loads(res.stdout) == {
        "queue": qname,
        "state": "dead",
        "kind": None,
        "matched": 2,
        "dry_run": True,
    }
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


# -- venturi cancel and venturi purge by filter -------------------------------------------------


def test_cancel_counts_first_dry_runs_and_cancels_what_matches(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    """A flood of bad jobs stopped from the shell, the rest left to run: before, only
    `queue.cancel_jobs` in Python could (no CLI), and `venturi purge` took no filter."""
    echoes = sq.enqueue_many([Echo(text=str(i)) for i in range(3)])
    doomed = sq.enqueue_many([Doomed() for _ in range(4)])
    base = ("cancel", "--redis", rurl, "-q", qname)

    res = venturi(*base, "--kind", "doomed", "--dry-run")
    assert res.exit_code == 0, res.output
    assert (
        res.stdout.strip()
        == f"queue {qname}: 4 pending job(s) of kind doomed match; nothing done (--dry-run)"
    )
    res = venturi(*base, "--kind", "doomed", "--since", "1h", "--dry-run", "--json")
    doc = {"queue": qname, "state": "pending", "kind": "doomed", "matched": 4, "dry_run": True}
    assert json.loads(res.stdout) == doc
    assert sq.counts()["pending"] == 7  # nothing done

    res = venturi(*base, "--kind", "doomed", "--limit", "1", "--json")
    got = json.loads(res.stdout)
    assert res.exit_code == 0 and got["matched"] == 1 and got["cancelled"] == doomed[:1], res.output
    res = venturi(*base, "--kind", "doomed", "--all")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        f"queue {qname}: 3 pending job(s) of kind doomed match; cancelling",
        f"queue {qname}: 3 pending job(s) of kind doomed cancelled",
    ]
    assert {j.id for j in sq.list_jobs(state="cancelled")} == set(doomed)
    assert {j.id for j in sq.list_jobs(state="pending")} == set(echoes)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "say how many: --all cancels every pending job"),
        (["--all", "--state", "completed"], "--state must be one of pending, suspended, waiting, running"),
        (["--all", "--since", "soon"], "give a duration back from now"),
        (["--all", "--since", "1h", "--until", "2h"], "is after until"),
    ],
)
def test_cancel_refuses_bad_input_with_nothing_done(
    rurl: str, qname: str, sq: vr.SyncQueue, args: list[str], said: str
) -> None:
    sq.enqueue(Doomed())
    res = venturi("cancel", "--redis", rurl, "-q", qname, *args)
    assert res.exit_code == 2 and said in res.stderr, res.output
    assert sq.counts()["pending"] == 1


def test_purge_by_filter_counts_first_and_removes_only_what_matches(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    echoes = sq.enqueue_many([Echo(text=str(i)) for i in range(3)])
    flawed = sq.enqueue_many([Flawed() for _ in range(2)], max_failures=1)
    doomed = sq.enqueue_many([Doomed() for _ in range(2)])
    drain(rurl, qname, EchoJob, FlawedJob, DoomedJob)
    base = ("purge", "--redis", rurl, "-q", qname, "--state", "dead")

    res = venturi(*base, "--error-type", "ValueError", "--dry-run")
    assert res.exit_code == 0 and "2 dead job(s) match; nothing done (--dry-run)" in res.stdout, res.output
    res = venturi(*base, "--error-type", "ValueError", "--older-than", "3600", "--dry-run")
    assert "0 dead job(s) match" in res.stdout, res.output  # none died an hour ago
    assert sq.counts()["dead"] == 4

    res = venturi(*base, "--error-type", "ValueError", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout) == {"queue": qname, "state": "dead", "removed": 2}
    assert {j.id for j in sq.list_jobs(state="dead")} == set(doomed)
    assert all(sq.get(job_id) is None for job_id in flawed)
    res = venturi("purge", "--redis", rurl, "-q", qname, "--state", "completed", "--kind", "doomed")
    assert res.stdout.splitlines()[-1] == f"queue {qname}: removed 0 completed job(s)", res.output
    assert {j.id for j in sq.list_jobs(state="completed")} == set(echoes)
