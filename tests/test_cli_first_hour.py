"""What a newcomer meets in `venturi`'s output (issue 33 item 8), against a real Redis.

A cut list says it was cut; the pending list says when each job may run; notes
keep their lines; a usage error is one line; the journal's times are ISO;
`job retry --json` says why nothing was done; `worker --help` keeps `[uvloop]`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis.cli.commands import app

runner = CliRunner()
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def qname() -> str:
    return f"first-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sq(rurl: str, qname: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(rurl) as sc:
        yield sc.queue(qname)


def venturi(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def test_jobs_says_when_the_limit_cut_the_list(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    for i in range(3):
        sq.enqueue(Echo(text=str(i)))
    cut = venturi("jobs", "-q", qname, "--redis", rurl, "--limit", "2")
    assert cut.exit_code == 0, cut.output
    assert "the first 2 shown, more exist" in cut.stdout and "--limit N" in cut.stdout
    whole = venturi("jobs", "-q", qname, "--redis", rurl, "--limit", "3")
    assert whole.exit_code == 0 and "3 job(s)" in whole.stdout and "more exist" not in whole.stdout
    as_json = venturi("jobs", "-q", qname, "--redis", rurl, "--limit", "2", "--json")
    assert as_json.exit_code == 0 and len(json.loads(as_json.stdout)) == 2
    assert "more exist" in as_json.stderr


def test_pending_list_shows_when_each_job_is_eligible(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Echo(text="later"), delay=3600)
    info = sq.get(jid)
    assert info is not None and info.eligible_at is not None
    expected = info.eligible_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    res = venturi("jobs", "-q", qname, "--redis", rurl, "-s", "pending")
    assert res.exit_code == 0, res.output
    assert "eligible" in res.stdout
    (row,) = [line for line in res.stdout.splitlines() if jid in line]
    assert expected in row


def test_multi_line_notes_print_as_lines(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Echo(text="first line\nsecond line\x1b"))

    async def drain() -> None:
        async with vr.Client.from_url(rurl) as c:
            w = make_worker(c.queue(qname), EchoJob)
            with anyio.fail_after(30):
                await w.run(until_idle=True)

    anyio.run(drain)
    for args in (["job", "show", jid, "-q", qname], ["jobs", "-q", qname, "-s", "completed"]):
        res = venturi(*args, "--redis", rurl)
        assert res.exit_code == 0, res.output
        assert "\\x0a" not in res.stdout
        lines = res.stdout.splitlines()
        first = next(i for i, line in enumerate(lines) if "first line" in line)
        assert "second line\\x1b" in lines[first + 1]  # the next line; other controls still escaped
        assert "\x1b" not in res.stdout


def test_usage_errors_are_one_line() -> None:
    for args in (["jobs"], ["jobs", "-q", "x", "--limit", "zero"], ["no-such-command"]):
        res = venturi(*args)
        assert res.exit_code == 2, res.output
        assert res.stdout == ""
        (line,) = res.stderr.splitlines()
        assert line.startswith("venturi: ") and "--help" in line
    # No arguments still prints the help (not an error line).
    res = venturi()
    assert "Usage" in res.output and "venturi: " not in res.output


def test_journal_shows_eligible_at_as_iso_time(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Echo(text="later"), delay=60)
    res = venturi("job", "show", jid, "-q", qname, "--redis", rurl)
    assert res.exit_code == 0, res.output
    assert re.search(r"eligible_at=" + ISO, res.stdout), res.stdout
    assert not re.search(r"eligible_at=\d{10,}", res.stdout)


def test_job_retry_json_says_why_on_stderr(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Echo(text="not dead"))
    res = venturi("job", "retry", jid, "-q", qname, "--redis", rurl, "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["retried"] is False
    assert f"job {jid} is pending, not dead" in res.stderr


def test_worker_help_keeps_the_uvloop_extra() -> None:
    res = venturi("worker", "--help")
    assert res.exit_code == 0
    assert "venturi_redis[uvloop]" in res.stdout


# -- a mistyped queue name (issue 33 item 5) ------------------------------------------------------


def test_a_mistyped_queue_is_refused_with_the_queues_that_exist(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    sq.enqueue(Echo(text="x"))
    typo = qname[:-1] + ("z" if qname[-1] != "z" else "y")
    keys_before = sorted(redis.Redis.from_url(rurl).keys(f"venturi:{{{typo}}}:*"))
    for args in (
        ["queue", "pause", typo],
        ["queue", "resume", typo],
        ["purge", "-q", typo, "--state", "dead"],
        ["dead", "retry", "-q", typo, "--all"],
    ):
        res = venturi(*args, "--redis", rurl)
        assert res.exit_code == 1, (args, res.output)
        (line,) = res.stderr.splitlines()
        assert f"queue {typo!r} is unknown" in line and f"did you mean {qname!r}" in line, line
        assert qname in line and "--create" in line
    # Nothing was written under the mistyped name (pause used to create its meta, resume its wake).
    assert sorted(redis.Redis.from_url(rurl).keys(f"venturi:{{{typo}}}:*")) == keys_before == []
    for args in (["stats", "-q", typo], ["jobs", "-q", typo]):
        res = venturi(*args, "--redis", rurl)
        assert res.exit_code == 1, (args, res.output)
        assert f"queue {typo!r} is unknown" in res.stderr and "--create" not in res.stderr
        assert res.stdout == ""


def test_create_acts_on_a_new_queue_and_a_known_one_needs_nothing(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    res = venturi("queue", "pause", qname, "--redis", rurl, "--create")
    assert res.exit_code == 0, res.output
    assert sq.stats().paused
    # Paused, it exists (its meta hash): no --create needed; nor once it holds a job.
    jid = sq.enqueue(Echo(text="x"))
    res = venturi("queue", "resume", qname, "--redis", rurl)
    assert res.exit_code == 0, res.output
    assert not sq.stats().paused
    res = venturi("jobs", "-q", qname, "--redis", rurl)
    assert res.exit_code == 0 and "1 job(s)" in res.stdout and jid in res.stdout


def test_counts_include_cancelled(sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Echo(text="never"))
    assert sq.cancel(jid) == "cancelled"
    counts = sq.counts()
    assert counts["cancelled"] == 1 and counts["pending"] == 0
