"""The `venturi` command, against a real Redis: every command, its JSON, its error paths."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import redis
import typer
from pydantic import Field
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer, free_port
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis._producer.sharded import partition_names
from venturi_redis._store.keys import QueueKeys
from venturi_redis.cli.app import Fail, one_line_errors
from venturi_redis.cli.commands import app
from venturi_redis.cli.output import clean

runner = CliRunner()


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def qname() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sq(rurl: str, qname: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(rurl) as sc:
        yield sc.queue(qname)


def venturi(*args: str) -> Any:
    return runner.invoke(app, list(args))


def drain(url: str, name: str, *handlers: type[Any]) -> None:
    async def go() -> None:
        async with vr.Client.from_url(url) as c:
            w = make_worker(c.queue(name), *handlers)
            with anyio.fail_after(30):
                await w.run(until_idle=True)

    anyio.run(go)


# -- stats --------------------------------------------------------------------------------------


def test_stats_json_and_table(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    sq.enqueue(Echo(text="a"), priority="high")
    sq.enqueue(Echo(text="b"), delay=3600)
    res = venturi("stats", "--redis", rurl, "--queue", qname, "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["queue"] == qname and row["pending"]["high"] == 1 and row["delayed"] == 1
    assert row["retrying"] == 0
    assert row["paused"] is False
    table = venturi("stats", "--redis", rurl, "-q", qname)
    assert table.exit_code == 0 and qname in table.stdout and "lag" in table.stdout
    # without --queue, every queue on the server is found
    every = json.loads(venturi("stats", "--redis", rurl, "--json").stdout)
    assert qname in [r["queue"] for r in every]


def test_stats_shows_the_jobs_waiting_on_their_order_key(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    from tests.test_ordering import Step

    for n in range(3):
        sq.enqueue(Step(key="acct-42", n=n))  # one holder, two waiting behind it
    sq.enqueue(Step(key="acct-7"))
    res = venturi("stats", "--redis", rurl, "--queue", qname, "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["ordered"] == 2 and row["pending"]["normal"] == 2
    assert row["ordered"] == sq.counts()["ordered"]
    table = venturi("stats", "--redis", rurl, "-q", qname)
    assert table.exit_code == 0, table.output
    header = next(line for line in table.stdout.splitlines() if "queue" in line and "limited" in line)
    assert header.split().index("ordered") == header.split().index("limited") + 1
    (line,) = [ln for ln in table.stdout.splitlines() if ln.strip().startswith(qname)]
    cells = line.split()
    # queue, crit, high, normal, low, delayed, retry, wait, limited, ordered (paused is empty)
    assert cells[3] == "2" and cells[9] == "2", line


def test_stats_of_every_queue_survives_one_with_a_wrong_type_key(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    sq.enqueue(Echo(text="a"))
    broken = f"{qname}-broken"
    with vr.SyncClient(rurl) as client:
        client.queue(broken).enqueue(Echo(text="b"))  # found by discovery through its pending set
    with redis.Redis.from_url(rurl) as r:
        r.set(f"venturi:{{{broken}}}:pending:low", "not a sorted set")
    res = venturi("stats", "--redis", rurl, "--json")
    assert res.exit_code == 1, res.output
    shown = [r["queue"] for r in json.loads(res.stdout)]
    assert qname in shown and broken not in shown
    (line,) = [ln for ln in res.stderr.splitlines() if broken in ln]
    assert line.startswith(f"venturi: queue {broken!r}: cannot read its stats: ") and "WRONGTYPE" in line
    table = venturi("stats", "--redis", rurl)
    assert table.exit_code == 1 and qname in table.stdout and "Traceback" not in table.output


def test_redis_url_defaults_to_env(
    rurl: str, qname: str, sq: vr.SyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    sq.enqueue(Echo(text="a"))
    monkeypatch.setenv("REDIS_URL", rurl)
    res = venturi("stats", "-q", qname, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["eligible"] == 1


def test_unreachable_redis_is_one_line_with_password_hidden() -> None:
    port = free_port()
    res = venturi("stats", "--redis", f"redis://:hunter2@127.0.0.1:{port}/0", "--json")
    assert res.exit_code == 1
    assert res.stderr.startswith("venturi: cannot reach Redis at redis://:***@127.0.0.1:")
    assert "hunter2" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_unreachable_sentinels_are_named_by_address_not_by_client_repr() -> None:
    """redis-py puts each sentinel client's repr (~1 KB of settings) in its MasterNotFoundError."""
    ports = free_port(), free_port()
    url = f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/mymaster/0"
    res = venturi("stats", "--redis", url)
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "No master found for 'mymaster'" in res.stderr
    assert "ConnectionPool" not in res.stderr and "redis.asyncio" not in res.stderr, res.stderr
    assert len(res.stderr) < 600, res.stderr


def test_bad_url_and_bad_queue_name_are_usage_errors(rurl: str) -> None:
    res = venturi("stats", "--redis", "http://example.org")
    assert res.exit_code == 2 and "unsupported URL" in res.stderr
    res = venturi("jobs", "--redis", rurl, "-q", "bad name!")
    assert res.exit_code == 2 and "invalid queue name" in res.stderr


# -- jobs and job show ------------------------------------------------------------------------------


def test_jobs_filters_and_errors(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    echo = sq.enqueue(Echo(text="a"))
    dead = sq.enqueue(Doomed())
    drain(rurl, qname, EchoJob, DoomedJob)
    pend = sq.enqueue(Echo(text="b"))
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--json")
    # every state, in order: pending, ..., completed, dead
    assert [j["id"] for j in json.loads(res.stdout)] == [pend, echo, dead]
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--state", "dead", "--json")
    (j,) = json.loads(res.stdout)
    assert j["id"] == dead and j["note"] == "resource gone" and j["state"] == "dead"
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--kind", "echo", "--limit", "1", "--json")
    assert len(json.loads(res.stdout)) == 1
    table = venturi("jobs", "--redis", rurl, "-q", qname, "-s", "completed")
    assert table.exit_code == 0 and echo in table.stdout and dead not in table.stdout
    bad = venturi("jobs", "--redis", rurl, "-q", qname, "--state", "sleeping")
    assert bad.exit_code == 2 and "unknown state 'sleeping'" in bad.stderr
    assert "retrying, delayed, limited" in bad.stderr
    # The parts of pending that `venturi stats` counts are listed too (issue 39).
    later = sq.enqueue(Echo(text="c"), delay=3600)
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--state", "delayed", "--json")
    assert res.exit_code == 0 and [j["id"] for j in json.loads(res.stdout)] == [later]
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--state", "retrying", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    assert venturi("jobs", "--redis", rurl).exit_code == 2  # --queue is required


def test_job_show_with_and_without_queue(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Doomed())
    drain(rurl, qname, DoomedJob)
    res = venturi("job", "show", jid, "--redis", rurl, "--json")  # found among the registered queues
    doc = json.loads(res.stdout)
    assert doc["job"]["queue"] == qname and doc["job"]["state"] == "dead"
    assert [e["event"] for e in doc["journal"]] == ["enqueued", "claimed", "dead"]
    assert doc["journal"][-1]["attachment"] == {"status": 410}
    table = venturi("job", "show", jid, "--redis", rurl, "-q", qname)
    assert table.exit_code == 0
    for text in ("doomed", "resource gone", "reason=permanent", "journal (3 entries)"):
        assert text in table.stdout
    # The death's exception type is a detail; its traceback tail is printed under the table.
    assert "error_type=venturi_redis.TaskError" in table.stdout
    head, _, tail = table.stdout.partition("traceback of the last failure (run 1, venturi_redis.TaskError)")
    assert "journal (3 entries)" in head and "Traceback (most recent call last):" in tail
    assert 'raise vr.TaskError.permanent("resource gone")' in tail
    assert "traceback" in doc["journal"][-1]["details"]


def test_job_show_errors(rurl: str, qname: str) -> None:
    res = venturi("job", "show", "01J0000000000000000000NONE", "--redis", rurl)
    assert res.exit_code == 1 and "not found in any of the" in res.stderr
    assert "queue(s) in the registry" in res.stderr and "venturi queues rebuild" in res.stderr
    res = venturi("job", "show", "01J0000000000000000000NONE", "--redis", rurl, "-q", qname)
    assert res.exit_code == 1 and f"not found in queue {qname}" in res.stderr
    res = venturi("job", "show", "*", "--redis", rurl)
    assert res.exit_code == 2 and "is not a job id" in res.stderr


def test_user_strings_cannot_drive_the_terminal(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    evil = "\x1b[2J\x1b]0;pwned\x07[bold red]markup[/]\u202etxt.exe"
    jid = sq.enqueue(Echo(text=evil))
    drain(rurl, qname, EchoJob)  # the note of the completed run is the text itself
    for args in (["job", "show", jid], ["jobs", "-q", qname, "-s", "completed"]):
        res = (
            venturi(*args, "--redis", rurl, "-q", qname)
            if args[0] == "job"
            else venturi(*args, "--redis", rurl)
        )
        assert res.exit_code == 0
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\u202e" not in res.stdout
        assert "[bold red]markup[/]" in res.stdout  # shown literally, not as rich markup
    assert clean("a\x1bb\nc\u200bd") == "a\\x1bb\\x0ac\\u200bd"


# -- corrupt data: every listing and show command still answers ------------------------------------

# One bad value of each kind of field a job hash holds: counts, times, enums, msgpack documents.
CORRUPT = [
    ("failures", b"xyz"),
    ("run_count", b"1.5"),
    ("state", b"zombie"),
    ("priority", b"urgent"),
    ("created_at", b"yesterday"),
    ("updated_at", b"nan"),
    ("eligible_at", b"1e16"),
    ("finished_at", b"99999999999999999999"),
    ("lease_expires", b"soon"),
    ("payload", b"\xc1\xff garbage"),
    ("carry", b"\xc1"),
    ("attachment", b"\xc1"),
    ("result", b"\xc1"),
    ("output", b"\xc1"),
]


def no_traceback(res: Any) -> None:
    """The command ended by itself (exit status), not by an exception escaping it."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    # `job show` prints the handler's own traceback under its heading: not a CLI crash.
    assert "Traceback" not in res.output.partition("traceback of the last failure")[0]
    assert "Traceback" not in res.stderr


def job_key(qname: str, job_id: str) -> str:
    return QueueKeys.for_queue(qname).job(job_id)


@pytest.mark.parametrize(("field", "raw"), CORRUPT, ids=[f for f, _ in CORRUPT])
def test_one_corrupt_field_is_shown_marked_and_breaks_nothing(
    rurl: str, qname: str, sq: vr.SyncQueue, field: str, raw: bytes
) -> None:
    bad, other = sq.enqueue_many([Doomed(), Doomed()])
    drain(rurl, qname, DoomedJob)
    fine = sq.enqueue(Echo(text="fine"))
    with redis.Redis.from_url(rurl) as r:
        r.hset(job_key(qname, bad), field, raw)
    shown = repr(raw.decode("utf-8", "replace"))

    res = venturi("jobs", "--redis", rurl, "-q", qname, "--json")
    no_traceback(res)
    docs = {d["id"]: d for d in json.loads(res.stdout)}
    assert set(docs) == {bad, other, fine}
    assert docs[bad]["corrupt"] == {field: raw.decode("utf-8", "replace")}
    assert docs[other]["corrupt"] == {} and docs[fine]["corrupt"] == {}
    assert docs[bad]["state"] == "dead"  # a corrupt state: the index it was listed from

    res = venturi("jobs", "--redis", rurl, "-q", qname)
    no_traceback(res)
    assert res.exit_code == 0 and bad in res.stdout and fine in res.stdout
    assert f"{bad} ({field})" in res.stderr
    if field in ("failures", "run_count", "state", "priority", "updated_at"):
        assert f"corrupt:{shown}" in res.stdout  # in its column

    res = venturi("job", "show", bad, "--redis", rurl, "-q", qname)
    no_traceback(res)
    assert res.exit_code == 0 and "corrupt" in res.stdout and "journal (3 entries)" in res.stdout
    assert shown in res.stdout
    doc = json.loads(venturi("job", "show", bad, "--redis", rurl, "--json").stdout)
    assert doc["job"]["corrupt"] == {field: raw.decode("utf-8", "replace")}

    for args in (
        ["stats", "-q", qname],
        ["job", "cancel", bad, "-q", qname],
        ["job", "retry", bad, "-q", qname],
        ["dead", "retry", "-q", qname, "--all"],
        ["purge", "-q", qname, "--state", "dead"],
    ):
        res = venturi(*args, "--redis", rurl)
        no_traceback(res)
        assert res.exit_code in (0, 1), (args, res.output)


def test_unreadable_keys_are_reported_not_raised(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    bad, other = sq.enqueue_many([Doomed(), Doomed()])
    drain(rurl, qname, DoomedJob)
    with redis.Redis.from_url(rurl) as r:
        r.delete(job_key(qname, bad))
        r.set(job_key(qname, bad), "not a hash")  # a wrong-type job key
        journal = job_key(qname, other).replace(":job:", ":journal:")
        r.xadd(journal, {"event": "failed", "at": "noon", "run": "two"})  # a hand-written entry

    res = venturi("jobs", "--redis", rurl, "-q", qname, "--json")
    no_traceback(res)
    docs = {d["id"]: d for d in json.loads(res.stdout)}
    assert set(docs) == {bad, other} and "WRONGTYPE" in docs[bad]["corrupt"]["key"]
    assert docs[bad]["state"] == "dead"
    res = venturi("jobs", "--redis", rurl, "-q", qname)
    assert res.exit_code == 0 and f"{bad} (key)" in res.stderr
    # --kind reads each hash's kind: the unreadable one is not of any kind
    res = venturi("jobs", "--redis", rurl, "-q", qname, "--kind", "doomed", "--json")
    assert [d["id"] for d in json.loads(res.stdout)] == [other]

    res = venturi("job", "show", bad, "--redis", rurl, "-q", qname)
    no_traceback(res)
    assert res.exit_code == 1 and "cannot be read" in res.stderr and "WRONGTYPE" in res.stderr

    res = venturi("job", "show", other, "--redis", rurl, "-q", qname)
    no_traceback(res)
    assert res.exit_code == 0 and "journal (4 entries)" in res.stdout
    assert "corrupt:'noon'" in res.stdout and "corrupt:'two'" in res.stdout
    doc = json.loads(venturi("job", "show", other, "--redis", rurl, "-q", qname, "--json").stdout)
    assert doc["journal"][-1]["corrupt"] == {"at": "noon", "run": "two"}


def test_a_pending_job_with_a_corrupt_created_at_is_shown(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    """Never claimed, it has no journal stream yet: its `enqueued` entry is made from
    the hash, whose created_at does not parse (it raised ValueError)."""
    bad = sq.enqueue(Echo(text="x"))
    with redis.Redis.from_url(rurl) as r:
        r.hset(job_key(qname, bad), "created_at", "yesterday")
    res = venturi("job", "show", bad, "--redis", rurl, "-q", qname)
    no_traceback(res)
    assert res.exit_code == 0 and "corrupt:'yesterday'" in res.stdout and "journal (1 entries)" in res.stdout
    doc = json.loads(venturi("job", "show", bad, "--redis", rurl, "-q", qname, "--json").stdout)
    assert doc["job"]["corrupt"] == {"created_at": "yesterday"}
    assert doc["journal"][0]["corrupt"] == {"at": "yesterday"}


# -- redaction ------------------------------------------------------------------------------------


class Login(vr.Task):
    KIND: ClassVar[str] = "login"
    user: str
    token: str = Field(json_schema_extra={"sensitive": True})


class LoginJob(Login, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.user == "bob":
            raise RuntimeError(f"401 for {self.user}: token {self.token} refused")
        raise vr.TaskError.permanent(f"login {self.user}/{self.token} revoked")


TOKEN = "tok-s3cr3t-42"


class Sign(vr.Task):
    KIND: ClassVar[str] = "sign"
    key: str


class SignJob(Sign, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed_with("signed", result={"signature": self.key[::-1]})


def test_payload_values_are_masked_unless_asked_for(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Sign(key=TOKEN))
    drain(rurl, qname, SignJob)
    pend = sq.enqueue(Sign(key=TOKEN))
    for args in (["job", "show", jid], ["job", "show", jid, "--json"], ["jobs", "--json"]):
        res = venturi(*args, "--redis", rurl, "-q", qname)
        assert res.exit_code == 0 and TOKEN not in res.stdout and TOKEN[::-1] not in res.stdout, args
    doc = json.loads(venturi("jobs", "--redis", rurl, "-q", qname, "--json").stdout)
    assert [(d["id"], d["payload"], d["result"]) for d in doc] == [
        (pend, {"key": "***"}, None),
        (jid, {"key": "***"}, {"signature": "***"}),
    ]
    table = venturi("job", "show", jid, "--redis", rurl, "-q", qname).stdout
    assert '{"key": "***"}' in table and "--show-payload shows them" in table

    shown = venturi("jobs", "--redis", rurl, "-q", qname, "--json", "--show-payload")
    assert [d["payload"]["key"] for d in json.loads(shown.stdout)] == [TOKEN, TOKEN]
    shown = venturi("job", "show", jid, "--redis", rurl, "-q", qname, "--show-payload")
    assert shown.exit_code == 0 and TOKEN in shown.stdout and TOKEN[::-1] in shown.stdout
    assert "--show-payload shows" not in shown.stdout
    doc = json.loads(venturi("job", "show", pend, "--redis", rurl, "--json", "--show-payload").stdout)
    assert doc["job"]["payload"] == {"key": TOKEN}


def test_sensitive_fields_never_reach_a_note(
    rurl: str, qname: str, sq: vr.SyncQueue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="venturi_redis")
    assert Login.sensitive_fields() == {"token"}
    ann, bob = sq.enqueue_many([Login(user="ann", token=TOKEN), Login(user="bob", token=TOKEN)])

    async def go() -> None:
        async with vr.Client.from_url(rurl) as c:
            w = make_worker(c.queue(qname), LoginJob, max_failures=2)
            with anyio.fail_after(30):
                await w.run(until_idle=True)

    anyio.run(go)
    assert sq.get(ann).note == "login ann/*** revoked"  # type: ignore[union-attr]
    notes = [e.note for e in sq.journal(bob) if e.event == "failed"]
    assert notes == ["401 for bob: token *** refused"] * 2
    assert TOKEN not in caplog.text and "token *** refused" in caplog.text  # nor in the worker's log
    for args in (["jobs", "-q", qname, "--json", "--show-payload"], ["job", "show", bob, "-q", qname]):
        res = venturi(*args, "--redis", rurl)
        assert res.exit_code == 0 and "*** refused" in res.stdout
    # only the payload itself holds the secret, and only --show-payload prints it
    assert TOKEN not in venturi("job", "show", bob, "--redis", rurl, "--json").stdout
    assert TOKEN in venturi("job", "show", bob, "--redis", rurl, "--json", "--show-payload").stdout


# -- retry, cancel, dead retry, purge, pause ------------------------------------------------------------


def test_job_retry(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    jid = sq.enqueue(Doomed())
    drain(rurl, qname, DoomedJob)
    res = venturi("job", "retry", jid, "--redis", rurl)
    assert res.exit_code == 0 and "dead -> pending" in res.stdout
    assert sq.get(jid).state == vr.JobState.PENDING  # type: ignore[union-attr]
    again = venturi("job", "retry", jid, "--redis", rurl, "-q", qname)
    assert again.exit_code == 1 and "is pending, not dead" in again.stderr
    doc = json.loads(venturi("job", "retry", jid, "--redis", rurl, "-q", qname, "--json").stdout)
    assert doc == {"id": jid, "queue": qname, "retried": False, "state": "pending"}
    gone = venturi("job", "retry", "01J0000000000000000000NONE", "--redis", rurl, "-q", qname)
    assert gone.exit_code == 1 and "does not exist" in gone.stderr


def test_job_cancel_pending_running_finished(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    pend = sq.enqueue(Echo(text="a"))
    res = venturi("job", "cancel", pend, "--redis", rurl)
    assert res.exit_code == 0 and "cancelled" in res.stdout
    again = venturi("job", "cancel", pend, "--redis", rurl, "-q", qname, "--json")
    assert again.exit_code == 1 and json.loads(again.stdout)["result"] == "finished"
    # Why nothing was done goes to stderr with --json too, as job retry says it.
    assert again.stderr == f"venturi: job {pend} is cancelled; nothing done\n"
    said = venturi("job", "cancel", pend, "--redis", rurl, "-q", qname)
    assert said.exit_code == 1 and said.stderr == f"venturi: job {pend} is cancelled; nothing done\n"
    none = venturi("job", "cancel", "01NOSUCHJOB0000000000000000", "--redis", rurl, "-q", qname)
    assert none.stderr == "venturi: job 01NOSUCHJOB0000000000000000 does not exist; nothing done\n"
    running = sq.enqueue(Echo(text="b"))

    async def claim() -> None:
        async with vr.Client.from_url(rurl) as c:
            await make_worker(c.queue(qname), EchoJob)._runners[0].claim(1)

    anyio.run(claim)
    res = venturi("job", "cancel", running, "--redis", rurl, "-q", qname)
    assert res.exit_code == 0 and "will ask it to stop" in res.stdout
    assert [e.event for e in sq.journal(running)][-1] == "cancel_requested"


def test_job_update_priority_and_delay(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    pend = sq.enqueue(Echo(text="a"), delay=3600)
    res = venturi("job", "update", pend, "--priority", "high", "--delay", "0", "--redis", rurl)
    assert res.exit_code == 0 and "priority high, eligible at" in res.stdout
    # A time as every table shows one: UTC to the millisecond, with a Z.
    assert re.search(r"eligible at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", res.stdout.strip()), res.stdout
    info = sq.get(pend)
    assert info is not None and info.priority is vr.Priority.HIGH
    assert sq.journal(pend)[-1].details["changed"] == "priority,eligible_at"
    doc = venturi("job", "update", pend, "--delay", "60", "--redis", rurl, "-q", qname, "--json")
    assert doc.exit_code == 0 and json.loads(doc.stdout)["updated"] is True
    bad = venturi("job", "update", pend, "--priority", "urgent", "--redis", rurl, "-q", qname)
    assert bad.exit_code == 2 and "urgent" in bad.stderr and "Traceback" not in bad.stderr
    empty = venturi("job", "update", pend, "--redis", rurl, "-q", qname)
    assert empty.exit_code == 2 and "--priority or --delay" in empty.stderr
    assert sq.cancel(pend) == "cancelled"
    gone = venturi("job", "update", pend, "--priority", "low", "--redis", rurl, "-q", qname)
    assert gone.exit_code == 1
    assert gone.stderr == f"venturi: job {pend} is cancelled, not pending in queue {qname}; nothing done\n"


class Digest(vr.Task):
    KIND: ClassVar[str] = "digest"

    def dedup_key(self) -> str | None:
        return "daily"

    @classmethod
    def dedup_window(cls) -> float:
        return 3600


class DigestJob(Digest, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


def test_job_show_says_until_when_a_throttled_key_is_held(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    job = sq.enqueue(Digest())
    drain(rurl, qname, DigestJob)
    res = venturi("job", "show", job, "--redis", rurl, "-q", qname)
    assert res.exit_code == 0 and "dedup held until" in res.stdout
    doc = json.loads(venturi("job", "show", job, "--redis", rurl, "-q", qname, "--json").stdout)
    assert doc["job"]["dedup_until"]
    assert sq.enqueue(Digest()) == job  # inside the hour


def test_dead_retry(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    ids = sq.enqueue_many([Doomed() for _ in range(3)])
    drain(rurl, qname, DoomedJob)
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname)
    assert res.exit_code == 2 and "--all" in res.stderr
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname, "--limit", "1", "--json")
    assert json.loads(res.stdout)["retried"] == ids[:1]
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname, "--kind", "echo", "--all")
    assert res.exit_code == 0 and "0 dead job(s) of kind echo" in res.stdout
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname, "--kind", "doomed", "--all")
    assert res.exit_code == 0 and "2 dead job(s)" in res.stdout
    assert sq.counts()["dead"] == 0


def test_retry_and_cancel_of_a_corrupt_job(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    """Issue 26: a job whose journal was overwritten is refused, named, exit 1, nothing
    written; `dead retry` moves the healthy dead jobs and warns about it."""
    ids = sq.enqueue_many([Doomed() for _ in range(3)])
    drain(rurl, qname, DoomedJob)
    pend = sq.enqueue(Echo(text="a"))
    keys = sq._queue().keys
    r = redis.Redis.from_url(rurl)
    for jid in (ids[1], pend):
        r.delete(keys.journal(jid))
        r.set(keys.journal(jid), "x")
    for cmd, jid in (("retry", ids[1]), ("cancel", pend)):
        res = venturi("job", cmd, jid, "--redis", rurl, "-q", qname)
        said = f"job {jid}: journal key is not a stream; nothing was written"
        assert res.exit_code == 1 and said in res.stderr
        assert "Traceback" not in res.stderr
    res = venturi("dead", "retry", "--redis", rurl, "-q", qname, "--all", "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and sorted(doc["retried"]) == sorted([ids[0], ids[2]])
    assert doc["refused"] == {ids[1]: "journal key is not a stream"}
    assert f"job {ids[1]} not retried: journal key is not a stream" in res.stderr
    assert r.hget(keys.job(ids[1]), "state") == b"dead"
    assert r.hget(keys.job(pend), "state") == b"pending"
    r.close()


def test_purge(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    ids = sq.enqueue_many([Echo(text=str(i)) for i in range(4)])
    drain(rurl, qname, EchoJob)
    res = venturi("purge", "--redis", rurl, "-q", qname, "--state", "pending")
    assert res.exit_code == 2 and "finished jobs only" in res.stderr
    res = venturi(
        "purge", "--redis", rurl, "-q", qname, "--state", "completed", "--older-than", "3600", "--json"
    )
    assert json.loads(res.stdout)["removed"] == 0
    res = venturi("purge", "--redis", rurl, "-q", qname, "--state", "completed")
    assert res.exit_code == 0 and "removed 4 completed job(s)" in res.stdout
    assert all(sq.get(j) is None for j in ids)


def test_queue_pause_and_resume(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    res = venturi("queue", "pause", qname, "--redis", rurl, "--create")  # a new queue
    assert res.exit_code == 0 and "paused" in res.stdout
    sq.enqueue(Echo(text="a"))  # still lands
    stats = json.loads(venturi("stats", "--redis", rurl, "-q", qname, "--json").stdout)[0]
    assert stats["paused"] is True and stats["eligible"] == 1
    res = venturi("queue", "resume", qname, "--redis", rurl, "--json")
    assert json.loads(res.stdout) == {"queue": qname, "paused": False}
    drain(rurl, qname, EchoJob)
    assert sq.counts()["completed"] == 1


def test_help_lists_the_commands_in_the_order_a_newcomer_needs_them() -> None:
    res = venturi("--help")
    assert res.exit_code == 0
    listed = re.findall(r"^│ (\w+) ", res.stdout.split("Commands")[1], re.M)
    assert listed[:6] == ["worker", "dashboard", "stats", "jobs", "job", "dead"]
    assert listed[-1] == "purge" and sorted(listed) == sorted(set(listed))


def test_cli_reports_missing_typer() -> None:
    code = "import sys; sys.modules['typer'] = None; from venturi_redis.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "venturi: the command line needs typer, which is not installed: pip install 'venturi-redis[cli]'"
    ]


def test_python_dash_m_is_the_venturi_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "venturi_redis.cli", "jobs", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--show-payload" in out.stdout, out.stderr


@pytest.mark.parametrize(
    ("exc", "status", "line"),
    [
        (Fail("job x not found", 1), 1, "venturi: job x not found"),
        (Fail("bad --loop", 2), 2, "venturi: bad --loop"),
        (vr.ConfigurationError("limit must be >= 1"), 2, "venturi: thing: limit must be >= 1"),
        (vr.PayloadError("not msgpack"), 1, "venturi: thing: not msgpack"),
        (
            redis.ConnectionError("refused"),
            1,
            "venturi: thing: cannot reach Redis at redis://:***@h:1/0: refused",
        ),
        (OSError("no route"), 1, "venturi: thing: cannot reach Redis at redis://:***@h:1/0: no route"),
        (
            redis.ResponseError("WRONGTYPE x"),
            1,
            "venturi: thing: Redis at redis://:***@h:1/0 refused: WRONGTYPE x",
        ),
    ],
)
def test_every_expected_failure_is_one_line_with_its_status(
    exc: Exception, status: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as leaving, one_line_errors(url="redis://:pw@h:1/0", what="thing"):
        raise exc
    assert leaving.value.exit_code == status
    assert capsys.readouterr().err.splitlines() == [line]
    with pytest.raises(KeyError), one_line_errors():  # a bug keeps its traceback
        raise KeyError("bug")


# -- worker (real processes) --------------------------------------------------------------------------

APP = textwrap.dedent(
    """
    from typing import Any

    import venturi_redis as vr
    from tests.tasks import EchoJob

    client = vr.Client.from_url()  # REDIS_URL, set by `venturi worker --redis`
    worker = vr.Worker([client.queue("{a}"), client.queue("{b}")], poll_interval=0.2).register(EchoJob)
    sharded = vr.Worker(
        [vr.ShardedQueue(client, "{a}", partitions=3), client.queue("{b}")], poll_interval=0.2
    ).register(EchoJob)

    async def make() -> vr.Worker[Any]:
        return worker

    def broken() -> vr.Worker[Any]:
        raise RuntimeError("no config\\nsecond line")

    not_a_worker = 42
    """
)


@pytest.fixture
def app_dir(tmp_path: Path, qname: str) -> Path:
    (tmp_path / "myapp.py").write_text(APP.replace("{a}", qname + "-a").replace("{b}", qname + "-b"))
    (tmp_path / "crashes.py").write_text("raise ValueError('bad settings')\n")
    return tmp_path


def start_worker(app_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen(
        [sys.executable, "-m", "venturi_redis.cli", "worker", *args],
        cwd=app_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_worker(app_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = start_worker(app_dir, *args)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_when(proc: subprocess.Popen[str], done: Callable[[], bool]) -> str:
    """Wait until ``done()``, SIGTERM the worker, return its stderr."""
    try:
        deadline = time.monotonic() + 30
        while not done():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("nosuchmodule:worker", 1, "venturi: cannot import 'nosuchmodule': no module named 'nosuchmodule'"),
        ("myapp:missing", 1, "venturi: module 'myapp' has no attribute 'missing'"),
        ("myapp", 2, "venturi: expected MODULE:ATTR"),
        ("myapp:not_a_worker", 1, "venturi: myapp:not_a_worker is a int, not a vr.Worker"),
        ("myapp:broken", 1, "venturi: calling myapp:broken() failed: RuntimeError: no config"),
        ("crashes:worker", 1, "venturi: importing 'crashes' failed: ValueError: bad settings"),
    ],
)
def test_worker_bad_targets_fail_in_one_line(
    app_dir: Path, rurl: str, target: str, code: int, message: str
) -> None:
    res = run_worker(app_dir, target, "--redis", rurl)
    assert res.returncode == code
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert "Traceback" not in res.stderr


def test_worker_narrowed_to_one_queue_and_sigterm_is_graceful(app_dir: Path, rurl: str, qname: str) -> None:
    with vr.SyncClient(rurl) as sc:
        a, b = sc.queue(qname + "-a"), sc.queue(qname + "-b")
        a.enqueue_many([Echo(text=str(i)) for i in range(5)])
        b.enqueue(Echo(text="not mine"))
        proc = start_worker(
            app_dir, "myapp:make", "--redis", rurl, "--queue", qname + "-a", "--concurrency", "2"
        )
        err = stop_when(proc, lambda: a.counts()["completed"] >= 5)
        assert proc.returncode == 0, err
        assert "SIGTERM received, shutting down" in err
        assert b.counts()["pending"] == 1  # --queue narrowed the worker to queue a


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_worker_runs_on_the_event_loop_asked_for(app_dir: Path, rurl: str, qname: str, loop: str) -> None:
    with vr.SyncClient(rurl) as sc:
        a = sc.queue(qname + "-a")
        a.enqueue_many([Echo(text=str(i)) for i in range(3)])
        args = ["--loop", loop] if loop != "asyncio" else []  # asyncio is the default
        proc = start_worker(app_dir, "myapp:worker", "--redis", rurl, *args)
        err = stop_when(proc, lambda: a.counts()["completed"] >= 3)
    assert proc.returncode == 0, err
    expected = "event loop: uvloop.Loop" if loop == "uvloop" else "event loop: asyncio."
    assert expected in err, err


def test_worker_loop_option_errors_are_usage_errors(app_dir: Path, rurl: str) -> None:
    res = run_worker(app_dir, "myapp:worker", "--redis", rurl, "--loop", "trio")
    assert res.returncode == 2
    assert res.stderr.strip() == "venturi: --loop must be asyncio or uvloop, not 'trio'"
    # uvloop not installed (shadowed by a module that fails to import, as when it is absent)
    (app_dir / "uvloop.py").write_text("raise ImportError('No module named uvloop')\n")
    res = run_worker(app_dir, "myapp:worker", "--redis", rurl, "--loop", "uvloop")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("venturi: --loop uvloop needs the uvloop package"), res.stderr
    assert lines[0].endswith("pip install 'venturi_redis[uvloop]'")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_worker_metrics_port_without_prometheus_client_is_a_usage_error(
    app_dir: Path, rurl: str, processes: str
) -> None:
    """One line and status 2 before any worker starts (the supervisor's children would
    each have crashed with a traceback, and been restarted five times)."""
    (app_dir / "prometheus_client.py").write_text("raise ImportError('No module named prometheus_client')\n")
    options = ["--metrics-port", "0", "--processes", processes]
    res = run_worker(app_dir, "myapp:worker", "--redis", rurl, *options)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("venturi: --metrics-port needs prometheus_client"), res.stderr
    assert lines[0].endswith("pip install 'venturi-redis[metrics]'")


def test_workers_with_elected_gauges_export_them_from_one_at_a_time(
    app_dir: Path, rurl: str, qname: str
) -> None:
    """Two workers on the same queues, --metrics-gauges elected: one exports the queue gauges;
    when it stops (cleanly: it gives the key up), the other does from its next refresh."""
    ports = [free_port(), free_port()]
    delayed = f'venturi_queue_jobs{{queue="{qname}-b",state="delayed"}} 1.0'

    def scrape(port: int) -> str:
        try:
            return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode())
        except OSError:
            return ""

    with vr.SyncClient(rurl) as sc:
        sc.queue(qname + "-b").enqueue(Echo(text="b"), delay=3600)
        procs = [
            start_worker(
                app_dir, "myapp:worker", "--redis", rurl, "--metrics-port", str(p), "--metrics-gauges=elected"
            )
            for p in ports
        ]
        try:
            deadline = time.monotonic() + 30
            while True:
                assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
                bodies = [scrape(p) for p in ports]
                if all(bodies) and any(delayed in b for b in bodies):
                    break
                time.sleep(0.1)
            time.sleep(6)  # a refresh more each: still one
            bodies = [scrape(p) for p in ports]
            assert [delayed in b for b in bodies].count(True) == 1, bodies
            holder = 0 if delayed in bodies[0] else 1
            procs[holder].send_signal(signal.SIGTERM)
            procs[holder].communicate(timeout=30)
            other = ports[1 - holder]
            deadline = time.monotonic() + 15
            while delayed not in scrape(other):
                assert time.monotonic() < deadline, "the other worker never took the gauges over"
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    p.communicate(timeout=30)


def test_worker_metrics_gauges_is_all_elected_or_none(app_dir: Path, rurl: str) -> None:
    res = run_worker(
        app_dir, "myapp:worker", "--redis", rurl, "--metrics-port", "0", "--metrics-gauges", "one"
    )
    assert res.returncode == 2
    assert res.stderr.strip() == "venturi: --metrics-gauges 'one': use all, elected or none"


def test_worker_unknown_queue_is_refused(app_dir: Path, rurl: str) -> None:
    res = run_worker(app_dir, "myapp:worker", "--redis", rurl, "--queue", "elsewhere")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("venturi: worker myapp:worker cannot start")


def test_worker_queue_option_takes_a_sharded_queue_or_one_partition(
    app_dir: Path, rurl: str, qname: str
) -> None:
    with vr.SyncClient(rurl) as sc:
        parts = partition_names(qname + "-a", 3)
        for i, part in enumerate(parts):
            sc.queue(part).enqueue(Echo(text=str(i)))
        b = sc.queue(qname + "-b")
        b.enqueue(Echo(text="not mine"))
        # The sharded queue's own name: every partition.
        proc = start_worker(app_dir, "myapp:sharded", "--redis", rurl, "--queue", qname + "-a")
        err = stop_when(proc, lambda: all(sc.queue(part).counts()["completed"] >= 1 for part in parts))
        assert proc.returncode == 0, err
        assert b.counts()["pending"] == 1
        # One partition's name: that partition only.
        sc.queue(parts[0]).enqueue(Echo(text="p0"))
        sc.queue(parts[1]).enqueue(Echo(text="p1"))
        proc = start_worker(app_dir, "myapp:sharded", "--redis", rurl, "--queue", parts[0])
        try:
            deadline = time.monotonic() + 30
            while sc.queue(parts[0]).counts()["completed"] < 2:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert sc.queue(parts[1]).counts()["pending"] == 1 and b.counts()["pending"] == 1


def test_worker_unknown_queue_lists_what_is_accepted(app_dir: Path, rurl: str, qname: str) -> None:
    res = run_worker(app_dir, "myapp:sharded", "--redis", rurl, "--queue", "elsewhere")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    parts = ", ".join(partition_names(qname + "-a", 3))
    assert last.endswith(
        f"this worker does not consume queue(s) elsewhere; --queue accepts: {qname}-b; "
        f"{qname}-a (sharded: all 3 partitions, or one of them, {parts})"
    ), last


def test_worker_refuses_evicting_server_unless_told(app_dir: Path, qname: str) -> None:
    with RedisServer("--maxmemory-policy", "volatile-lru") as server:
        res = run_worker(app_dir, "myapp:worker", "--redis", server.url)
        assert res.returncode == 1
        last = res.stderr.strip().splitlines()[-1]
        assert "maxmemory-policy volatile-lru" in last and "--no-eviction-check" in last
        with vr.SyncClient(server.url) as sc:
            sc.queue(qname + "-a").enqueue(Echo(text="x"))
            proc = start_worker(app_dir, "myapp:worker", "--redis", server.url, "--no-eviction-check")
            try:
                deadline = time.monotonic() + 30
                while sc.queue(qname + "-a").counts()["completed"] < 1:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.05)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=30)
            assert proc.returncode == 0


def test_worker_serves_metrics(app_dir: Path, rurl: str, qname: str) -> None:
    port = free_port()
    with vr.SyncClient(rurl) as sc:
        a = sc.queue(qname + "-a")
        a.enqueue_many([Echo(text=str(i)) for i in range(3)])
        sc.queue(qname + "-b").enqueue(Echo(text="b"), delay=3600)
        proc = start_worker(app_dir, "myapp:worker", "--redis", rurl, "--metrics-port", str(port), "--json")
        try:
            deadline = time.monotonic() + 30
            body = ""
            while f'venturi_jobs_completed_total{{kind="echo",queue="{qname}-a"}} 3.0' not in body:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
                try:
                    body = (
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                    )
                except OSError:
                    continue
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        assert f'venturi_jobs_claimed_total{{kind="echo",queue="{qname}-a"}} 3.0' in body
        assert f'venturi_queue_jobs{{queue="{qname}-b",state="delayed"}} 1.0' in body
        assert "venturi_job_run_seconds_bucket" in body
        # --json: every log line is a JSON document
        docs = [json.loads(line) for line in err.strip().splitlines()]
        assert any("serving Prometheus metrics" in d["message"] for d in docs)
