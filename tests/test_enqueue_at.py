"""``enqueue(task, at=datetime)`` on every queue face (issue 39, item 4): RQ's ``enqueue_at``,
Celery's ``eta``. An aware datetime, by the scripts' clock; a naive one, or ``at`` beside
a ``delay``, is refused with nothing written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import venturi_redis as vr
from tests.tasks import Echo
from venturi_redis.testing import Clock

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("backend", ["redis", "memory"])]

NAIVE = datetime(2030, 1, 1, 9, 0)


@pytest.fixture
async def clocked(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url, clock=Clock())
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def sync_queue(url: str, queue_name: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(url, clock=Clock()) as sc:
        yield sc.queue(queue_name)


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


async def test_a_job_enqueued_at_a_time_is_eligible_then(clocked: vr.Client, queue_name: str) -> None:
    assert isinstance(clocked.clock, Clock)
    queue = clocked.queue(queue_name)
    berlin = ZoneInfo("Europe/Berlin")
    at = (clocked.clock.now + timedelta(hours=2)).astimezone(berlin)  # any zone: an instant
    job_id = await queue.enqueue(Echo(text="at"), at=at)
    info = await queue.get(job_id)
    assert info is not None and info.eligible_at is not None
    assert _ms(info.eligible_at) == _ms(at)
    assert (await queue.counts())["delayed"] == 1
    # A time already past: eligible now.
    past = await queue.enqueue(Echo(text="late"), at=clocked.clock.now - timedelta(days=1))
    info = await queue.get(past)
    assert info is not None and info.eligible_at is not None
    assert _ms(info.eligible_at) == clocked.clock()


async def test_every_face_takes_at_and_refuses_a_naive_one(
    clocked: vr.Client, sync_queue: vr.SyncQueue, queue_name: str
) -> None:
    assert isinstance(clocked.clock, Clock)
    queue = clocked.queue(queue_name)
    sharded = vr.ShardedQueue(clocked, f"{queue_name}-s", partitions=2)
    at = clocked.clock.now + timedelta(minutes=5)
    for face_at in (queue.enqueue, sharded.enqueue):
        with pytest.raises(vr.ConfigurationError, match="at must be timezone-aware"):
            await face_at(Echo(text="x"), at=NAIVE)
        with pytest.raises(vr.ConfigurationError, match="give at= or delay=, not both"):
            await face_at(Echo(text="x"), at=at, delay=60)
    with pytest.raises(vr.ConfigurationError, match="at must be timezone-aware"):
        sync_queue.enqueue(Echo(text="x"), at=NAIVE)
    with pytest.raises(vr.ConfigurationError, match="give at= or delay=, not both"):
        sync_queue.enqueue(Echo(text="x"), at=datetime.now(UTC), delay=timedelta(seconds=1))
    with pytest.raises(vr.ConfigurationError, match="at must be a timezone-aware datetime"):
        await queue.enqueue(Echo(text="x"), at="tomorrow")  # type: ignore[arg-type]
    # Nothing was written by any refusal.
    assert not any((await queue.counts()).values())
    assert not any((await sharded.counts()).values())
    assert not any(sync_queue.counts().values())

    ids = [await queue.enqueue(Echo(text="q"), at=at), await sharded.enqueue(Echo(text="s"), at=at)]
    infos: list[Any] = [await queue.get(ids[0]), await sharded.get(ids[1])]
    sync_at = datetime.now(UTC) + timedelta(days=1)  # the sync client has a clock of its own
    sync_id = sync_queue.enqueue(Echo(text="y"), at=sync_at)
    infos.append(sync_queue.get(sync_id))
    assert [_ms(i.eligible_at) for i in infos] == [_ms(at), _ms(at), _ms(sync_at)]
