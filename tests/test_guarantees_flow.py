"""Guarantees of workflows, batch handlers, declared limits, progress, schedules and
the sharded client's routing, each defended by a test of its own.

Found by a mutation campaign on their Python guards (docs/workflows.md,
docs/semantics.md, docs/flow-control.md, docs/schedules.md): each test here
fails when the guard it names is removed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain
from venturi_redis._worker.progress import INTERVAL

pytestmark = pytest.mark.anyio


class Leaf(vr.Task):
    """Completes with no result: what its dependents read is None."""

    KIND: ClassVar[str] = "gf.leaf"


class LeafJob(Leaf, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Top(vr.Task):
    KIND: ClassVar[str] = "gf.top"
    pad: str = ""


class TopJob(Top, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["seen"] = await ctx.dependency_results()
        return vr.Outcome.completed()


class Vague(Top):
    KIND: ClassVar[str] = "gf.vague"

    def on_dependency_failure(self) -> Literal["fail", "ignore"]:
        return "sometimes"  # type: ignore[return-value]


class Ordered(Top):
    KIND: ClassVar[str] = "gf.ordered"

    def order_key(self) -> str | None:
        return "k"


class Deduped(Top):
    KIND: ClassVar[str] = "gf.deduped"

    def dedup_key(self) -> str | None:
        return "d"


# -- workflows -------------------------------------------------------------------


async def test_a_dependency_that_returned_nothing_reads_as_none(queue: vr.Queue) -> None:
    flow = await queue.enqueue_flow(Top(), [Leaf()])
    state: dict[str, Any] = {}
    await drain(queue, LeafJob, TopJob, state=state)
    assert state["seen"] == {flow.children_ids[0]: None}
    assert (await queue.get(flow.parent_id)).state == "completed"  # type: ignore[union-attr]


async def test_a_workflow_job_must_say_fail_or_ignore(queue: vr.Queue) -> None:
    a = await queue.enqueue(Leaf())
    with pytest.raises(vr.TaskDefinitionError, match="must return 'fail' or 'ignore'"):
        await queue.enqueue(Vague(), after=[a])
    with pytest.raises(vr.TaskDefinitionError, match="must return 'fail' or 'ignore'"):
        await queue.enqueue_flow(Vague(), [Leaf()])
    assert (await queue.counts())["waiting"] == 0


async def test_a_workflow_refuses_an_order_key_and_a_parents_dedup_key(queue: vr.Queue) -> None:
    a = await queue.enqueue(Leaf())
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.enqueue(Ordered(), after=[a])
    with pytest.raises(vr.ConfigurationError, match="dedup key"):
        await queue.enqueue_flow(Deduped(), [Leaf()])
    assert (await queue.counts())["waiting"] == 0


async def test_after_refuses_an_empty_id_and_one_id_past_the_cap(queue: vr.Queue) -> None:
    from venturi_redis._producer.flow import MAX_FLOW_JOBS

    a = await queue.enqueue(Leaf())
    with pytest.raises(vr.ConfigurationError, match="non-empty str"):
        await queue.enqueue(Top(), after=[a, ""])
    ids = [f"01NOSUCHJOB{i}" for i in range(MAX_FLOW_JOBS + 1)]
    with pytest.raises(vr.ConfigurationError, match="at most 10000 jobs"):
        await queue.enqueue(Top(), after=ids)


async def test_enqueue_flow_counts_the_parent_against_max_batch_bytes(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url, max_batch_bytes=1000) as client:
        queue = client.queue(queue_name)
        # The children fit; the parent takes the call past the cap.
        with pytest.raises(vr.PayloadTooLarge, match="max_batch_bytes"):
            await queue.enqueue_flow(Top(pad="p" * 995), [Leaf(), Leaf()])
        assert (await queue.counts())["pending"] == 0


async def test_dependency_results_read_every_page_of_a_large_fan_in(queue: vr.Queue) -> None:
    from venturi_redis._worker.dependencies import read_dependency_results

    # A hash this large is no listpack: HSCAN gives it by pages, not in one reply.
    fields = {f"01CHILD{i:04}": b"gf.leaf\n" for i in range(1000)}
    await queue.client.redis.hset(queue.keys.depresults("01PARENT"), mapping=fields)
    got = await read_dependency_results(queue, "01PARENT", {})
    assert got == dict.fromkeys(fields)


async def test_a_sealed_result_without_its_key_fails_the_run_and_is_not_unreadable(queue: vr.Queue) -> None:
    from venturi_redis._worker.dependencies import UnreadableResult, read_dependency_results

    # UnreadableResult ends the waiting job dead; a missing key is a failed run, retried.
    sealed = vr.Encryption(keys=[b"k" * 32]).seal(b"\xc0")
    await queue.client.redis.hset(queue.keys.depresults("01PARENT"), "01CHILD", b"gf.leaf\n" + sealed)
    with pytest.raises(vr.EncryptionKeyMissing) as caught:
        await read_dependency_results(queue, "01PARENT", {})
    assert not isinstance(caught.value, UnreadableResult)


async def test_a_dependency_result_holding_a_newline_reads_back_whole(queue: vr.Queue) -> None:
    from venturi_redis._model.codec import pack
    from venturi_redis._worker.dependencies import read_dependency_results

    # Stored as kind, newline, result: only the first newline ends the kind.
    field = b"gf.leaf\n" + pack("one\ntwo")
    await queue.client.redis.hset(queue.keys.depresults("01PARENT"), "01CHILD", field)
    assert await read_dependency_results(queue, "01PARENT", {}) == {"01CHILD": "one\ntwo"}


# -- batch handlers and progress -------------------------------------------------


class Tick(vr.Task):
    KIND: ClassVar[str] = "gf.tick"


class TickBatch(Tick, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 10

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Tick]], state: Any) -> None:
        for item in items:
            await item.ctx.report_progress(1)
            await item.ctx.report_progress(2)  # within the interval: held back
        return None


async def test_a_batch_jobs_held_back_progress_lands_before_its_ending(queue: vr.Queue) -> None:
    ids = [await queue.enqueue(Tick()) for _ in range(2)]
    await drain(queue, TickBatch)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == "completed" and info.progress == 2


class Slow(vr.Task):
    KIND: ClassVar[str] = "gf.slow"


class SlowJob(Slow, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress(1)
        await ctx.report_progress(2)  # held back, then written by the timer
        await state["in_flight"].wait()  # the run ends while that write is in flight
        return vr.Outcome.completed()


async def test_a_progress_write_the_ending_cuts_short_is_written_again(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from venturi_redis._store.store import QueueStore

    # Staged by holding the store's second progress call open: the timer's
    # write is then in flight, never sent, when the ending cancels it.
    real = QueueStore.progress
    sent: list[bytes] = []
    in_flight = anyio.Event()

    async def progress(self: QueueStore, job_id: str, token: str, value: bytes) -> bool:
        sent.append(value)
        if len(sent) == 2:
            in_flight.set()
            await anyio.sleep_forever()
        return await real(self, job_id, token, value)

    monkeypatch.setattr(QueueStore, "progress", progress)
    job_id = await queue.enqueue(Slow())
    await drain(queue, SlowJob, state={"in_flight": in_flight})
    info = await queue.get(job_id)
    assert info is not None and info.state == "completed" and info.progress == 2


class Stalled(vr.Task):
    KIND: ClassVar[str] = "gf.stalled"


class StalledJob(Stalled, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress(1)
        await ctx.report_progress(2)  # held back: the timer is set
        time.sleep(INTERVAL * 1.5)  # blocks the loop: the timer is due but has not run
        await ctx.report_progress(3)  # past the interval, yet the timer still holds 2
        return vr.Outcome.completed()


async def test_a_report_past_the_interval_waits_behind_a_pending_timer(queue: vr.Queue) -> None:
    # Written at once, 3 would be overwritten by the timer's older 2.
    job_id = await queue.enqueue(Stalled())
    await drain(queue, StalledJob)
    info = await queue.get(job_id)
    assert info is not None and info.progress == 3


class Bulky(vr.Task):
    KIND: ClassVar[str] = "gf.bulky"


class BulkyJob(Bulky, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        with pytest.raises(vr.PayloadTooLarge, match="over the cap"):
            await ctx.report_progress("x" * 70_000)  # every report is also an event: 64 KiB at most
        state["refused"] = True
        return vr.Outcome.completed()


async def test_a_progress_value_over_64_kib_is_refused_and_never_written(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Bulky())
    state: dict[str, Any] = {}
    await drain(queue, BulkyJob, state=state)
    info = await queue.get(job_id)
    assert state["refused"] and info is not None and info.progress is None


class Chatty(vr.Task):
    KIND: ClassVar[str] = "gf.chatty"


class ChattyJob(Chatty, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.report_progress(1)
        await ctx.report_progress(2)  # held back, then written by the timer
        await state["in_flight"].wait()
        await ctx.report_progress(3)  # comes while the timer writes 2
        state["go_on"].set()
        with anyio.fail_after(10):
            await state["third"].wait()  # the timer writes it too, while the run still runs
        return vr.Outcome.completed()


async def test_a_report_made_while_the_timer_writes_is_written_by_the_timer(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from venturi_redis._store.store import QueueStore

    # The store's second progress call is held open until the handler has reported again.
    real = QueueStore.progress
    sent: list[bytes] = []
    state = {"in_flight": anyio.Event(), "go_on": anyio.Event(), "third": anyio.Event()}

    async def progress(self: QueueStore, job_id: str, token: str, value: bytes) -> bool:
        sent.append(value)
        if len(sent) == 2:
            state["in_flight"].set()
            await state["go_on"].wait()
        elif len(sent) == 3:
            state["third"].set()
        return await real(self, job_id, token, value)

    monkeypatch.setattr(QueueStore, "progress", progress)
    job_id = await queue.enqueue(Chatty())
    await drain(queue, ChattyJob, state=state)
    info = await queue.get(job_id)
    assert info is not None and info.state == "completed" and info.failures == 0 and info.progress == 3


# -- declared limits -------------------------------------------------------------


async def test_a_declared_limit_stored_with_another_concurrency_is_set_again(queue: vr.Queue) -> None:
    from venturi_redis._worker.declared_limits import declare_limits

    await queue.set_limit("gf.tick", concurrency=5, rate=vr.Rate(10, 1))
    await declare_limits([vr.Limit("gf.tick", concurrency=7, rate=vr.Rate(10, 1))], [queue])
    (stored,) = await queue.limits(keys=0)
    assert stored.concurrency == 7


async def test_a_declared_limit_stored_with_another_rate_window_is_set_again(queue: vr.Queue) -> None:
    from venturi_redis._worker.declared_limits import declare_limits

    await queue.set_limit("gf.tick", rate=vr.Rate(10, 1))
    await declare_limits([vr.Limit("gf.tick", rate=vr.Rate(10, 60))], [queue])  # same count, per minute
    (stored,) = await queue.limits(keys=0)
    assert stored.rate is not None and stored.rate.per_ms() == 60_000


async def test_a_declared_limit_stored_as_declared_is_not_written_again(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from venturi_redis._worker.declared_limits import declare_limits

    # Each write readies every parked entity of the kind: a worker's start must not.
    await queue.set_limit("gf.tick", concurrency=5, rate=vr.Rate(10, 1))
    written: list[Any] = []

    async def set_limit(self: vr.Queue, *args: Any, **kwargs: Any) -> None:
        written.append(args)

    monkeypatch.setattr(type(queue), "set_limit", set_limit)
    await declare_limits([vr.Limit("gf.tick", concurrency=5, rate=vr.Rate(10, 1))], [queue])
    assert written == []


async def test_a_negative_running_count_edited_by_hand_reads_as_zero(queue: vr.Queue) -> None:
    await queue.set_limit("gf.tick", concurrency=5)
    await queue.client.redis.hset(queue.keys.limits_state, "gf.tick", "-3")
    (info,) = await queue.limits(keys=0)
    assert info.running == 0


def test_a_cli_rate_per_minute_is_sixty_seconds() -> None:
    from venturi_redis._model.limits import parse_rate

    assert parse_rate("5/1m").per_ms() == 60_000
    assert parse_rate("5/m").per_ms() == 60_000


# -- schedules -------------------------------------------------------------------


def test_a_cron_schedule_fires_at_its_start_at_when_it_matches() -> None:
    from venturi_redis._model.schedule import timing

    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    when = timing(cron="0 * * * *", start_at=start)
    assert when.next_after(0, 0) == int(start.timestamp() * 1000)


def test_an_interval_schedule_first_fires_one_interval_from_now() -> None:
    from venturi_redis._model.schedule import timing

    when = timing(every=60)
    assert when.first_anchor(1_000) == 61_000


def test_a_fire_time_at_end_at_still_fires() -> None:
    from venturi_redis._model.schedule import timing

    # "No fire time after end_at": the one at end_at is the schedule's last.
    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    when = timing(every=60, start_at=start, end_at=start.replace(minute=1))
    first = int(start.timestamp() * 1000)
    assert when.next_after(first, first) == first + 60_000


def test_a_cron_catch_up_counts_at_most_ten_thousand_missed_fire_times() -> None:
    from venturi_redis._model.schedule import MAX_COUNTED, timing

    when = timing(cron="* * * * *")
    due = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp() * 1000)
    count, _ = when.catch_up(due, due + (MAX_COUNTED + 5) * 60_000, 0)
    assert count == MAX_COUNTED


def test_a_six_field_cron_is_refused_though_cronsim_would_read_it() -> None:
    from venturi_redis._model.schedule import timing

    # cronsim takes a sixth (seconds) field: it would fire on another plan than written.
    with pytest.raises(vr.ConfigurationError, match="must have 5 fields"):
        timing(cron="0 0 * * * *")


def test_a_posix_or_right_copy_of_a_zone_is_refused() -> None:
    from venturi_redis._model.schedule import timing

    for tz in ("posix/Europe/Berlin", "right/UTC"):
        with pytest.raises(vr.ConfigurationError, match="is not one IANA zone"):
            timing(cron="0 * * * *", tz=tz)


async def test_a_scheduled_task_with_an_order_key_is_refused_and_nothing_written(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.schedule("s", Ordered(), every=60)
    assert await queue.schedules() == []


async def test_a_scheduled_task_past_max_payload_bytes_is_refused(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url, max_payload_bytes=100) as client:
        queue = client.queue(queue_name)
        with pytest.raises(vr.PayloadTooLarge):
            await queue.schedule("s", Top(pad="p" * 200), every=60)
        assert await queue.schedules() == []


class Refused(vr.Task):
    KIND: ClassVar[str] = "gf.refused"


class RefusedBatch(Refused, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Refused]], state: Any) -> None:
        raise vr.TaskError("no", permanent=True)


async def test_a_batch_raise_ends_each_job_as_its_own_raise_would(queue: vr.Queue) -> None:
    ids = [await queue.enqueue(Refused()) for _ in range(2)]
    await drain(queue, RefusedBatch)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == "dead" and info.failures == 1  # permanent: no retry


class Extra(vr.Task):
    KIND: ClassVar[str] = "gf.extra"


class ExtraBatch(Extra, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Extra]], state: Any) -> Any:
        if items[0].ctx.run_count == 1:
            return [vr.Outcome.completed()] * (len(items) + 1)  # one entry too many
        return None


async def test_a_batch_returning_too_many_entries_fails_every_job(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Extra(), Extra()])
    await drain(queue, ExtraBatch)
    for job_id in ids:
        failed = next(e for e in await queue.journal(job_id) if e.event == "failed")
        assert failed.note is not None and "returned 3 entries for a batch of 2" in failed.note


class Exiting(vr.Task):
    KIND: ClassVar[str] = "gf.exiting"


class ExitingBatch(Exiting, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Exiting]], state: Any) -> Any:
        if items[0].ctx.run_count == 1:
            return [SystemExit(3)] * len(items)
        return None


async def test_a_returned_system_exit_fails_its_job_and_the_worker_goes_on(queue: vr.Queue) -> None:
    # Returned, not raised: the job's failure, never the process's stop.
    ids = await queue.enqueue_many([Exiting(), Exiting()])
    await drain(queue, ExitingBatch)  # would raise SystemExit had the worker stopped
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == "completed" and info.failures == 1


class Snail(vr.Task):
    KIND: ClassVar[str] = "gf.snail"


class SnailBatch(Snail, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Snail]], state: Any) -> None:
        state.setdefault("sizes", []).append(len(items))
        if items[0].ctx.run_count == 1:
            await anyio.sleep(1)  # past the shortest timeout, within the longest
        return None


async def test_a_batch_runs_under_the_shortest_enqueue_timeout_of_its_jobs(queue: vr.Queue) -> None:
    # enqueue(timeout=) is the job's own: the batch honours it, and the shortest one.
    ids = [await queue.enqueue(Snail(), timeout=0.1), await queue.enqueue(Snail(), timeout=5)]
    state: dict[str, Any] = {}
    await drain(queue, SnailBatch, state=state)
    assert state["sizes"][0] == 2  # one batch, or the test proves nothing
    for job_id in ids:
        failed = next(e for e in await queue.journal(job_id) if e.event == "failed")
        assert failed.note is not None and failed.note.startswith("timed out after 0.1 s")


class Wordy(vr.Task):
    KIND: ClassVar[str] = "gf.wordy"


class WordyBatch(Wordy, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Wordy]], state: Any) -> Any:
        return "ok" if items[0].ctx.run_count == 1 else None  # a str is no sequence of entries


async def test_a_batch_returning_a_str_is_told_it_must_return_a_sequence(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Wordy(), Wordy()])
    await drain(queue, WordyBatch)
    for job_id in ids:
        failed = next(e for e in await queue.journal(job_id) if e.event == "failed")
        assert failed.note is not None and "must return None or a sequence" in failed.note
        assert "got str" in failed.note


# -- the sharded client's routing ------------------------------------------------


class Keyed(vr.Task):
    KIND: ClassVar[str] = "gf.keyed"
    key: str = ""

    def order_key(self) -> str | None:
        return self.key


async def test_order_keys_of_one_length_spread_over_partitions(client: vr.Client, queue_name: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=4)
    # Hashed, as dedup keys are: not all in one partition for sharing a length.
    names = {sharded.partition_for(Keyed(key=f"k{i}")).name for i in range(8)}
    assert len(names) > 1


async def test_a_dedup_key_always_goes_to_the_same_partition(client: vr.Client, queue_name: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=4)
    assert len({sharded.partition_for(Deduped()).name for _ in range(8)}) == 1
