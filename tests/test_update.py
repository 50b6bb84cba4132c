"""``queue.update``: a pending job changed in place, in one script (lua/update.lua)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, drain
from venturi_redis._store.keys import dedup_field

pytestmark = pytest.mark.anyio

BASE = 1_900_000_000_000  # ms


class Mail(vr.Task):
    KIND: ClassVar[str] = "mail"
    to: str
    key: str | None = None

    def dedup_key(self) -> str | None:
        return self.key


class MailJob(Mail, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[Any], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result=self.to)


class Other(vr.Task):
    KIND: ClassVar[str] = "other"


def clocked(client: vr.Client, queue_name: str) -> tuple[list[int], vr.Queue]:
    t = [BASE]
    c = vr.Client(client.redis, clock=lambda: t[0], url=client.url)
    return t, c.queue(queue_name)


def ms(when: datetime | None) -> int:
    assert when is not None
    return round(when.timestamp() * 1000)


async def test_update_changes_the_task_priority_and_eligibility(client: vr.Client, queue_name: str) -> None:
    t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Mail(to="a"), delay=3600)
    t[0] += 1_000
    assert await queue.update(job, task=Mail(to="b"), priority="high", delay=5)
    info = await queue.get(job)
    assert info is not None and info.state is vr.JobState.PENDING
    assert info.payload["to"] == "b"
    assert info.priority is vr.Priority.HIGH
    assert ms(info.eligible_at) == BASE + 6_000
    redis = queue.client.redis
    assert await redis.zscore(queue.keys.pending(vr.Priority.HIGH), job) == BASE + 6_000
    assert await redis.zscore(queue.keys.pending(vr.Priority.NORMAL), job) is None
    journal = await queue.journal(job)
    assert [e.event for e in journal] == ["enqueued", "updated"]
    assert journal[-1].details == {
        "changed": "task,priority,eligible_at",
        "priority": "high",
        "eligible_at": str(BASE + 6_000),
    }
    t[0] += 6_000
    await drain(queue, MailJob)
    done = await queue.get(job)
    assert done is not None and done.result == "b"


async def test_update_at_an_aware_time(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Mail(to="a"))
    at = datetime.fromtimestamp((BASE + 90_000) / 1000, UTC)
    assert await queue.update(job, at=at)
    assert ms((await queue.get(job)).eligible_at) == BASE + 90_000  # type: ignore[union-attr]
    assert (await queue.journal(job))[-1].details["changed"] == "eligible_at"


async def test_a_job_out_of_pending_is_not_updated(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    assert not await queue.update("01J9ZQ4K8V3M0S5B2N7XWYQ1RT", priority="high")  # unknown
    job = await queue.enqueue(Mail(to="a"))
    await claim_raw(queue, 1)
    before = await queue.client.redis.hgetall(queue.keys.job(job))
    assert not await queue.update(job, priority="high", task=Mail(to="b"))
    assert await queue.client.redis.hgetall(queue.keys.job(job)) == before
    assert "updated" not in [e.event for e in await queue.journal(job)]


async def test_a_dedup_key_change_moves_the_index_entry(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    redis = queue.client.redis
    job = await queue.enqueue(Mail(to="a", key="k1"))
    assert await queue.update(job, task=Mail(to="a", key="k2"))
    assert await redis.hget(queue.keys.dedup, dedup_field("mail", "k1")) is None
    assert await redis.hget(queue.keys.dedup, dedup_field("mail", "k2")) == job.encode()
    assert (await queue.get(job)).dedup == dedup_field("mail", "k2")  # type: ignore[union-attr]
    assert await queue.enqueue(Mail(to="b", key="k2")) == job  # merges into it now
    assert await queue.update(job, task=Mail(to="c"))  # no key at all: the entry goes
    assert await redis.hget(queue.keys.dedup, dedup_field("mail", "k2")) is None
    assert (await queue.get(job)).dedup is None  # type: ignore[union-attr]


async def test_a_key_another_job_holds_is_refused(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    first = await queue.enqueue(Mail(to="a", key="k1"))
    second = await queue.enqueue(Mail(to="b", key="k2"))
    before = await queue.client.redis.hgetall(queue.keys.job(second))
    with pytest.raises(vr.ConfigurationError, match=first):
        await queue.update(second, task=Mail(to="b", key="k1"))
    assert await queue.client.redis.hgetall(queue.keys.job(second)) == before


async def test_bad_input_writes_nothing(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Mail(to="a"))
    before = await queue.client.redis.hgetall(queue.keys.job(job))
    naive = datetime(2030, 1, 1)  # naive: the point of the test
    aware = datetime(2030, 1, 1, tzinfo=UTC)
    for kwargs in [
        {},
        {"task": Other()},
        {"task": "not a task"},
        {"priority": "urgent"},
        {"priority": True},
        {"delay": -1},
        {"delay": float("nan")},
        {"delay": True},
        {"at": naive},
        {"at": aware, "delay": 5},
        {"delay": timedelta(seconds=-1)},
    ]:
        with pytest.raises(vr.ConfigurationError):
            await queue.update(job, **kwargs)
    assert await queue.client.redis.hgetall(queue.keys.job(job)) == before
    assert [e.event for e in await queue.journal(job)] == ["enqueued"]


async def test_sync_and_sharded_queues_update_too(client: vr.Client, queue_name: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=2)
    job = await sharded.enqueue(Mail(to="a"))
    assert await sharded.update(job, priority="low")
    assert (await sharded.get(job)).priority is vr.Priority.LOW  # type: ignore[union-attr]
    assert not await sharded.update("01J9ZQ4K8V3M0S5B2N7XWYQ1RT", priority="low")


def test_the_sync_client_updates(url: str, queue_name: str) -> None:
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue_name)
        job = sq.enqueue(Mail(to="a"))
        assert sq.update(job, task=Mail(to="z"), priority=vr.Priority.CRITICAL)
        info = sq.get(job)
        assert info is not None and info.payload["to"] == "z" and info.priority is vr.Priority.CRITICAL


async def test_a_corrupt_job_is_refused_with_nothing_written(client: vr.Client, queue_name: str) -> None:
    _t, queue = clocked(client, queue_name)
    job = await queue.enqueue(Mail(to="a"))
    redis = queue.client.redis
    await redis.set(queue.keys.journal(job), "x")  # its journal overwritten by hand
    before = await redis.hgetall(queue.keys.job(job))
    with pytest.raises(vr.CorruptQueueError, match="journal key is not a stream"):
        await queue.update(job, priority="high")
    assert await redis.hgetall(queue.keys.job(job)) == before
