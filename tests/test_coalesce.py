"""Concurrent single enqueues of a queue share script calls, each keeping its own result."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.exceptions import ResponseError

import venturi_redis as vr
from tests.tasks import Echo

pytestmark = pytest.mark.anyio


class _Spy:
    """Counts enqueue script calls (and their jobs); can hold the next one until released."""

    def __init__(self, queue: vr.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.hold: anyio.Event | None = None
        self.entered = anyio.Event()
        self.fail_with: Exception | None = None
        scripts = queue.client.scripts
        real = scripts.call

        async def call(redis: Any, name: str, keys: Any, args: Any) -> Any:
            if name == "enqueue":
                self.sizes.append(int(args[2]))
                self.entered.set()
                if self.hold is not None:
                    hold, self.hold = self.hold, None
                    await hold.wait()
                if self.fail_with is not None:
                    raise self.fail_with
            return await real(redis, name, keys, args)

        monkeypatch.setattr(scripts, "call", call)


async def test_sequential_enqueues_go_out_one_by_one(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    ids = [await queue.enqueue(Echo(text=str(i))) for i in range(5)]
    assert spy.sizes == [1] * 5
    assert len(set(ids)) == 5


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


async def test_the_sender_cancelled_mid_call_still_settles_the_others(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(queue, monkeypatch)
    spy.hold = release = anyio.Event()
    got: dict[str, str] = {}

    async def one(name: str) -> None:
        got[name] = await queue.enqueue(Echo(text=name))

    leader_scope = anyio.CancelScope()

    async def leader() -> None:
        with leader_scope:
            await one("leader")

    async with anyio.create_task_group() as tg:
        tg.start_soon(leader)
        await spy.entered.wait()
        spy.hold = second = anyio.Event()
        tg.start_soon(one, "b")
        tg.start_soon(one, "c")
        await anyio.sleep(0.05)
        leader_scope.cancel()  # the leader's call is shielded: it completes
        release.set()
        await anyio.sleep(0.05)
        second.set()

    assert {"b", "c"} <= set(got)
    assert spy.sizes == [1, 2]  # b and c went out together after the leader's call
    assert (await queue.counts())["pending"] == 3  # the leader's job was created too


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
