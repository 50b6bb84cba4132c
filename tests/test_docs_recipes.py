"""The redis-cli recipes of docs/redis-layout.md, parsed from the page and run on a real queue.

Each recipe is a ```sh block after a ``<!-- recipe: NAME -->`` marker. Its
``redis-cli`` lines are split like a shell would (quotes removed), the shell
variables are filled in, and the command goes through redis-py's
``execute_command``. A recipe added to the page without a test here, or a
``redis-cli`` line outside a recipe, fails the suite.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parent.parent / "docs" / "redis-layout.md"
_RECIPE_RE = re.compile(r"<!-- recipe: (?P<name>[\w-]+) -->\s*```sh\n(?P<body>.*?)```", re.S)


def recipes() -> dict[str, list[list[str]]]:
    text = DOC.read_text()
    out: dict[str, list[list[str]]] = {}
    for m in _RECIPE_RE.finditer(text):
        lines = [ln.strip() for ln in m["body"].splitlines() if ln.strip()]
        assert all(ln.startswith("redis-cli ") for ln in lines), m["name"]
        out[m["name"]] = [shlex.split(ln, comments=True) for ln in lines]
    return out


TESTED = {
    "high-waiting",
    "lag",
    "job-doing",
    "expired-leases",
    "ran-twice",
    "journal",
    "dead-why",
    "retrying",
    "throttled",
    "expiring",
    "ordered",
    "paused",
    "throughput",
    "waiting-on",
    "workers",
    "events",
    "schedules",
    "limit-key",
    "registry",
    "history",
}


def test_every_recipe_is_tested_and_every_command_is_in_a_recipe() -> None:
    found = recipes()
    assert set(found) == TESTED
    in_recipes = sum(len(cmds) for cmds in found.values())
    everywhere = sum(1 for ln in DOC.read_text().splitlines() if ln.strip().startswith("redis-cli "))
    assert in_recipes == everywhere


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(redis_server.url)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def queue(client: vr.Client) -> vr.Queue:
    return client.queue(f"doc-{uuid.uuid4().hex[:10]}")


async def run(name: str, queue: vr.Queue, job: str = "", worker: str = "", schedule: str = "") -> list[Any]:
    """Run recipe ``name`` with $Q, $JOB, $WORKER, $SCHEDULE, $NOW_MS, $MINUTE_AGO_MS, $MINUTE_S
    and $HOUR_S filled in."""
    sec, usec = await queue.client.redis.time()
    now = int(sec) * 1000 + int(usec) // 1000
    values = {"$MINUTE_AGO_MS": str(now - 60_000), "$NOW_MS": str(now), "$JOB": job, "$Q": queue.name}
    # docs/redis-layout.md "Flow control": LKEY before TAB, which it contains.
    values["$LKEY"] = "mail\t11:example.com"
    values["$TAB"] = "\t"
    values["$OKEY"] = "acct-42"  # "Ordered keys"
    values["$MINUTE_S"] = str(now // 60_000 * 60)  # the metrics history's minute and hour
    values["$HOUR_S"] = str(now // 3_600_000 * 3600)
    values["$WORKER"] = worker
    values["$SCHEDULE"] = schedule
    out = []
    for argv in recipes()[name]:
        assert argv[0] == "redis-cli"
        args = []
        for token in argv[1:]:
            for var, value in values.items():
                token = token.replace(var, value)
            # A lone `$` is XREAD's "from now", not a variable.
            assert "$" not in token or token == "$", f"unknown variable in {name}: {token}"
            args.append(token)
        out.append(await queue.client.redis.execute_command(*args))
    return out


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def pairs(reply: Any) -> list[tuple[str, float]]:
    """A WITHSCORES reply, flat (RESP2 as sent) or already paired (redis-py's parsing)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(text(m), float(s)) for m, s in reply]
    return [(text(m), float(s)) for m, s in zip(reply[::2], reply[1::2], strict=True)]


def fields(entry: Any) -> dict[str, str]:
    """One stream entry of an XRANGE reply as a dict of text."""
    _, flat = entry
    if isinstance(flat, dict):
        return {text(k): text(v) for k, v in flat.items()}
    return {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


async def test_high_waiting(queue: vr.Queue) -> None:
    await queue.enqueue_many([Echo(text="a"), Echo(text="b")], priority="high")
    await queue.enqueue(Echo(text="later"), priority="high", delay=3600)
    await queue.enqueue(Echo(text="normal"))
    assert await run("high-waiting", queue) == [3, 2]


async def test_lag(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Echo(text="a"))
    await anyio.sleep(0.05)
    ((member, score),) = pairs((await run("lag", queue))[0])
    info = await queue.get(jid)
    assert info is not None and info.eligible_at is not None
    assert member == jid and score == round(info.eligible_at.timestamp() * 1000)


async def test_job_doing(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Echo(text="a"))
    worker = make_worker(queue, EchoJob, name="pod-7")
    await worker._runners[0].claim(1)
    hm, recent = await run("job-doing", queue, jid)
    state, kind, runs, failures, owner, claimed, expires, note = (
        text(v) if v is not None else None for v in hm
    )
    # failures is absent (nil) until the first failure: docs/redis-layout.md
    assert (state, kind, runs, failures, owner) == ("running", "echo", "1", None, "pod-7")
    assert claimed is not None and expires is not None and int(expires) > int(claimed) > 0
    assert note is None
    assert recent == []  # a first run: its claim is in the hash, no journal yet


async def test_expired_leases(queue: vr.Queue) -> None:
    held = await queue.enqueue(Echo(text="held"))
    await make_worker(queue, EchoJob, lease=60)._runners[0].claim(1)
    stale = await queue.enqueue(Echo(text="stale"))
    await make_worker(queue, EchoJob, lease=0.001)._runners[0].claim(1)
    await anyio.sleep(0.05)
    (expired,) = await run("expired-leases", queue)
    assert [text(x) for x in expired] == [stale]
    assert held != stale


async def test_ran_twice(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Flaky(fail_times=1))
    await drain(queue, FlakyJob)
    runs, journal = await run("ran-twice", queue, jid)
    assert text(runs) == "2"
    entries = [fields(e) for e in journal]
    assert [e["event"] for e in entries] == ["enqueued", "failed", "completed"]
    failed = entries[1]
    assert failed["note"] == "boom 1" and failed["run"] == "1" and "delay_ms" in failed
    assert failed["worker"] and int(failed["claimed_at"]) > 0
    assert entries[2]["run"] == "2" and int(entries[2]["claimed_at"]) >= int(failed["at"])


async def test_dead_why(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Doomed())
    await drain(queue, DoomedJob)
    deaths, hm, last = await run("dead-why", queue, jid)
    ((member, score),) = pairs(deaths)
    assert member == jid and score > 0
    kind, failures, note, finished, reason = (text(v) for v in hm)
    assert (kind, failures, note, reason) == ("doomed", "1", "resource gone", "permanent")
    assert int(finished) > 0
    entry = fields(last[0])
    assert entry["event"] == "dead" and entry["reason"] == "permanent"
    info = await queue.get(jid)
    assert info is not None and info.dead_reason is vr.DeadReason.PERMANENT


class Failing(Flaky):
    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=3600, cap=3600)  # the third retry waits an hour


class FailingJob(Failing, FlakyJob):
    pass


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


async def test_throttled(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Digest())
    await drain(queue, DigestJob)
    held, hm = await run("throttled", queue, jid)
    ((member, score),) = pairs(held)
    state, dedup, window, until = (text(v) for v in hm)
    assert (member, state, dedup, window) == ("6:digest:daily", "completed", member, "3600000")
    assert score == float(until)


async def test_retrying(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Failing(fail_times=5))
    worker = make_worker(queue, FailingJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (info := await queue.get(jid)) is None or info.failures < 3:
                await anyio.sleep(0.02)
        worker.shutdown()
    count, head, hm = await run("retrying", queue, jid)
    ((member, score),) = pairs(head)
    assert (count, member) == (1, jid)
    kind, failures, note, eligible = (text(v) for v in hm)
    assert (kind, failures, note, int(eligible)) == ("flaky", "3", "boom 3", int(score))
    assert (await queue.counts())["retrying"] == 1


async def test_expiring(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Echo(text="soon"), expires=60)
    await queue.enqueue(Echo(text="no deadline"))
    count, head, hm = await run("expiring", queue, jid)
    ((member, score),) = pairs(head)
    assert (count, member) == (1, jid)
    state, expires_at, reason = (text(v) if v is not None else None for v in hm)
    assert (state, int(expires_at or 0), reason) == ("pending", int(score), None)
    info = await queue.get(jid)
    assert info is not None and info.expires_at is not None
    assert round(info.expires_at.timestamp() * 1000) == int(score)


async def test_ordered(queue: vr.Queue) -> None:
    class Posting(vr.Task):
        KIND: ClassVar[str] = "docs.posting"
        account: str

        def order_key(self) -> str | None:
            return self.account

    first, second = await queue.enqueue_many([Posting(account="acct-42"), Posting(account="acct-42")])
    await queue.enqueue(Posting(account="acct-7"))
    held, paused, count, head, hm = await run("ordered", queue, second)
    assert (text(held), paused, count) == (first, 0, 1)
    assert [m.endswith(second.encode()) and m.startswith(b"acct-42\xff") for m in head] == [True]
    assert [text(v) for v in hm] == ["pending", "acct-42", text(head[0])]
    await queue.pause_key("acct-42")
    held, paused, count, *_ = await run("ordered", queue, second)
    assert (held, paused, count) == (None, 1, 2)  # the holder held back, first of its key


async def test_paused(queue: vr.Queue) -> None:
    await queue.enqueue(Echo(text="a"))
    runner = make_worker(queue, EchoJob)._runners[0]
    # The recipe runs all three lines; check the claim between them too.
    cmds = recipes()["paused"]
    assert [c[1] for c in cmds] == ["HGET", "HSET", "HDEL"]
    before, set_reply, del_reply = await run("paused", queue)
    assert before is None and set_reply == 1 and del_reply == 1
    await queue.client.redis.execute_command(*[t.replace("$Q", queue.name) for t in cmds[1][1:]])
    assert (await queue.stats()).paused
    _, nxt, jobs = await runner.claim(1)
    assert (nxt, jobs) == (-1, [])  # the hand-set flag stops claims like `venturi queue pause`
    await queue.client.redis.execute_command(*[t.replace("$Q", queue.name) for t in cmds[2][1:]])
    _, _, jobs = await runner.claim(1)
    assert len(jobs) == 1


async def test_throughput(queue: vr.Queue) -> None:
    await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    await drain(queue, EchoJob)
    assert await run("throughput", queue) == [3]


def _hash(reply: Any) -> dict[str, str]:
    """An HGETALL reply (a dict under RESP3, a flat list under RESP2) as text."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {text(k): text(v) for k, v in items}


async def test_history(queue: vr.Queue) -> None:
    await run("history", queue)  # its first line switches the history on
    for _ in range(3):  # a minute that ends between the jobs and the read: once more
        sec, _usec = await queue.client.redis.time()
        await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
        await drain(queue, EchoJob)
        before = int(time.time() * 1000)  # the local server's clock
        _, minute, ttl, hour = await run("history", queue)
        after = int(time.time() * 1000)
        if int(sec) // 60 == int((await queue.client.redis.time())[0]) // 60:
            break
    got = _hash(minute)
    assert got["echo\tenqueued"] == got["echo\tcompleted"] == "3"
    # Run times add up in ms: three runs that each ended in the ms they were
    # claimed add 0, and a field is never incremented by 0 (history.lua).
    assert int(got.get("echo\trun_ms", "0")) >= 0
    # PTTL ran between `before` and `after`: the hash expires 48 hours after its minute ends.
    expires = (int(sec) // 60 * 60 + 60) * 1000 + 48 * 3_600_000
    assert before + int(ttl) <= expires <= after + int(ttl)
    hours = _hash(hour)
    assert int(hours["echo\tenqueued"]) >= 3


async def test_workers(queue: vr.Queue) -> None:
    worker = make_worker(queue, EchoJob, name="doc-worker")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            while not await queue.workers():
                await anyio.sleep(0.02)
        names, record = await run("workers", queue, worker="doc-worker")
        ((member, expires),) = pairs(names)
        assert member == "doc-worker"
        doc = json.loads(text(record))
        assert doc["name"] == "doc-worker" and doc["pid"] == os.getpid() and doc["queues"] == [queue.name]
        # The zset's score outlives the record (it is renewed every sixth heartbeat).
        assert doc["heartbeat_ms"] < doc["expires_ms"] <= expires
        worker.shutdown()
    assert await queue.workers() == []


async def test_events(queue: vr.Queue) -> None:
    """On by default; the blocking XREAD returns the first event after it started (an enqueue)."""
    replies: list[Any] = []
    stream_key = f"venturi:{{{queue.name}}}:events"

    async def follow() -> None:
        replies.extend(await run("events", queue))

    with anyio.fail_after(4):  # under the client's 5 s socket timeout: BLOCK 0 is bounded here
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.sleep(0.2)  # the XREAD is blocking
            jid = await queue.enqueue(Echo(text="live"))
    default, capped, read, off = replies
    assert default is None and capped == 1 and off == 0  # absent: on; then a new field, then updated
    ((stream, entries),) = read if isinstance(read, list) else list(read.items())
    assert text(stream) == stream_key
    entry = fields(entries[0])
    assert (entry["event"], entry["job"], entry["kind"], entry["run"]) == ("enqueued", jid, "echo", "0")
    await queue.enqueue(Echo(text="off again"))
    assert await queue.client.redis.xlen(stream_key) == 1  # the enqueue before the switch went off
    # A stream deleted by hand comes back with the next event (the first event makes it).
    await queue.client.redis.hdel(f"venturi:{{{queue.name}}}:meta", "events")
    await queue.client.redis.delete(stream_key)
    await queue.enqueue(Echo(text="back"))
    assert await queue.client.redis.xlen(stream_key) == 1


async def test_journal(queue: vr.Queue) -> None:
    """A first run's completion: one entry in the stream; readers add what the hash implies."""
    jid = await queue.enqueue(Echo(text="a"))
    await drain(queue, EchoJob)
    hm, stream, scratch = await run("journal", queue, jid)
    state, runs, created, priority, eligible, owner, claimed = (
        text(v) if v is not None else None for v in hm
    )
    assert (state, runs, priority, claimed) == ("completed", "1", "normal", None)  # claimed_at: a run's
    (only,) = [(text(i), fields((i, f))) for i, f in stream]
    entry_id, entry = only
    assert (entry["event"], entry["run"], entry["worker"]) == ("completed", "1", owner)
    assert scratch == 0
    shown = await queue.journal(jid)
    assert [e.event for e in shown] == ["enqueued", "claimed", "completed"]
    enqueued, claim, completed = shown
    assert enqueued.id == f"{created}-0"
    assert enqueued.details == {"priority": "normal", "eligible_at": eligible}
    assert claim.id == f"{entry['claimed_at']}-0" and claim.details == {"worker": owner} and claim.run == 1
    assert completed.id == entry_id
    # A running job on its first run: no stream, its claim in the hash.
    running = await queue.enqueue(Echo(text="b"))
    await make_worker(queue, EchoJob, name="pod-9")._runners[0].claim(1)
    hm, stream, scratch = await run("journal", queue, running)
    assert [text(v) if v is not None else None for v in hm][:2] == ["running", "1"]
    assert text(hm[5]) == "pod-9" and hm[6] is not None and stream == [] and scratch == 0
    assert [(e.event, e.details.get("worker")) for e in await queue.journal(running)] == [
        ("enqueued", None),
        ("claimed", "pod-9"),
    ]


async def test_waiting_on(queue: vr.Queue) -> None:
    a = await queue.enqueue(Echo(text="a"))
    b = await queue.enqueue(Echo(text="b"))
    job = await queue.enqueue(Echo(text="after"), after=[a, b])
    state, deps, dependents, results, _ = await run("waiting-on", queue, job)
    assert text(state) == "waiting" and sorted(text(x) for x in deps) == sorted([a, b])
    assert not dependents and not results
    assert [text(x) for x in (await run("waiting-on", queue, a))[2]] == [job]
    await drain(queue, EchoJob)
    state, deps, _, results, recent = await run("waiting-on", queue, job)
    assert text(state) == "completed" and not deps
    assert sorted(text(x) for x in results) == sorted([a, b])
    events = [fields(e)["event"] for e in recent]
    assert events == ["completed", "ready", "dependency_completed"]


async def test_schedules(queue: vr.Queue) -> None:
    nightly = await queue.schedule("nightly", Echo(text="n"), cron="0 3 * * *", tz="Europe/Berlin")
    await queue.schedule("tick", Echo(text="t"), every=60)
    await queue.pause_schedule("tick")
    ids, due, fields = await run("schedules", queue, schedule="nightly")
    assert sorted(text(x) for x in ids) == ["nightly", "tick"]
    assert nightly.next_at is not None
    assert pairs(due) == [("nightly", nightly.next_at.timestamp() * 1000)]  # paused: not due
    assert [text(x) if x is not None else None for x in fields] == [
        "echo",
        "0 3 * * *",
        "",
        "Europe/Berlin",
        str(int(nightly.next_at.timestamp() * 1000)),
        None,
        None,
        "0",
    ]


async def test_limit_key(queue: vr.Queue) -> None:
    from tests.test_flow_control import Mail

    await queue.set_limit("mail", concurrency=1, per_key=True)
    await queue.enqueue_many([Mail(domain="example.com", n=i) for i in range(3)])
    await queue.enqueue(Mail(domain="other.org"))
    await make_worker(queue)._runners[0].claim(10)  # one of each key runs
    running, waiting, limits, ready = await run("limit-key", queue)
    assert (text(running), waiting, text(limits)) == ("1", 2, "0 0 0 1 0 0")
    assert [m for m, _ in pairs(ready)] == ["mail\t11:example.com", "mail\t9:other.org"]


async def test_registry(queue: vr.Queue) -> None:
    await queue.enqueue(Echo(text="a"))
    registered, present, recorded = await run("registry", queue)
    mine = dict(pairs(registered))[queue.name]
    assert abs(mine - time.time() * 1000) < 60_000  # recorded by the enqueue, by this clock
    assert present == 1 and recorded == 0  # one key (pending:normal); GT: an update, not an add
    assert (await queue.client.redis.zscore("venturi:queues", queue.name)) >= mine
    await queue.cancel((await queue.list_jobs())[0].id)
    assert await queue.purge("cancelled") == 1
    _, present, _ = await run("registry", queue)
    assert present == 0  # gone: `venturi stats` no longer lists it
