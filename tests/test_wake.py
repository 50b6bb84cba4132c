"""Waking idle workers: the wake list, its tokens, and the claim pipelined behind BLPOP."""

from __future__ import annotations

import gc
import re
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from redis.exceptions import ResponseError

import venturi_redis as vr
from tests.helpers import claim_raw, drain, make_worker
from tests.servers import RedisServer, replicate
from tests.tasks import Echo, EchoJob
from venturi_redis._store import calls
from venturi_redis._store.keys import WAKE_CAP

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def test_the_wake_cap_is_the_same_in_lua_and_python() -> None:
    lua = (ROOT / "lua" / "include" / "wake.lua").read_text()
    match = re.search(r"^local WAKE_CAP = (\d+)$", lua, re.MULTILINE)
    assert match is not None and int(match.group(1)) == WAKE_CAP


async def tokens(queue: vr.Queue) -> int:
    return int(await queue.client.redis.llen(queue.keys.wake))


async def test_enqueue_pushes_one_token_per_job_created(queue: vr.Queue) -> None:
    await queue.enqueue(Echo(text="a"))
    assert await tokens(queue) == 1
    await queue.enqueue_many([Echo(text=str(i)) for i in range(5)])
    assert await tokens(queue) == 6
    await queue.enqueue(Echo(text="later"), delay=60)  # a timer to update: a token too
    assert await tokens(queue) == 7


async def test_a_dedup_collision_pushes_no_token(queue: vr.Queue) -> None:
    class Once(vr.Task):
        KIND: ClassVar[str] = "wake.once"
        key: str

        def dedup_key(self) -> str:
            return self.key

    first = await queue.enqueue(Once(key="k"))
    assert await queue.enqueue(Once(key="k")) == first  # merged into the pending job (keep)
    assert await tokens(queue) == 1


async def test_the_wake_list_is_capped(queue: vr.Queue) -> None:
    await queue.enqueue_many([Echo(text=str(i)) for i in range(WAKE_CAP + 76)])
    # Chunks of 500 jobs: 500, 1,000, then 1,100 tokens, past the cap: trimmed to half of it.
    assert await tokens(queue) == WAKE_CAP // 2


async def test_a_full_wake_list_is_trimmed_to_half_the_cap_not_on_every_push(queue: vr.Queue) -> None:
    """Busy workers leave the list at the cap: trimming it back to the cap would
    cost each push a second command."""
    r = queue.client.redis
    await r.rpush(queue.keys.wake, *["1"] * WAKE_CAP)
    await queue.enqueue(Echo(text="over"))  # past the cap: trimmed to half of it
    assert await tokens(queue) == WAKE_CAP // 2
    for i in range(3):  # below the cap again: a push is a push
        await queue.enqueue(Echo(text=str(i)))
    assert await tokens(queue) == WAKE_CAP // 2 + 3
    # A push of more tokens than half the cap keeps all of its own (a flow's
    # children are made claimable by one script call).
    await r.rpush(queue.keys.wake, *["1"] * (WAKE_CAP // 2))
    await queue.enqueue_flow(Echo(text="parent"), [Echo(text=str(i)) for i in range(600)])
    assert await tokens(queue) == 600


async def test_a_short_claim_empties_the_wake_list_a_full_one_keeps_it(queue: vr.Queue) -> None:
    await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    assert await tokens(queue) == 3
    reply = await claim_raw(queue, 2)  # full: the third job still waits for a worker
    assert len(reply[2:]) == 2 * len(calls.CLAIM_FIELDS) and await tokens(queue) == 3
    reply = await claim_raw(queue, 2)  # short: every token left is stale
    assert len(reply[2:]) == len(calls.CLAIM_FIELDS) and await tokens(queue) == 0


async def test_a_claim_on_a_paused_queue_empties_the_wake_list(queue: vr.Queue) -> None:
    await queue.pause()
    await queue.enqueue(Echo(text="a"))
    assert await tokens(queue) == 1
    reply = await claim_raw(queue, 1)
    assert int(reply[1]) == -1 and await tokens(queue) == 0
    await queue.resume_queue()  # a token per pending job, for the idle workers
    assert await tokens(queue) == 1


async def test_a_stop_token_makes_the_claim_behind_it_claim_nothing(queue: vr.Queue) -> None:
    await queue.enqueue(Echo(text="a"))
    c, k = queue.client, queue.keys
    stop = k.wake_stop("w1")
    await c.redis.rpush(stop, "1")
    call = calls.claim(k, "", count=1, worker="w1", token_base="tok", default_lease_ms=30_000, stop_key=stop)
    reply = await c.sender.call(call)
    assert list(reply[1:]) == [0]  # nothing claimed
    assert not await c.redis.exists(stop)
    assert (await queue.counts())["pending"] == 1
    # Without a stop token the same call claims.
    reply = await c.sender.call(call)
    assert len(reply[2:]) == len(calls.CLAIM_FIELDS)


async def test_one_enqueue_wakes_several_idle_workers(queue: vr.Queue) -> None:
    """Two idle workers, one slot each, a minute from their next poll: both jobs
    can only finish if the two tokens woke both workers (each job waits for the other)."""
    started: dict[str, Any] = {"n": 0, "both": anyio.Event()}

    class Pair(vr.Task):
        KIND: ClassVar[str] = "wake.pair"

    class PairJob(Pair, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            started["n"] += 1
            if started["n"] == 2:
                started["both"].set()
            with anyio.fail_after(2):  # well before the other worker's next poll
                await started["both"].wait()
            return vr.Outcome.completed()

    workers = [make_worker(queue, PairJob, concurrency=1, poll_interval=60) for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for w in workers:
            tg.start_soon(w.run)
        await anyio.sleep(0.3)  # both idle, blocked on the wake list
        ids = await queue.enqueue_many([Pair(), Pair()])
        with anyio.fail_after(10):
            while (await queue.counts())["completed"] < 2:
                await anyio.sleep(0.02)
        for w in workers:
            w.shutdown()
    infos = [await queue.get(i) for i in ids]
    # Completed on their first run: neither waited out its 2 s for the other.
    assert [(i.state, i.failures) for i in infos if i] == [(vr.JobState.COMPLETED, 0)] * 2


async def test_an_idle_worker_stops_at_once_and_leaves_nothing_behind(queue: vr.Queue) -> None:
    worker = make_worker(queue, EchoJob, poll_interval=60, state={})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.3)  # idle, blocked on the wake list for up to 5 s
        start = time.monotonic()
        worker.shutdown()
    # Not the minute's poll: a bound far from it, not a timing (tests never assert those).
    assert time.monotonic() - start < 30
    assert not await queue.client.redis.exists(queue.keys.wake_stop(worker.id))
    assert (await queue.counts())["running"] == 0
    # It claimed nothing on its way out: a job enqueued now is still pending.
    job_id = await queue.enqueue(Echo(text="after"))
    assert (await queue.get(job_id)).state == vr.JobState.PENDING  # type: ignore[union-attr]


async def test_until_idle_returns_when_the_last_job_ends_not_at_the_next_poll(queue: vr.Queue) -> None:
    class Slow(vr.Task):
        KIND: ClassVar[str] = "wake.slow"

    class SlowJob(Slow, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            await anyio.sleep(0.3)
            return vr.Outcome.completed()

    await queue.enqueue(Slow())
    start = time.monotonic()
    # The claim loop goes idle while the job runs (nothing else is pending); a
    # minute-long poll must not hold up the return once the job is done.
    await drain(queue, SlowJob, poll_interval=60, timeout=45)
    assert time.monotonic() - start < 30  # not the minute's poll
    assert (await queue.counts())["completed"] == 1


async def test_a_delayed_job_is_claimed_when_due_without_a_wake_up(queue: vr.Queue) -> None:
    state: dict[str, Any] = {}
    worker = make_worker(queue, EchoJob, poll_interval=60, state=state)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.2)
        job_id = await queue.enqueue(Echo(text="due"), delay=0.5)
        # The enqueue's token woke the worker, whose claim found the job not
        # due yet; its next block ends when the job comes due.
        with anyio.fail_after(5):
            while (await queue.get(job_id)).state != vr.JobState.COMPLETED:  # type: ignore[union-attr]
                await anyio.sleep(0.02)
        worker.shutdown()
    assert state["ran"] == ["due"]


async def test_in_durable_mode_an_idle_worker_is_woken_and_its_claim_waits_for_the_replica() -> None:
    """Durable mode cannot pipeline the claim behind BLPOP (WAIT must follow it on
    the same connection): BLPOP goes through the client, then the claim."""
    with RedisServer() as master, RedisServer("--repl-diskless-sync-delay", "0") as replica:
        await replicate(replica, master)
        async with vr.Client.from_url(master.url, durable=vr.Durability(replicas=1, timeout=1.0)) as c:
            q = c.queue("durable-wake")
            state: dict[str, Any] = {}
            worker = make_worker(q, EchoJob, poll_interval=60, state=state)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await anyio.sleep(0.3)  # idle, blocked on the wake list
                start = time.monotonic()
                job_id = await q.enqueue(Echo(text="durable"))
                with anyio.fail_after(5):
                    while (await q.get(job_id)).state != vr.JobState.COMPLETED:  # type: ignore[union-attr]
                        await anyio.sleep(0.02)
                woken_in = time.monotonic() - start
                stop = time.monotonic()
                worker.shutdown()
            assert woken_in < 2.0  # a wake-up, not the block running out (5 s)
            assert time.monotonic() - stop < 2.0  # the stop tokens cut the BLPOP short
            assert state["ran"] == ["durable"]
            assert not await c.redis.exists(q.keys.wake_stop(worker.id))


async def test_a_job_claimed_while_idle_starts_before_the_next_idle_claim(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pickup latency: the slot task runs the handler first; arming the next
    BLPOP and claim (or, without one, the next wait) comes after it."""
    from venturi_redis._worker import runner as _runner

    order: list[str] = []
    real_idle_claim = _runner._Runner.idle_claim

    async def idle_claim(self: Any, want: int, seconds: float) -> Any:
        order.append("idle claim")
        return await real_idle_claim(self, want, seconds)

    monkeypatch.setattr(_runner._Runner, "idle_claim", idle_claim)

    class Mark(vr.Task):
        KIND: ClassVar[str] = "wake.mark"

    class MarkJob(Mark, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            order.append("handler")
            return vr.Outcome.completed()

    worker = make_worker(queue, MarkJob, poll_interval=5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while "idle claim" not in order:  # the worker is idle, waiting for a wake-up
                await anyio.sleep(0.01)
            job_id = await queue.enqueue(Mark())
            while len(order) < 3:
                await anyio.sleep(0.01)
            await wait_done(queue, job_id)
        worker.shutdown()
    assert order[:3] == ["idle claim", "handler", "idle claim"]


async def test_an_error_reply_to_the_idle_blpop_leaves_its_connection_in_step(queue: vr.Queue) -> None:
    """An error reply to the idle BLPOP (WRONGTYPE here: the schedules' wake list
    written by hand; on a live server BUSY, while a script runs past its time,
    or MISCONF) was raised before the reply of the claim behind it was read:
    every later exchange on that connection read the one before's reply, a
    claim's as its BLPOP's and its BLPOP's as its claim's, and once the key was
    repaired the worker died parsing one (a ValueError). The jobs such a claim
    took were never run either: they waited out their lease."""
    worker = make_worker(queue, EchoJob, poll_interval=0.2, state={})
    crashed: list[BaseException] = []

    async def run() -> None:
        try:
            await worker.run()
        except Exception as exc:  # noqa: BLE001 - what the test reports
            crashed.append(exc)

    r = queue.client.redis
    ids: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0.3)  # idle, blocked on the wake list
        await r.set(queue.keys.schedules_wake, "not a list")
        for i in range(10):  # each idle BLPOP is refused; the claims behind them still run
            ids.append(await queue.enqueue(Echo(text=f"refused {i}")))
            await anyio.sleep(0.05)
        await r.delete(queue.keys.schedules_wake)  # repaired
        for i in range(10):
            ids.append(await queue.enqueue(Echo(text=f"repaired {i}")))
            await anyio.sleep(0.05)
        # A bound against a job left to its lease (30 s), not a timing.
        with anyio.move_on_after(15):
            while not crashed and (await queue.counts())["completed"] < len(ids):
                await anyio.sleep(0.02)
        worker.shutdown()
    assert not crashed, crashed
    infos = [await queue.get(i) for i in ids]
    # Each completed on its first run: no claim's jobs were dropped.
    assert [(i.state, i.failures) for i in infos if i] == [(vr.JobState.COMPLETED, 0)] * len(ids)


# A Cluster has no idle claim behind its BLPOP (runner.py _can_arm): nothing to show there.
@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_the_jobs_a_claim_takes_behind_a_refused_blpop_are_handed_out(queue: vr.Queue) -> None:
    """The claim behind a refused BLPOP runs all the same: its jobs are the
    worker's to run, not left running unseen until their lease runs out."""
    runner = make_worker(queue, EchoJob)._runners[0]
    r = queue.client.redis
    job_id = await queue.enqueue(Echo(text="a"))
    await r.delete(queue.keys.wake)  # no token: the BLPOP looks at the next key
    await r.set(queue.keys.schedules_wake, "not a list")
    try:
        _, _, jobs = await runner._armed_claim(1, 1.0)
        assert [j.id for j in jobs] == [job_id]
        # Nothing to claim: the BLPOP's error is raised, for the claim loop to log.
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await runner._armed_claim(1, 1.0)
        await r.delete(queue.keys.schedules_wake)
        later = await queue.enqueue(Echo(text="b"))
        # The connection is in step: this exchange's replies are its own.
        _, _, jobs = await runner._armed_claim(1, 1.0)
        assert [j.id for j in jobs] == [later]
    finally:
        await runner.close()


async def wait_done(queue: vr.Queue, job_id: str) -> None:
    while (info := await queue.get(job_id)) is None or info.state != vr.JobState.COMPLETED:
        await anyio.sleep(0.01)


async def test_idle_wake_ups_leave_no_cyclic_garbage(queue: vr.Queue) -> None:
    """An idle wait and its wake-up leave nothing that only the collector can
    free: a young collection's pause (1-2 ms in W3's worker, benchmarks/
    w3_trace.py) lands on whichever job is being picked up. Each wait used to
    leave its cancelled watcher task behind (a CancelledError, its traceback
    and frames: ~33 objects)."""
    worker = make_worker(queue, EchoJob, poll_interval=5, state={})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.3)  # idle, blocked on the wake list
        with anyio.fail_after(20):
            await wait_done(queue, await queue.enqueue(Echo(text="warm-up")))
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept, to be looked at
            try:
                for i in range(20):  # each job wakes the idle worker, which then waits again
                    await wait_done(queue, await queue.enqueue(Echo(text=str(i))))
                gc.collect()
                garbage = list(gc.garbage)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
        worker.shutdown()
    left = [o for o in garbage if isinstance(o, (BaseException, types.FrameType, types.TracebackType))]
    assert not left, left[:5]


def test_an_interrupt_reaches_the_wait_that_registers_after_it_and_no_wait_after_that() -> None:
    from venturi_redis._worker.interrupt import Interrupt

    calls: list[str] = []
    interrupt = Interrupt()
    interrupt.on_set(lambda: calls.append("first"))
    interrupt.on_set(None)  # that wait ended without an interrupt
    interrupt.set()
    assert calls == [] and interrupt.is_set()
    # Set before the wait registered (a shutdown between the claim loop's
    # fresh Interrupt and the idle claim): the wait is cut short all the same.
    interrupt.on_set(lambda: calls.append("late"))
    interrupt.set()  # once set, it stays set; a second set calls nothing more
    assert calls == ["late"]
