"""Guarantees of flow control, ordered keys, schedules and workflows that only
a mutation of their Lua showed undefended (the sequel to test_guarantees_lua.py;
the campaign's table is in the branch's report). Each test failed with one
line of lua/ removed or inverted. The clock is the client's, moved by the test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs
from venturi_redis._store import calls, calls_flow
from venturi_redis._store.calls_flow import FlowJob
from venturi_redis._store.prepare import prepare
from venturi_redis.testing import Clock

pytestmark = pytest.mark.anyio


class Mail(vr.Task):
    KIND: ClassVar[str] = "guarantees-flow.mail"
    domain: str | None = None
    n: int = 0

    def limit_key(self) -> str | None:
        return self.domain


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    clock = Clock()
    async with vr.Client.from_url(url, clock=clock) as client:
        yield client.queue(queue_name), clock


async def claim(queue: vr.Queue, count: int = 10) -> list[tuple[str, str]]:
    return claimed_jobs(await claim_raw(queue, count))


async def complete(queue: vr.Queue, job: tuple[str, str]) -> None:
    c = queue.client
    call = calls.complete(queue.keys, c._now_arg(), [calls.completion(job[0], job[1], "", b"", b"", b"")])
    assert list(await c.sender.call(call)) == [1]


async def domain(queue: vr.Queue, job_id: str) -> str:
    info = await queue.get(job_id)
    assert info is not None
    return str(info.payload["domain"])


# -- flow control ------------------------------------------------------------------------


async def test_a_slot_freed_for_a_key_with_no_job_left_goes_to_the_next_waiting_key(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    await q.set_limit(Mail.KIND, concurrency=1)
    first = await q.enqueue(Mail(domain="a"))
    clock.advance(0.001)
    gone = await q.enqueue(Mail(domain="x"))
    clock.advance(0.001)
    waiting = await q.enqueue(Mail(domain="b"))
    running = await claim(q)
    assert [i for i, _ in running] == [first]  # x, then b, wait on the kind's cap
    assert await q.cancel(gone) == "cancelled"
    await complete(q, running[0])  # the slot goes to x, which has nothing left to run
    assert [i for i, _ in await claim(q)] == [waiting]


async def test_room_a_key_at_its_own_cap_cannot_use_goes_to_the_next_key_waiting_on_the_kind(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    await q.set_limit(Mail.KIND, concurrency=2)
    await q.set_limit(Mail.KIND, concurrency=1, per_key=True)
    c = await q.enqueue(Mail(domain="c"))
    clock.advance(0.001)
    await q.enqueue_many([Mail(domain="a"), Mail(domain="a", n=2)])
    running = dict(await claim(q, 2))  # c, then a: the kind is full
    assert await claim(q) == []  # a (its own cap full too), then c, wait on the kind's cap
    clock.advance(0.001)
    b = await q.enqueue(Mail(domain="b"))
    assert await claim(q) == []  # b waits behind them
    await complete(q, (c, running[c]))  # the slot goes to a, whose own cap refuses it: then on to b
    assert [i for i, _ in await claim(q)] == [b]


async def test_a_key_waiting_on_the_kind_cap_keeps_its_place_when_another_of_its_jobs_comes_due(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    await q.set_limit(Mail.KIND, concurrency=1)
    await q.enqueue(Mail(domain="a"))
    (first,) = await claim(q)
    clock.advance(0.001)
    b = await q.enqueue(Mail(domain="b"))
    clock.advance(0.001)
    await q.enqueue(Mail(domain="c"))
    await q.enqueue(Mail(domain="b", n=2), delay=0.001)  # pending until due, then parked by a claim
    clock.advance(0.001)
    assert await claim(q) == []  # b, then c, wait on the kind's cap
    await complete(q, first)
    assert [i for i, _ in await claim(q)] == [b]


async def test_a_delayed_job_of_a_limited_kind_waits_for_its_time(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.set_limit(Mail.KIND, concurrency=5)
    job_id = await q.enqueue(Mail(domain="a"), delay=60)
    assert await claim(q) == []
    clock.advance(60)
    assert [i for i, _ in await claim(q)] == [job_id]


# -- ordered keys --------------------------------------------------------------------------


class Step(vr.Task):
    KIND: ClassVar[str] = "guarantees-flow.step"
    key: str
    n: int = 0

    def order_key(self) -> str | None:
        return self.key


async def test_a_delayed_job_let_go_by_its_order_key_waits_for_its_time(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    await q.enqueue(Step(key="k"))
    later = await q.enqueue(Step(key="k", n=2), delay=60)
    (holder,) = await claim(q)
    await complete(q, holder)
    assert await claim(q) == []
    clock.advance(60)
    assert [i for i, _ in await claim(q)] == [later]


async def test_a_dead_ordered_job_retried_while_its_key_is_paused_waits_for_the_resume(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, _ = timed
    job_id = await q.enqueue(Step(key="k"))
    ((_, token),) = await claim(q)
    dead = calls.dead(q.keys, q.client._now_arg(), job_id=job_id, token=token, note="e", attachment=b"",
                      carry=b"", reason="permanent")  # fmt: skip
    assert list(await q.client.sender.call(dead)) == [1]
    await q.pause_key("k")
    assert await q.retry(job_id)  # retry_dead.lua: order.lua's arrive, not enqueue's own
    assert await claim(q) == []
    await q.resume_key("k")
    assert [i for i, _ in await claim(q)] == [job_id]


async def test_the_next_job_let_go_by_its_order_key_wakes_a_worker(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.enqueue_many([Step(key="k"), Step(key="k", n=2)])
    (holder,) = await claim(q)  # a short claim: the wake list is emptied
    await complete(q, holder)
    assert await q.client.redis.llen(q.keys.wake) == 1


class Letter(vr.Task):
    KIND: ClassVar[str] = "guarantees-flow.letter"
    key: str

    def order_key(self) -> str | None:
        return self.key

    def limit_key(self) -> str | None:
        return "post"


async def test_pausing_a_key_whose_holder_is_parked_on_a_limit_keeps_it_from_the_freed_slot(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, _ = timed
    await q.set_limit(Letter.KIND, concurrency=1)
    await q.enqueue(Letter(key="a"))
    (running,) = await claim(q)
    b = await q.enqueue(Letter(key="b"))
    assert await claim(q) == []  # b parked on the kind's cap
    await q.pause_key("b")
    await complete(q, running)  # the slot would go to a parked b
    assert await claim(q) == []
    await q.resume_key("b")
    assert [i for i, _ in await claim(q)] == [b]


# -- workflows -----------------------------------------------------------------------------


async def test_a_resent_enqueue_flow_writes_nothing_twice(timed: tuple[vr.Queue, Clock]) -> None:
    """As tests/test_resend.py for enqueue: the call sent again with the same ids."""
    q, _ = timed
    c = q.client

    def job(task: vr.Task[Any]) -> Any:
        return prepare(task, c.max_payload_bytes, None, delay=0, priority=None, lease=None, max_failures=None)

    child, parent = job(Mail(n=1)), job(Mail(n=2))
    flow = [FlowJob(child, "fail", ()), FlowJob(parent, "fail", (child.id,))]
    assert calls_flow.flow_created(await c.sender.call(calls_flow.enqueue_flow(q.keys, c._now_arg(), flow)))
    (done,) = await claim(q)
    await complete(q, done)  # the parent is let go
    assert not calls_flow.flow_created(
        await c.sender.call(calls_flow.enqueue_flow(q.keys, c._now_arg(), flow))
    )
    assert [i for i, _ in await claim(q)] == [parent.id]  # the child does not run again


# -- schedules -----------------------------------------------------------------------------


async def test_a_paused_schedule_declared_with_a_new_task_stays_out_of_the_due_index(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, _ = timed
    await q.schedule("s", Mail(n=1), every=60)
    await q.pause_schedule("s")
    await q.schedule("s", Mail(n=2), every=60)
    assert await q.client.redis.zscore(q.keys.schedules_due, "s") is None


async def test_a_schedule_declared_with_a_new_interval_takes_its_next_fire_time(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    first = await q.schedule("s", Mail(), every=60)
    info = await q.schedule("s", Mail(), every=10)
    assert first.next_at != info.next_at == clock.now + timedelta(seconds=10)


async def test_a_resume_computed_from_a_definition_since_replaced_is_refused(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, clock = timed
    await q.schedule("s", Mail(), every=60)
    await q.pause_schedule("s")
    read = await q.client.redis.hget(q.keys.schedule("s"), "version")
    await q.schedule("s", Mail(), every=10)  # replaced after that read
    stale = await q.store.schedule_pause(
        schedule_id="s", pause=False, version=read.decode(), next_at=clock() + 60_000
    )
    assert not stale.applied
    info = await q.get_schedule("s")
    assert info is not None and info.paused
