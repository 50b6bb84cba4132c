"""Guarantees the Python side keeps (the worker's, and the producer's dedup merge),
each defended by a test of its own.

Found by a mutation campaign on their guards (docs/guarantees.md,
docs/semantics.md): each test here fails when the guard it names is removed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from venturi_redis._model.sealing import key_id_of, sealed_key_id
from venturi_redis._producer import dedup

pytestmark = pytest.mark.anyio


class Holds(vr.Task):
    """Runs until its context says stop, waits for the test, then says it completed."""

    KIND: ClassVar[str] = "holds"


class HoldsJob(Holds, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["started"].set()
        with anyio.fail_after(10):
            await ctx.cancelled()
            state["reason"] = ctx.cancel_reason
            state["told"].set()
            await state["go"].wait()
        return vr.Outcome.completed()


def holding() -> dict[str, Any]:
    return {"started": anyio.Event(), "told": anyio.Event(), "go": anyio.Event()}


async def test_a_lost_lease_tells_the_handler_once_and_its_outcome_is_refused(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    state = holding()
    job_id = await queue.enqueue(Holds())
    worker = make_worker(queue, HoldsJob, state=state, lease=0.3, reclaim_interval=3600)
    with caplog.at_level(logging.ERROR, logger="venturi_redis.worker"), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await state["started"].wait()
            # Another worker's claim, as a reclaim after an expired lease leaves it.
            await queue.client.redis.hset(queue.keys.job(job_id), "lease_token", "another-worker")
            await state["told"].wait()
            # Renewals after the loss leave the lost job alone: it is not reported again.
            runner = worker._runners[0]
            await runner.extend()
            await runner.extend()
            state["go"].set()
            while job_id in runner.active:
                await anyio.sleep(0.01)
            worker.shutdown()
    assert state["reason"] == "lease lost"
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.RUNNING  # the completion was refused
    lost = [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1


class Waits(vr.Task):
    """Runs until the test lets it go."""

    KIND: ClassVar[str] = "waits-for-go"


class WaitsJob(Waits, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["started"].set()
        with anyio.fail_after(10):
            await state["go"].wait()
        return vr.Outcome.completed()


async def test_a_running_jobs_lease_is_renewed_while_its_handler_runs(queue: vr.Queue) -> None:
    state = holding()
    job_id = await queue.enqueue(Waits())
    key = queue.keys.job(job_id)
    worker = make_worker(queue, WaitsJob, state=state, lease=0.3)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await state["started"].wait()
            first = int(await queue.client.redis.hget(key, "lease_expires"))
            while int(await queue.client.redis.hget(key, "lease_expires")) <= first:
                await anyio.sleep(0.02)
            state["go"].set()
            while job_id in worker._runners[0].active:
                await anyio.sleep(0.01)
            worker.shutdown()
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED
    assert (info.run_count, info.failures) == (1, 0)


async def test_a_failed_lease_renewal_is_logged_and_the_worker_goes_on(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = holding()
    job_id = await queue.enqueue(Waits())
    store = type(queue.store)
    extend = store.extend
    calls = [0]

    async def failing_once(self: Any, leases: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RedisConnectionError("connection dropped during the renewal")
        return await extend(self, leases)

    monkeypatch.setattr(store, "extend", failing_once)
    worker = make_worker(queue, WaitsJob, state=state, lease=0.3)
    with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await state["started"].wait()
            while calls[0] < 2:  # the tick after the failure renews again
                await anyio.sleep(0.02)
            state["go"].set()
            while job_id in worker._runners[0].active:
                await anyio.sleep(0.01)
            worker.shutdown()
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED
    assert "lease renewal failed" in caplog.text


class AwaitsItsOwn(vr.Task):
    """Awaits a task of its own, which the test cancels."""

    KIND: ClassVar[str] = "awaits-its-own"


class AwaitsItsOwnJob(AwaitsItsOwn, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["inner"] = asyncio.ensure_future(asyncio.Event().wait())
        state["started"].set()
        await state["inner"]
        return vr.Outcome.completed()


async def test_a_cancellation_of_run_that_meets_the_handlers_own_cancelled_error_still_releases_the_job(
    queue: vr.Queue,
) -> None:
    state = holding()
    job_id = await queue.enqueue(AwaitsItsOwn())
    worker = make_worker(queue, AwaitsItsOwnJob, state=state)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await state["started"].wait()
            state["inner"].cancel()
            # One turn of the loop: the inner task ends cancelled and the handler's
            # wake-up is queued behind this task, so run() is cancelled while the
            # handler's own CancelledError is already on its way (anyio does not
            # cancel a task whose awaited future is done: task.cancelling() is 0).
            await asyncio.sleep(0)
            tg.cancel_scope.cancel()
    info = await queue.get(job_id)
    assert info is not None and info.failures == 0
    assert (await events(queue, job_id))[:3] == ["enqueued", "claimed", "released"]


class Keyed(vr.Task):
    """A task deduplicated by its key; the default merge replaces the pending job."""

    KIND: ClassVar[str] = "keyed"
    key: str
    n: int

    def dedup_key(self) -> str | None:
        return self.key


async def test_an_enqueue_whose_holder_was_given_another_key_meanwhile_does_not_merge_into_it(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await queue.enqueue(Keyed(key="a", n=1))
    watch_and_read = dedup._watch_and_read
    moved = [False]

    async def key_moves_first(pipe: Any, key: str, *reads: tuple[str, ...]) -> list[Any]:
        if not moved[0]:  # between the enqueue script finding the holder and the merge's WATCH
            moved[0] = True
            assert await queue.update(first, task=Keyed(key="b", n=1))
        return await watch_and_read(pipe, key, *reads)

    monkeypatch.setattr(dedup, "_watch_and_read", key_moves_first)
    second = await queue.enqueue(Keyed(key="a", n=2))
    assert moved[0] and second != first  # key "a" was free again: a job of its own
    held = await queue.get(first)
    assert held is not None and held.payload == {"key": "b", "n": 1}


class KeepsTheLarger(Keyed):
    """Replaces the pending job only with a larger ``n``: a decision made on what it reads."""

    KIND: ClassVar[str] = "keeps-the-larger"

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.replace() if self.n > existing.payload.n else vr.Merge.keep()


async def test_a_merge_retried_after_a_script_flush_is_not_applied_to_a_job_changed_meanwhile(
    client: vr.Client, queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await queue.enqueue(KeepsTheLarger(key="a", n=1))
    await client.redis.script_flush()  # the merge's EXEC meets NOSCRIPT: nothing applied
    watch_and_read = dedup._watch_and_read
    reads = [0]

    async def changes_before_the_second_read(pipe: Any, key: str, *reads_: tuple[str, ...]) -> list[Any]:
        reads[0] += 1
        if reads[0] == 2:  # the same decision, about to be applied again
            assert await queue.update(first, task=KeepsTheLarger(key="a", n=7))
        return await watch_and_read(pipe, key, *reads_)

    monkeypatch.setattr(dedup, "_watch_and_read", changes_before_the_second_read)
    assert await queue.enqueue(KeepsTheLarger(key="a", n=2)) == first
    info = await queue.get(first)
    assert info is not None and info.payload == {"key": "a", "n": 7}  # kept: merge() saw n=7
    assert reads[0] == 3


async def test_an_enqueue_without_the_key_does_not_merge_into_a_sealed_pending_job(
    url: str, queue_name: str
) -> None:
    key = bytes(range(32))
    async with vr.Client.from_url(url, encryption=vr.Encryption(keys=[key])) as keyed:
        first = await keyed.queue(queue_name).enqueue(Keyed(key="a", n=1))
        async with vr.Client.from_url(url) as keyless:
            # Even the default merge, which reads nothing, would write a plain payload over it.
            with pytest.raises(vr.EncryptionKeyMissing, match=key_id_of(key)):
                await keyless.queue(queue_name).enqueue(Keyed(key="a", n=2))
        info = await keyed.queue(queue_name).get(first)
        assert info is not None and info.payload == {"key": "a", "n": 1}
        raw = await keyed.redis.hget(keyed.queue(queue_name).keys.job(first), "payload")
        assert sealed_key_id(raw) == key_id_of(key)


class BadPause(vr.Task):
    """Pauses with a NaN delay, forced past ``vr.Outcome``'s own check."""

    KIND: ClassVar[str] = "bad-pause"


class BadPauseJob(BadPause, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        outcome = vr.Outcome.pause_in(1)
        object.__setattr__(outcome, "delay_ms", float("nan"))
        return outcome


async def test_a_pause_whose_delay_cannot_be_stored_is_a_failed_run_not_a_job_left_running(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await queue.enqueue(BadPause(), max_failures=1)
    worker = make_worker(queue, BadPauseJob)
    with caplog.at_level(logging.ERROR, logger="venturi_redis.worker"), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            # Without the worker's check, the pause script's call refuses the delay: an
            # internal error, and the job waits out its lease.
            while "internal error" not in caplog.text:
                info = await queue.get(job_id)
                if info is not None and info.state is vr.JobState.DEAD:
                    break
                await anyio.sleep(0.02)
            worker.shutdown()
    info = await queue.get(job_id)
    assert info is not None and info.state is vr.JobState.DEAD  # its one failure was the backstop
    assert info.note is not None and info.note.startswith("the run's outcome cannot be stored: pause delay")


class FailsFirst(vr.Task):
    """Raises on its first run (or completes at once, ``fail=False``); completes on the next."""

    KIND: ClassVar[str] = "fails-first"
    fail: bool


class FailsFirstJob(FailsFirst, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if self.fail and ctx.run_count == 1:
            raise ValueError("the first run fails")
        return vr.Outcome.completed()


@pytest.mark.parametrize(("fail", "builder"), [(True, "end_run"), (False, "completion")])
async def test_an_ending_whose_call_cannot_be_built_fails_the_run_now_not_at_its_lease(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, fail: bool, builder: str
) -> None:
    # A bug of the worker's own in building the ending's call: the run is
    # written failed with the error at once (internal_error), and retried.
    # Marked committing before the call was built, the job waited out its lease.
    store = type(queue.store)
    real = getattr(store, builder)
    calls = [0]

    def broken_once(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"{builder} could not be built")
        return real(*args)

    wrapped = broken_once if builder == "end_run" else staticmethod(broken_once)
    monkeypatch.setattr(store, builder, wrapped)
    job_id = await queue.enqueue(FailsFirst(fail=fail))
    await drain(queue, FailsFirstJob, lease=600, timeout=10)
    info = await queue.get(job_id)
    assert info is not None and info.state is vr.JobState.COMPLETED
    assert (info.run_count, info.failures) == (2, 1)
    notes = [e.note or "" for e in await queue.journal(job_id) if e.event == "failed"]
    assert notes == [f"internal error in the worker: RuntimeError: {builder} could not be built"]
