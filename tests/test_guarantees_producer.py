"""The producer side's promises, each pinned by the smallest test that breaks when its guard
does (a mutation campaign over bulk.py, retention, history, sharded, events and the checks)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, ClassVar

import anyio
import pytest
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo
from venturi_redis._producer import bulk, ops, reads, scale, tail
from venturi_redis._producer.firing import fire_due
from venturi_redis.cli.commands import app

runner = CliRunner()

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000  # the tests' clock, in ms


@pytest.fixture
def clock() -> list[int]:
    return [BASE]


@pytest.fixture
def q(client: vr.Client, queue_name: str, clock: list[int]) -> vr.Queue:
    """The queue, on a client whose clock the test sets."""
    return vr.Client(client.redis, clock=lambda: clock[0], url=client.url).queue(queue_name)


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def test_cancel_jobs_since_includes_a_job_enqueued_at_that_very_ms(
    q: vr.Queue, clock: list[int]
) -> None:
    await q.enqueue(Echo(text="old"))
    clock[0] = BASE + 1000
    new = await q.enqueue(Echo(text="new"))
    assert await q.cancel_jobs(since=at(BASE + 1000)) == [new]


async def test_purge_with_until_still_keeps_the_jobs_younger_than_older_than(
    q: vr.Queue, clock: list[int]
) -> None:
    await q.enqueue(Doomed())
    await drain(q, DoomedJob)
    clock[0] = BASE + 5000
    assert await q.purge("dead", until=at(BASE + 5000), older_than=10) == 0
    assert len(await q.list_jobs(state="dead")) == 1


async def test_a_limited_retry_stops_reading_once_the_limit_is_reached(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "PAGE", 4)
    monkeypatch.setattr(bulk, "BATCH", 2)
    await q.enqueue_many([Doomed() for _ in range(12)])
    await drain(q, DoomedJob)
    reports: list[vr.BulkProgress] = []
    assert len(await q.retry_dead(limit=2, on_progress=reports.append)) == 2
    assert reports[-1].finished and reports[-1].scanned == 4 and reports[-1].done == 2


async def test_resuming_from_an_event_inside_a_many_job_entry_gives_the_rest_of_it(queue: vr.Queue) -> None:
    await queue.set_events(True)
    await queue.enqueue_many([Doomed() for _ in range(3)])
    await drain(queue, DoomedJob)
    await queue.retry_dead()  # one stream entry telling three jobs

    async def retried(since: str, n: int) -> list[str]:
        out: list[str] = []
        with anyio.fail_after(10):
            async for event in queue.events(since=since):
                if event.event == "retried":
                    out.append(event.id)
                    if len(out) == n:
                        return out
        return out

    first, *rest = await retried("0", 3)
    assert await retried(first, 2) == rest


@pytest.mark.parametrize("since", ["", "abc", "1-x", "12-3-4", "-1", "1/2", "0-0/x", None])
async def test_a_malformed_since_is_refused_at_the_call_even_with_the_reader_running(
    queue: vr.Queue, since: str
) -> None:
    await queue.set_events(True)
    async with contextlib.aclosing(queue.events(since="0")) as running:
        await anext(running)  # the queue's reader now follows the stream
        with pytest.raises(vr.ConfigurationError, match="since must be"):
            queue.events(since=since)  # at the call, before anything is read


def test_venturi_events_says_a_malformed_since_is_refused(redis_server: RedisServer) -> None:
    name = f"gp-ev-{uuid.uuid4().hex[:8]}"
    runner.invoke(app, ["queue", "events", name, "on", "--redis", redis_server.url, "--create"])
    res = runner.invoke(app, ["events", name, "--since", "1-x", "--redis", redis_server.url])
    assert res.exit_code != 0 and "since must be" in res.output


async def test_a_dry_run_count_stops_at_the_limit(q: vr.Queue, clock: list[int]) -> None:
    await q.enqueue_many([Doomed() for _ in range(3)])
    await drain(q, DoomedJob)
    assert await bulk.count_matching(q, "dead", bulk.Filter(limit=2), clock[0]) == 2


async def test_cancel_jobs_leaves_a_job_enqueued_after_its_now(q: vr.Queue, clock: list[int]) -> None:
    clock[0] = BASE + 5000
    await q.enqueue(Echo(text="later"))
    clock[0] = BASE  # the action's now: before that job was enqueued
    assert await q.cancel_jobs() == []
    assert await bulk.count_matching(q, "pending", bulk.Filter(), BASE) == 0


async def test_cancel_jobs_reads_every_page_of_the_jobs_parked_on_a_limit(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "PAGE", 2)
    await q.set_limit("echo", concurrency=1)
    ids = await q.enqueue_many([Echo(text=str(i)) for i in range(5)])
    assert sorted(await q.cancel_jobs(kind="echo")) == sorted(ids)


async def test_a_schedule_set_back_to_a_fire_time_it_fired_makes_no_second_job(
    q: vr.Queue, clock: list[int]
) -> None:
    await q.schedule("tick", Echo(text="hi"), every=10)
    clock[0] = BASE + 10_100  # fired 100 ms late
    assert [f.status for _, f in (await fire_due(q)).fired] == ["created"]
    await q.unschedule("tick")
    clock[0] = BASE  # declared again as it was: the same first fire time
    await q.schedule("tick", Echo(text="hi"), every=10)
    clock[0] = BASE + 10_700  # fired later this time: still that fire time's job
    await fire_due(q)
    assert len(await q.list_jobs(state="pending")) == 1


class Keyed(vr.Task):
    KIND: ClassVar[str] = "keyed"
    key: str

    def limit_key(self) -> str | None:
        return self.key


async def test_a_limit_key_of_exactly_the_most_bytes_is_taken_and_one_more_is_refused(q: vr.Queue) -> None:
    await q.enqueue(Keyed(key="é" * 512))  # 1024 bytes of UTF-8: the limit itself
    with pytest.raises(vr.ConfigurationError, match="at most 1024 bytes"):
        await q.enqueue(Keyed(key="é" * 512 + "x"))
    assert len(await q.list_jobs(state="pending")) == 1


async def test_a_batch_of_exactly_max_batch_jobs_is_taken_and_one_more_writes_nothing(
    client: vr.Client, queue_name: str
) -> None:
    q = vr.Client(client.redis, max_batch_jobs=3, url=client.url).queue(queue_name)
    assert len(await q.enqueue_many([Echo(text=str(i)) for i in range(3)])) == 3
    with pytest.raises(vr.ConfigurationError, match="at most 3 tasks"):
        await q.enqueue_many([Echo(text=str(i)) for i in range(4)])
    assert len(await q.list_jobs(state="pending")) == 3


async def test_an_update_to_a_task_over_the_payload_cap_is_refused_and_the_job_keeps_its_task(
    client: vr.Client, queue_name: str
) -> None:
    q = vr.Client(client.redis, max_payload_bytes=100, url=client.url).queue(queue_name)
    job = await q.enqueue(Echo(text="small"))
    with pytest.raises(vr.PayloadTooLarge):
        await q.update(job, task=Echo(text="x" * 200))
    info = await q.get(job)
    assert info is not None and info.payload == {"text": "small"}


async def test_a_schedule_of_a_task_over_the_payload_cap_is_refused_and_nothing_is_scheduled(
    client: vr.Client, queue_name: str
) -> None:
    q = vr.Client(client.redis, max_payload_bytes=100, url=client.url).queue(queue_name)
    with pytest.raises(vr.PayloadTooLarge):
        await q.schedule("big", Echo(text="x" * 200), every=10)
    assert await q.schedules() == []


async def test_delay_false_beside_at_is_refused_as_a_bool_is_never_a_delay(q: vr.Queue) -> None:
    # False == 0 in Python; the check must not let a bool pass as "no delay given".
    with pytest.raises(vr.ConfigurationError, match="not both"):
        await q.enqueue(Echo(text="hi"), at=at(BASE + 1000), delay=False)
    assert await q.is_drained()


async def test_list_jobs_reads_past_its_first_page_without_skipping_a_job(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "_PAGE", 2)
    ids = await q.enqueue_many([Echo(text=str(i)) for i in range(5)])
    assert sorted(j.id for j in await q.list_jobs(state="pending")) == sorted(ids)


async def test_retrying_lists_no_job_that_is_no_longer_pending(q: vr.Queue) -> None:
    job = await q.enqueue(Doomed())
    await drain(q, DoomedJob)
    # The window the listing guards: a claim ended the job, its index entry is not gone yet.
    await q.client.redis.zadd(q.keys.retrying, {job: BASE})
    assert await q.list_jobs(state="retrying") == []


async def test_purge_without_filters_runs_batch_after_batch_until_none_is_left(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_PURGE_BATCH", 2)
    await q.enqueue_many([Doomed() for _ in range(5)])
    await drain(q, DoomedJob)
    assert await q.purge("dead") == 5


async def test_scale_total_says_to_narrow_a_prefix_one_queue_past_the_cap(
    client: vr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    pre = f"gp-sc-{uuid.uuid4().hex[:8]}-"
    for n in range(3):
        await client.queue(f"{pre}{n}").enqueue(Echo(text="x"))
    monkeypatch.setattr(scale, "MAX_SCALE_QUEUES", 3)
    assert (await client.scale_total(prefix=pre)).queues == 3
    monkeypatch.setattr(scale, "MAX_SCALE_QUEUES", 2)
    with pytest.raises(vr.ConfigurationError, match="narrow the prefix"):
        await client.scale_total(prefix=pre)


async def test_scale_total_sums_the_jobs_parked_on_a_limit(q: vr.Queue) -> None:
    await q.set_limit("echo", concurrency=1)
    await q.enqueue_many([Echo(text=str(i)) for i in range(3)])
    limited = len(await q.list_jobs(state="limited"))
    assert limited > 0 and (await q.client.scale_total([q.name])).limited == limited


async def test_a_filtered_purge_counts_only_the_jobs_it_removed_not_those_taken_first(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await q.enqueue_many([Doomed() for _ in range(2)])
    await drain(q, DoomedJob)
    read = bulk._matching

    async def raced(*args: Any) -> list[str]:
        found = await read(*args)
        await q.store.purge_ids("dead", found[:1])  # another purge removes one between read and act
        return found

    monkeypatch.setattr(bulk, "_matching", raced)
    assert await q.purge("dead", limit=10) == 1


async def test_the_last_progress_report_counts_a_last_page_with_no_match(
    q: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "PAGE", 2)
    await q.enqueue_many([Doomed() for _ in range(3)])
    await drain(q, DoomedJob)
    reports: list[vr.BulkProgress] = []
    assert await q.retry_dead(kind="echo", on_progress=reports.append) == []
    assert reports[-1].finished and reports[-1].scanned == 3


async def test_an_update_to_a_past_at_makes_the_job_due_now_not_earlier(q: vr.Queue) -> None:
    job = await q.enqueue(Echo(text="later"), delay=60)
    assert await q.update(job, at=at(BASE - 5000))
    # As at enqueue: a past at is now, so the job does not jump ahead of those already waiting.
    info = await q.get(job)
    assert info is not None and info.eligible_at == at(BASE)


async def test_a_follower_behind_the_reader_reads_a_gap_longer_than_one_read_whole(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail, "COUNT", 2)  # the gap below takes three reads
    await queue.set_events(True)
    ids = [await queue.enqueue(Echo(text=str(i))) for i in range(5)]

    async def take(events: AsyncIterator[vr.QueueEvent], n: int) -> list[str]:
        out: list[str] = []
        with anyio.fail_after(10):
            while len(out) < n:
                if job := (await anext(events)).job_id:  # the switch's own entry has none
                    out.append(job)
        return out

    async with contextlib.aclosing(queue.events(since="0")) as ahead:
        assert await take(ahead, 5) == ids  # the shared reader is now at the stream's end
        async with contextlib.aclosing(queue.events(since="0")) as behind:
            assert await take(behind, 5) == ids
