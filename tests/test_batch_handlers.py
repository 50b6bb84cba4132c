"""Batch handlers (issue 40): ``vr.BatchHandler`` runs a KIND's claimed jobs many per call.

Each job of a batch keeps its own lease, journal, ending and backstop: a
``None`` return completes them all, a list gives each its own ending (an
``Outcome``, or an exception that is that job's failure), a raise fails
them all, and a list of the wrong length fails them all with a note saying
so. Run on every backend: the claims, renewals and endings are the scripts'.
"""

from __future__ import annotations

import functools
import math
import threading
import types
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from tests.tasks import Echo, EchoJob
from venturi_redis._model import batch_note

pytestmark = pytest.mark.anyio

Returned = Sequence[vr.Outcome | BaseException] | None


class Mail(vr.Task):
    KIND: ClassVar[str] = "batch.mail"
    to: str


class SendMails(Mail, vr.BatchHandler[dict[str, Any]]):
    BATCH_SIZE: ClassVar[int] = 10

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Mail]], state: dict[str, Any]) -> Returned:
        state.setdefault("sizes", []).append(len(items))
        state.setdefault("ids", []).extend(item.ctx.job_id for item in items)
        return None


async def _states(queue: vr.Queue, ids: Sequence[str]) -> list[vr.JobState]:
    states = []
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None
        states.append(info.state)
    return states


async def test_none_completes_every_job_of_each_batch(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Mail(to=f"u{i}") for i in range(25)])
    state: dict[str, Any] = {}
    await drain(queue, SendMails, state=state)
    assert sorted(state["ids"]) == sorted(ids)  # each job once
    assert sum(state["sizes"]) == 25 and max(state["sizes"]) <= 10
    assert await _states(queue, ids) == [vr.JobState.COMPLETED] * 25
    # Each job's note names its batch (the dashboard's batch-mates); its first job lists them all.
    marks = {}
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None
        found = batch_note.parse(info.note)
        assert found is not None, info.note
        marks[job_id] = found
    for job_id, found in marks.items():
        lead = marks[found.lead]
        assert job_id in lead.ids and found.size == len(lead.ids)


def test_a_batch_mark_lists_at_most_100_ids_and_reads_back() -> None:
    ids = [f"J{i:03}" for i in range(150)]
    text = batch_note.mark("J000", 150, ids)
    assert text.endswith(" J099 (+50 more)]")
    assert batch_note.parse(f"sent {text}") == batch_note.BatchMark("J000", 150, tuple(ids[:100]), 50)
    assert batch_note.parse("done [batch J000 of 150]") == batch_note.BatchMark("J000", 150)
    assert batch_note.parse("done") is None and batch_note.parse(None) is None


class Mixed(vr.Task):
    KIND: ClassVar[str] = "batch.mixed"
    n: int


class MixedJob(Mixed, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Mixed]], state: dict[str, Any]) -> Returned:
        out: list[vr.Outcome | BaseException] = []
        for item in items:
            n, run = item.task.n, item.ctx.run_count
            if n == 0:
                out.append(vr.Outcome.completed(result={"n": n}))
            elif n == 1:  # fails its first run, retried, then completes
                out.append(RuntimeError("flaky") if run == 1 else vr.Outcome.completed())
            elif n == 2:
                out.append(vr.TaskError.permanent("no such mailbox"))
            else:
                out.append(vr.Outcome.pause_in(0) if run == 1 else vr.Outcome.completed())
        return out


async def test_each_item_gets_its_own_ending(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Mixed(n=n) for n in range(4)])
    await drain(queue, MixedJob, state={})
    done, flaky, dead, paused = [await queue.get(i) for i in ids]
    assert done is not None and done.state is vr.JobState.COMPLETED and done.result == {"n": 0}
    assert flaky is not None and flaky.state is vr.JobState.COMPLETED
    assert flaky.run_count == 2 and flaky.failures == 1
    assert "failed" in await events(queue, ids[1])
    assert dead is not None and dead.state is vr.JobState.DEAD
    assert dead.note is not None and dead.note.startswith("no such mailbox")
    assert paused is not None and paused.state is vr.JobState.COMPLETED and paused.failures == 0
    assert "paused" in await events(queue, ids[3])


class Raising(vr.Task):
    KIND: ClassVar[str] = "batch.raising"
    n: int


class RaisingJob(Raising, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Raising]], state: dict[str, Any]) -> Returned:
        state.setdefault("calls", 0)
        state["calls"] += 1
        if items[0].ctx.run_count == 1:
            raise RuntimeError("smtp down")
        return None


async def test_a_raise_fails_every_job_of_the_batch(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Raising(n=n) for n in range(5)])
    await drain(queue, RaisingJob, state={})
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state is vr.JobState.COMPLETED
        assert info.failures == 1 and info.run_count == 2
        failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
        assert len(failed) == 1 and failed[0].note is not None and failed[0].note.startswith("smtp down")


async def test_a_raise_kills_each_job_at_its_own_backstop(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Raising(n=n) for n in range(3)])
    await drain(queue, RaisingJob, state={}, max_failures=1)
    assert await _states(queue, ids) == [vr.JobState.DEAD] * 3


class Miscounting(vr.Task):
    KIND: ClassVar[str] = "batch.miscounting"
    n: int


class MiscountingJob(Miscounting, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Miscounting]], state: dict[str, Any]
    ) -> Returned:
        if items[0].ctx.run_count == 1:
            return [vr.Outcome.completed()]  # one entry, whatever the batch's size
        return None


async def test_the_wrong_number_of_entries_fails_every_job_with_a_note(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Miscounting(n=n) for n in range(3)])
    await drain(queue, MiscountingJob, state={})
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state is vr.JobState.COMPLETED and info.failures == 1
        failed = next(e for e in await queue.journal(job_id) if e.event == "failed")
        assert failed.note is not None
        assert "returned 1 entries for a batch of 3 jobs" in failed.note


class Gathered(vr.Task):
    KIND: ClassVar[str] = "batch.gathered"
    n: int


class GatheredJob(Gathered, vr.BatchHandler[dict[str, Any]]):
    BATCH_SIZE: ClassVar[int] = 6
    BATCH_WAIT: ClassVar[float] = 30.0  # far longer than the test: the batch starts when full

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Gathered]], state: dict[str, Any]) -> Returned:
        state.setdefault("sizes", []).append(len(items))
        return None


async def test_batch_wait_gathers_a_fuller_batch(queue: vr.Queue) -> None:
    first = await queue.enqueue_many([Gathered(n=n) for n in range(3)])
    state: dict[str, Any] = {}
    worker = make_worker(queue, GatheredJob, state=state)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (await queue.counts())["running"] < 3:  # claimed, waiting for more
                await anyio.sleep(0.01)
        assert "sizes" not in state
        later = await queue.enqueue_many([Gathered(n=n) for n in range(3, 6)])
        with anyio.fail_after(10):
            while (await queue.counts())["completed"] < 6:
                await anyio.sleep(0.01)
        worker.shutdown()
    assert state["sizes"] == [6]
    assert await _states(queue, [*first, *later]) == [vr.JobState.COMPLETED] * 6


async def test_a_shutdown_releases_a_forming_batch_unstarted(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Gathered(n=n) for n in range(2)])
    state: dict[str, Any] = {}
    worker = make_worker(queue, GatheredJob, state=state)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (await queue.counts())["running"] < 2:
                await anyio.sleep(0.01)
        worker.shutdown()
    assert "sizes" not in state
    assert await _states(queue, ids) == [vr.JobState.PENDING] * 2
    for job_id in ids:
        assert (await events(queue, job_id))[-1] == "released"


class Slow(vr.Task):
    KIND: ClassVar[str] = "batch.slow"
    n: int


class SlowJob(Slow, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Slow]], state: dict[str, Any]) -> Returned:
        await anyio.sleep(2.0)  # over three lease lengths (0.6 s)
        return None


async def test_each_jobs_lease_is_renewed_through_a_long_batch(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Slow(n=n) for n in range(4)])
    # 0.6 s, renewed every third of it: a 0.2 s lease met a renewal late by more
    # than its slack on a loaded machine (the test asserts no expiry, not timing).
    await drain(queue, SlowJob, state={}, lease=0.6)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state is vr.JobState.COMPLETED and info.run_count == 1
        journal = await events(queue, job_id)
        assert "lease_expired" not in journal and "refused" not in journal


class Timed(vr.Task):
    KIND: ClassVar[str] = "batch.timed"
    n: int

    def timeout(self) -> float | None:
        return 0.1


class TimedJob(Timed, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Timed]], state: dict[str, Any]) -> Returned:
        if items[0].ctx.run_count == 1:
            await anyio.sleep(30)
        return None


async def test_a_batch_that_overruns_its_jobs_timeout_fails_them_all(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Timed(n=n) for n in range(3)])
    await drain(queue, TimedJob, state={})
    for job_id in ids:
        failed = next(e for e in await queue.journal(job_id) if e.event == "failed")
        assert failed.note is not None and failed.note.startswith("timed out after 0.1 s")
    assert await _states(queue, ids) == [vr.JobState.COMPLETED] * 3


class Threaded(vr.Task):
    KIND: ClassVar[str] = "batch.threaded"
    n: int


class ThreadedJob(Threaded, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    def handle_batch(cls, items: Sequence[vr.BatchItem[Threaded]], state: dict[str, Any]) -> Returned:
        state["thread"] = threading.current_thread().name
        for item in items:
            item.ctx.from_thread(item.ctx.report_progress, item.task.n)
        return [vr.Outcome.completed(result=item.task.n * 2) for item in items]


async def test_a_sync_handle_batch_runs_in_a_worker_thread(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Threaded(n=n) for n in range(3)])
    state: dict[str, Any] = {}
    await drain(queue, ThreadedJob, state=state)
    assert state["thread"] != threading.main_thread().name
    for n, job_id in enumerate(ids):
        info = await queue.get(job_id)
        assert info is not None and info.state is vr.JobState.COMPLETED
        assert info.result == n * 2 and info.progress == n


async def test_ordinary_and_batch_jobs_share_a_queue_within_the_concurrency(queue: vr.Queue) -> None:
    running = {"now": 0, "most": 0}

    class Counted(vr.Task):
        KIND: ClassVar[str] = "batch.counted"
        n: int

    class CountedJob(Counted, vr.BatchHandler[Any]):
        BATCH_SIZE: ClassVar[int] = 5

        @classmethod
        async def handle_batch(cls, items: Sequence[vr.BatchItem[Counted]], state: Any) -> Returned:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            await anyio.sleep(0.01)
            running["now"] -= 1
            return None

    class Single(vr.Task):
        KIND: ClassVar[str] = "batch.single"
        n: int

    class SingleJob(Single, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            await anyio.sleep(0.01)
            running["now"] -= 1
            return vr.Outcome.completed()

    tasks: list[vr.Task] = [Counted(n=n) if n % 2 else Single(n=n) for n in range(40)]
    ids = await queue.enqueue_many(tasks)
    await drain(queue, CountedJob, SingleJob, concurrency=2)
    assert await _states(queue, ids) == [vr.JobState.COMPLETED] * 40
    assert running["most"] <= 2  # handler calls at once, a batch counting as one


async def test_the_echo_handler_still_runs_beside_a_batch_handler(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text="hi"), Mail(to="a"), Echo(text="ho")])
    await drain(queue, EchoJob, SendMails, state={})
    assert await _states(queue, ids) == [vr.JobState.COMPLETED] * 3


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("BATCH_SIZE", 0),
        ("BATCH_SIZE", 10_001),
        ("BATCH_SIZE", True),
        ("BATCH_SIZE", 2.0),
        ("BATCH_WAIT", -1),
        ("BATCH_WAIT", math.nan),
        ("BATCH_WAIT", math.inf),
        ("BATCH_WAIT", "1"),
    ],
)
def test_bad_batch_settings_are_refused_at_class_definition(attribute: str, value: object) -> None:
    with pytest.raises(vr.TaskDefinitionError, match=attribute):
        types.new_class("Bad", (Mail, vr.BatchHandler[Any]), {}, lambda ns: ns.update({attribute: value}))


def test_bad_batch_settings_set_later_are_refused_at_registration() -> None:
    class Later(Mail, vr.BatchHandler[Any]):
        KIND: ClassVar[str] = "batch.later"

    Later.BATCH_SIZE = 0
    worker = vr.Worker(vr.Queue.from_url("memory://batch-later"), handle_signals=False)
    expected = r"Later\.BATCH_SIZE must be an int from 1 to 10,000, got 0"
    with pytest.raises(vr.TaskDefinitionError, match=expected):
        worker.register(Later)
    assert worker.kinds == []


def test_handle_batch_must_be_a_classmethod() -> None:
    with pytest.raises(vr.TaskDefinitionError, match="must be a classmethod"):

        class NotClassmethod(Mail, vr.BatchHandler[Any]):
            async def handle_batch(self, items: Any, state: Any) -> None:  # type: ignore[override]
                return None


class Cancellable(vr.Task):
    KIND: ClassVar[str] = "batch.cancellable"
    n: int


class CancellableJob(Cancellable, vr.BatchHandler[dict[str, Any]]):
    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Cancellable]], state: dict[str, Any]
    ) -> Returned:
        first = items[0].ctx
        state["first"] = first.job_id
        state["started"].set()
        with anyio.fail_after(10):
            await first.cancelled()  # an operator cancels this job alone
        assert not any(item.ctx.is_cancelled() for item in items[1:])
        return [RuntimeError("stopped"), *(vr.Outcome.completed() for _ in items[1:])]


async def test_an_operators_cancel_reaches_one_job_of_a_running_batch(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Cancellable(n=n) for n in range(3)])
    state: dict[str, Any] = {"started": anyio.Event()}
    worker = make_worker(queue, CancellableJob, state=state, lease=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(worker.run, until_idle=True))
        with anyio.fail_after(10):
            await state["started"].wait()
        assert await queue.cancel(state["first"]) == "requested"
    for job_id, job_state in zip(ids, await _states(queue, ids), strict=True):
        expected = vr.JobState.CANCELLED if job_id == state["first"] else vr.JobState.COMPLETED
        assert job_state is expected


class Sealed(vr.Task):
    KIND: ClassVar[str] = "batch.sealed"
    card: str


class SealedJob(Sealed, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Sealed]], state: Any) -> Returned:
        return [vr.Outcome.completed(result={"charged": item.task.card}) for item in items]


async def test_a_batch_reads_and_seals_under_encryption_at_rest(url: str, queue_name: str) -> None:
    secret = "4111-1111-1111-1111"
    encryption = vr.Encryption(keys=[b"k" * 32])
    async with vr.Client.from_url(url, encryption=encryption) as client:
        queue = client.queue(queue_name)
        ids = await queue.enqueue_many([Sealed(card=f"{secret}-{n}") for n in range(3)])
        await drain(queue, SealedJob)
        for n, job_id in enumerate(ids):
            raw = await client.redis.hgetall(queue.keys.job(job_id))
            assert secret.encode() not in b"".join(raw.values())
            info = await queue.get(job_id)
            assert info is not None and info.state is vr.JobState.COMPLETED
            assert info.result == {"charged": f"{secret}-{n}"}


async def test_the_testing_plugins_drain_runs_batches(url: str, queue_name: str) -> None:
    from venturi_redis.testing import Clock
    from venturi_redis.testing import drain as plugin_drain

    async with vr.Client.from_url(url, clock=Clock()) as client:
        queue = client.queue(queue_name)
        ids = await queue.enqueue_many([Mail(to=f"u{i}") for i in range(12)])
        state: dict[str, Any] = {}
        report = await plugin_drain(queue, SendMails, state=state)
        assert sorted(info.id for info in report.completed) == sorted(ids)
        assert sorted(state["ids"]) == sorted(ids) and max(state["sizes"]) <= 10
