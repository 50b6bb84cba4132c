"""The CLI's safety promises, each pinned by the smallest test that breaks when its guard does
(a mutation campaign over cli/bulk.py, admin.py, schedules.py, limits.py, worker.py and the
testing helpers)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

import venturi_redis as vr
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from tests.test_cli import drain, qname, venturi
from tests.test_schedules_cli import define
from venturi_redis import testing

__all__ = ["qname"]  # the fixture, shared with tests/test_cli.py

pytestmark = pytest.mark.anyio


@pytest.fixture
def rurl(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def sq(rurl: str, qname: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(rurl) as sc:
        yield sc.queue(qname)


def test_purge_dry_run_without_a_filter_counts_the_whole_state_and_removes_nothing(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    # Without a filter a purge takes the whole state in one script: --dry-run must not get there.
    sq.enqueue_many([Echo(text=str(i)) for i in range(3)])
    drain(rurl, qname, EchoJob)
    res = venturi("purge", "--redis", rurl, "-q", qname, "--state", "completed", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["matched"] == 3
    assert sq.counts()["completed"] == 3


async def test_drain_declares_its_limits_even_with_nothing_to_run(rurl: str, qname: str) -> None:
    # docs/testing.md: each drain sets its declared limits as a worker does when it
    # starts, so a later drain without limits= (or a job enqueued after) still obeys them.
    async with vr.Client.from_url(rurl, clock=testing.Clock()) as client:
        queue = client.queue(qname)
        await testing.drain(queue, EchoJob, limits=[vr.Limit(Echo.KIND, concurrency=2)])
        assert [x.concurrency for x in await queue.limits()] == [2]


def test_a_limit_of_zero_is_a_usage_error(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    # --limit 0 would match nothing and say "0 moved": a typo must not read as success.
    sq.enqueue(Echo(text="x"))
    res = venturi("cancel", "--redis", rurl, "-q", qname, "--limit", "0")
    assert res.exit_code == 2 and sq.counts()["pending"] == 1


def test_a_schedule_id_in_two_queues_is_refused_without_q(rurl: str, qname: str) -> None:
    # Acting on the first holder found would remove another team's schedule.
    sid = f"dup-{qname}"  # found in the registry: unique on the shared server
    for q in (f"{qname}-a", f"{qname}-b"):
        define(rurl, q, (sid, {"every": 60}))
    res = venturi("schedule", "remove", sid, "--redis", rurl)
    assert res.exit_code == 1 and "several queues" in res.stderr
    for q in (f"{qname}-a", f"{qname}-b"):
        assert venturi("schedule", "pause", sid, "--redis", rurl, "-q", q).exit_code == 0  # still there


def test_a_bulk_cancel_names_a_corrupt_job_leaves_it_and_exits_1(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    ids = sq.enqueue_many([Echo(text=str(i)) for i in range(2)])
    with redis.Redis.from_url(rurl) as r:
        r.delete(sq._queue().keys.journal(ids[1]))
        r.set(sq._queue().keys.journal(ids[1]), "x")  # its journal overwritten
    res = venturi("cancel", "--redis", rurl, "-q", qname, "--all")
    assert res.exit_code == 1 and f"job {ids[1]} not cancelled" in res.stderr
    assert "journal key is not a stream" in res.stderr
    assert [sq.get(j).state for j in ids] == [vr.JobState.CANCELLED, vr.JobState.PENDING]  # type: ignore[union-attr]


def test_schedules_json_lists_the_others_and_exits_1_past_a_corrupt_queue(rurl: str, qname: str) -> None:
    good, bad = f"{qname}-good", f"{qname}-bad"
    define(rurl, good, ("fine", {"every": 60}))
    define(rurl, bad, ("lost", {"every": 60}))
    with vr.SyncClient(rurl) as sc, redis.Redis.from_url(rurl) as r:
        r.delete(sc.queue(bad)._queue().keys.schedules)
        r.set(sc.queue(bad)._queue().keys.schedules, "x")  # its set of ids overwritten
    res = venturi("schedules", "--redis", rurl, "-q", good, "-q", bad, "--json")
    assert res.exit_code == 1 and f"queue {bad}:" in res.stderr
    assert [d["id"] for d in json.loads(res.stdout)] == ["fine"]


def test_purge_dry_run_counts_under_the_stricter_of_older_than_and_until(
    rurl: str, qname: str, sq: vr.SyncQueue
) -> None:
    sq.enqueue_many([Echo(text=str(i)) for i in range(2)])
    drain(rurl, qname, EchoJob)
    args = ("--state", "completed", "--older-than", "3600", "--until", "0s", "--dry-run", "--json")
    res = venturi("purge", "--redis", rurl, "-q", qname, *args)
    assert res.exit_code == 0 and json.loads(res.stdout)["matched"] == 0  # finished just now


def test_triggering_a_schedule_that_is_not_there_exits_1(rurl: str, qname: str) -> None:
    define(rurl, qname, ("real", {"every": 60}))
    res = venturi("schedule", "trigger", "gone", "--redis", rurl, "-q", qname, "--json")
    assert res.exit_code == 1 and "does not exist" in res.stderr
    assert json.loads(res.stdout)["done"] is False


def test_limit_clear_on_a_mistyped_queue_says_the_queue_is_unknown(rurl: str, qname: str) -> None:
    # "has no limit" would send the operator looking for the wrong thing.
    res = venturi("limit", "clear", "echo", "--redis", rurl, "-q", f"{qname}-typo")
    assert res.exit_code == 1 and f"queue '{qname}-typo' is unknown" in res.stderr


def test_limit_set_with_a_bad_rate_writes_nothing(rurl: str, qname: str, sq: vr.SyncQueue) -> None:
    sq.enqueue(Echo(text="x"))  # the queue exists
    res = venturi(
        "limit", "set", "echo", "--concurrency", "3", "--rate", "lots", "--redis", rurl, "-q", qname
    )
    assert res.exit_code == 2
    assert json.loads(venturi("limits", "--redis", rurl, "-q", qname, "--json").stdout) == []
