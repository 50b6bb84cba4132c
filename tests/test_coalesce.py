"""Concurrent single enqueues of a queue share script calls, each keeping its own result."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.exceptions import ResponseError

import venturi_redis as vr
from tests.tasks import Echo
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio


class _Spy:
    """Counts enqueue script calls (and their jobs); can hold the next one until released."""

    def __init__(self, queue: vr.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.hold: anyio.Event | None = None
        self.entered = anyio.Event()
        self.fail_with: Exception | None = None
        sender = queue.client.sender
        real = sender.call_on_lane  # every enqueue script call, on the lane or the pool

        async def call(script_call: calls.Call) -> Any:
            if script_call.name == "enqueue":
                # KEYS: three, then each job's hash and pending set (no offload here).
                self.sizes.append((len(script_call.keys) - 3) // 2)
                self.entered.set()
                if self.hold is not None:
                    hold, self.hold = self.hold, None
                    await hold.wait()
                if self.fail_with is not None:
                    raise self.fail_with
            return await real(script_call)

        monkeypatch.setattr(sender, "call_on_lane", call)


async def test_sequential_enqueues_go_out_one_by_one(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    ids = [await queue.enqueue(Echo(text=str(i))) for i in range(5)]
    assert spy.sizes == [1] * 5
    assert len(set(ids)) == 5


async def test_other_tasks_run_while_an_enqueue_is_in_flight(queue: vr.Queue) -> None:
    """What sharing needs on every backend: a call in flight lets the event loop run other
    tasks, which then find it there. On ``memory://`` that is _transport/memory.py's doing
    (from Python 3.12, nothing in redis-py or fakeredis suspends a command there)."""
    order: list[str] = []

    async def enqueue() -> None:
        await queue.enqueue(Echo(text="first"))
        order.append("enqueued")

    async def other() -> None:
        order.append("another task ran")

    async with anyio.create_task_group() as tg:
        tg.start_soon(enqueue)
        tg.start_soon(other)
    assert order == ["another task ran", "enqueued"]


async def test_a_burst_shares_calls_and_every_caller_gets_its_own_id(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    ids: dict[int, str] = {}

    async def one(i: int) -> None:
        ids[i] = await queue.enqueue(Echo(text=str(i)))

    async with anyio.create_task_group() as tg:
        for i in range(300):
            tg.start_soon(one, i)

    assert sum(spy.sizes) == 300 and len(spy.sizes) < 300 and max(spy.sizes) > 1
    assert len(set(ids.values())) == 300
    for i in (0, 150, 299):
        info = await queue.get(ids[i])
        assert info is not None and info.payload == {"text": str(i)}
    assert (await queue.counts())["pending"] == 300


async def test_a_waiting_call_that_is_cancelled_writes_nothing(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    spy.hold = release = anyio.Event()
    got: dict[str, str] = {}

    async def one(name: str) -> None:
        got[name] = await queue.enqueue(Echo(text=name))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "leader")
        await spy.entered.wait()  # the leader's call is in flight (held)
        with anyio.CancelScope() as withdrawn:
            withdrawn.cancel()
            await one("withdrawn")  # waits behind the leader, then is cancelled
        tg.start_soon(one, "later")
        await anyio.sleep(0.05)
        release.set()

    assert set(got) == {"leader", "later"}
    infos = [await queue.get(j) for j in got.values()]
    assert sorted(i.payload["text"] for i in infos if i is not None) == ["later", "leader"]
    assert (await queue.counts())["pending"] == 2
    assert spy.sizes == [1, 1]


async def test_a_lone_sender_cancelled_mid_call_hands_the_lead_on(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    spy.hold = anyio.Event()  # never released: the lone call is cancelled while held
    got: dict[str, str] = {}
    alone = anyio.CancelScope()

    async def one(name: str) -> None:
        got[name] = await queue.enqueue(Echo(text=name))

    async def lone() -> None:
        with alone:
            await one("alone")

    async with anyio.create_task_group() as tg:
        tg.start_soon(lone)
        await spy.entered.wait()
        tg.start_soon(one, "b")
        tg.start_soon(one, "c")
        await anyio.sleep(0.05)
        alone.cancel()  # its own call only: nobody else's job rides on it

    assert set(got) == {"b", "c"}
    assert spy.sizes == [1, 2]  # b and c went out together once the lead passed on
    assert (await queue.counts())["pending"] == 2


async def test_a_batch_sender_cancelled_mid_call_still_settles_the_others(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    spy.hold = first = anyio.Event()
    got: dict[str, str] = {}
    b_scope = anyio.CancelScope()

    async def one(name: str) -> None:
        got[name] = await queue.enqueue(Echo(text=name))

    async def b() -> None:
        with b_scope:
            await one("b")

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        await spy.entered.wait()
        tg.start_soon(b)  # first in line: it will send the batch of b, c, d
        await anyio.sleep(0.01)
        tg.start_soon(one, "c")
        tg.start_soon(one, "d")
        await anyio.sleep(0.05)
        spy.entered = anyio.Event()
        spy.hold = second = anyio.Event()
        first.set()
        await spy.entered.wait()  # b's batch is in flight (held)
        b_scope.cancel()  # shielded: the batch completes for c and d (and b)
        await anyio.sleep(0.05)
        second.set()

    assert {"a", "c", "d"} <= set(got)
    assert spy.sizes == [1, 3]
    assert (await queue.counts())["pending"] == 4


async def test_an_error_reaches_every_caller_of_the_batch(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    spy.hold = release = anyio.Event()
    errors: list[str] = []

    async def one(name: str) -> None:
        try:
            await queue.enqueue(Echo(text=name))
        except ResponseError as exc:
            errors.append(f"{name}: {exc}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "leader")
        await spy.entered.wait()
        for name in ("b", "c", "d"):
            tg.start_soon(one, name)
        await anyio.sleep(0.05)
        spy.fail_with = ResponseError("OOM command not allowed")
        release.set()

    assert sorted(errors) == [f"{n}: OOM command not allowed" for n in ("b", "c", "d", "leader")]
    assert spy.sizes == [1, 3]
    assert (await queue.counts())["pending"] == 0
