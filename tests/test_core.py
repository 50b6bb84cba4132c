"""The core contract, on real Redis and on fakeredis: enqueue, outcomes, carry, ordering."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import anyio
import msgpack
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from tests.tasks import Counter, Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob, Steps, StepsJob

pytestmark = pytest.mark.anyio


# -- enqueue and read back -------------------------------------------------------------


async def test_enqueue_returns_a_ulid_and_the_job_reads_back(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="hi"))
    assert len(job_id) == 26
    info = await queue.get(job_id)
    assert info is not None
    assert (info.id, info.kind, info.state, info.priority) == (
        job_id,
        "echo",
        vr.JobState.PENDING,
        vr.Priority.NORMAL,
    )
    assert info.payload == {"text": "hi"}
    assert (info.run_count, info.failures, info.carry, info.note) == (0, 0, None, None)
    assert info.eligible_at is not None and info.eligible_at >= info.created_at
    journal = await queue.journal(job_id)
    assert [e.event for e in journal] == ["enqueued"]
    assert journal[0].details["priority"] == "normal"


async def test_unknown_job_reads_as_none(queue: vr.Queue) -> None:
    assert await queue.get("01J00000000000000000000000") is None
    assert await queue.journal("01J00000000000000000000000") == []


async def test_metadata_is_plain_text_in_the_hash(client: vr.Client, queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), priority=vr.Priority.HIGH, max_failures=3, lease=60)
    raw = await client.redis.hgetall(queue.keys.job(job_id))
    assert raw[b"kind"] == b"echo"
    assert raw[b"state"] == b"pending"
    assert raw[b"priority"] == b"high"
    assert raw[b"max_failures"] == b"3"
    assert raw[b"lease_ms"] == b"60000"
    assert int(raw[b"eligible_at"]) > 0
    assert await client.redis.zscore(queue.keys.pending(vr.Priority.HIGH), job_id) is not None


async def test_a_job_hash_holds_only_what_is_not_derivable(client: vr.Client, queue: vr.Queue) -> None:
    # Memory per job (benchmarks W6): no id field (the key has it), no zero
    # counters, no updated_at equal to created_at, no emptied lease fields.
    job_id = await queue.enqueue(Echo(text=""))  # completes with an empty note
    key = queue.keys.job(job_id)
    pending = await client.redis.hgetall(key)
    assert set(pending) == {b"kind", b"state", b"priority", b"eligible_at", b"created_at", b"payload"}
    info = await queue.get(job_id)
    assert info is not None
    assert (info.id, info.run_count, info.failures) == (job_id, 0, 0)
    assert info.updated_at == info.created_at
    await drain(queue, EchoJob)
    done = await client.redis.hgetall(key)
    assert done[b"state"] == b"completed" and done[b"run_count"] == b"1"
    gone = {b"id", b"failures", b"lease_token", b"lease_expires", b"note"}
    assert not gone & set(done)
    assert done[b"lease_owner"]  # kept for forensics
    info = await queue.get(job_id)
    assert info is not None
    assert (info.id, info.state, info.failures, info.note, info.lease_expires_at) == (
        job_id,
        vr.JobState.COMPLETED,
        0,
        None,
        None,
    )
    assert info.updated_at == info.finished_at and info.updated_at >= info.created_at


async def test_enqueue_many_keeps_order_and_options(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(1200)], priority="low", delay=60)
    assert len(ids) == len(set(ids)) == 1200
    assert ids == sorted(ids)  # ULIDs from one process are monotonic
    counts = await queue.counts()
    assert counts["pending:low"] == 1200
    info = await queue.get(ids[-1])
    assert info is not None and info.payload == {"text": "1199"} and info.priority == vr.Priority.LOW


async def test_enqueue_validates_before_writing(client: vr.Client, queue: vr.Queue) -> None:
    class NoKind(vr.Task):
        x: int = 1

    with pytest.raises(vr.TaskDefinitionError, match="KIND"):
        await queue.enqueue(NoKind())
    with pytest.raises(vr.TaskDefinitionError, match=r"vr\.Task"):
        await queue.enqueue({"text": "hi"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay"):
        await queue.enqueue(Echo(text="x"), delay=-1)
    with pytest.raises(vr.ConfigurationError, match="max_failures"):
        await queue.enqueue(Echo(text="x"), max_failures=0)
    with pytest.raises(ValueError, match="priority"):
        await queue.enqueue(Echo(text="x"), priority="urgent")
    with pytest.raises(vr.TaskDefinitionError, match="carry"):
        await queue.enqueue(Steps(), carry=vr.NoCarry())
    # a batch with one bad task writes nothing at all
    with pytest.raises(vr.TaskDefinitionError):
        await queue.enqueue_many([Echo(text="ok"), NoKind()])  # type: ignore[list-item]
    assert (await queue.counts())["pending"] == 0


class Unique(vr.Task):
    KIND: ClassVar[str] = "unique"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        raise ValueError(f"{self.key} is already queued")


async def test_enqueue_many_says_which_tasks_a_late_script_error_left_written(
    client: vr.Client, queue: vr.Queue
) -> None:
    # The second chunk's first job takes a dedup field, and the dedup index is
    # not a hash: its script fails at that first write, after the first chunk
    # ran (Redis does not roll back inside MULTI/EXEC either).
    await client.redis.set(queue.keys.dedup, b"not a hash")
    tasks: list[vr.Task[Any]] = [Echo(text=str(i)) for i in range(500)]
    tasks += [Unique(key="late")] + [Echo(text=str(i)) for i in range(501, 700)]
    with pytest.raises(vr.PartialEnqueueError, match="500 of 700 tasks enqueued") as caught:
        await queue.enqueue_many(tasks)
    err = caught.value
    assert isinstance(err.__cause__, Exception) and "WRONGTYPE" in str(err.__cause__)
    assert err.unknown == []
    assert err.not_enqueued == list(range(500, 700))
    written = [job_id for job_id in err.ids if job_id is not None]
    assert len(written) == 500 and err.ids[500:] == [None] * 200
    assert (await queue.counts())["pending"] == 500
    for i in (0, 499):
        info = await queue.get(written[i])
        assert info is not None and info.payload == {"text": str(i)}
    # Within one chunk, nothing written: the plain error, as for a single enqueue.
    with pytest.raises(Exception, match="WRONGTYPE") as single:
        await queue.enqueue_many([Unique(key="early"), Echo(text="x")])
    assert not isinstance(single.value, vr.PartialEnqueueError)
    assert (await queue.counts())["pending"] == 500


async def test_enqueue_many_says_which_tasks_were_written_when_a_merge_raises(queue: vr.Queue) -> None:
    tasks: list[vr.Task[Any]] = [Echo(text="a"), Unique(key="k"), Echo(text="b"), Unique(key="k")]
    with pytest.raises(vr.PartialEnqueueError, match="3 of 4 tasks enqueued") as caught:
        await queue.enqueue_many(tasks)
    err = caught.value
    assert isinstance(err.__cause__, ValueError) and "k is already queued" in str(err.__cause__)
    assert err.ids[3] is None and err.not_enqueued == [3]
    for i in (0, 1, 2):
        job_id = err.ids[i]
        assert job_id is not None
        assert (await queue.get(job_id)) is not None
    assert (await queue.counts())["pending"] == 3
    # A batch whose only collision raises has written nothing: the merge's own error.
    with pytest.raises(ValueError, match="k is already queued"):
        await queue.enqueue_many([Unique(key="k")])
    assert (await queue.counts())["pending"] == 3


class Urgent(vr.Task):
    KIND: ClassVar[str] = "urgent"
    level: Any = "high"
    key: Any = None

    def priority(self) -> vr.Priority:
        return self.level  # type: ignore[no-any-return]

    def dedup_key(self) -> str | None:
        return self.key  # type: ignore[no-any-return]


async def test_a_single_enqueue_takes_the_tasks_priority_as_a_name_an_int_or_a_priority(
    queue: vr.Queue,
) -> None:
    ids = [await queue.enqueue(Urgent(level=level)) for level in ("critical", 0, vr.Priority.HIGH)]
    infos = [await queue.get(i) for i in ids]
    assert [i.priority for i in infos if i is not None] == [
        vr.Priority.CRITICAL,
        vr.Priority.LOW,
        vr.Priority.HIGH,
    ]
    for bad in ("urgent", 7):
        with pytest.raises(ValueError, match=r"[Pp]riority"):
            await queue.enqueue(Urgent(level=bad))
    assert (await queue.counts())["pending"] == 3


async def test_a_single_enqueue_takes_a_zero_delay_in_any_form_and_refuses_nan(queue: vr.Queue) -> None:
    for delay in (0, 0.0, -0.0, timedelta(0)):
        info = await queue.get(await queue.enqueue(Echo(text="now"), delay=delay))
        assert info is not None and info.eligible_at == info.created_at
    info = await queue.get(await queue.enqueue(Echo(text="later"), delay=timedelta(seconds=2)))
    assert info is not None and info.eligible_at - info.created_at == timedelta(seconds=2)
    for bad in (float("nan"), float("inf"), -0.001, timedelta(seconds=-1), False, True):
        with pytest.raises(vr.ConfigurationError, match="delay"):
            await queue.enqueue(Echo(text="x"), delay=bad)
    assert (await queue.counts())["pending"] == 5


async def test_a_kind_reassigned_on_the_class_is_the_one_enqueued(queue: vr.Queue) -> None:
    class Renamed(vr.Task):
        KIND: ClassVar[str] = "renamed-v1"

    first = await queue.enqueue(Renamed())
    Renamed.KIND = "renamed-v2"
    second = await queue.enqueue(Renamed())
    Renamed.KIND = ""
    with pytest.raises(vr.TaskDefinitionError, match="KIND"):
        await queue.enqueue(Renamed())
    with pytest.raises(vr.TaskDefinitionError, match="KIND"):  # refused every time, not once
        await queue.enqueue(Renamed())
    kinds = [(await queue.get(i)).kind for i in (first, second)]  # type: ignore[union-attr]
    assert kinds == ["renamed-v1", "renamed-v2"]


async def test_enqueue_many_takes_each_tasks_own_kind_priority_and_dedup_key(
    client: vr.Client, queue: vr.Queue
) -> None:
    ids = await queue.enqueue_many(
        [Echo(text="a"), Urgent(level="critical", key="k"), Urgent(level=0), Echo(text="b")]
    )
    assert ids == sorted(ids) and len(set(ids)) == 4
    infos = [await queue.get(i) for i in ids]
    assert [(i.kind, i.priority, i.dedup) for i in infos if i is not None] == [
        ("echo", vr.Priority.NORMAL, None),
        ("urgent", vr.Priority.CRITICAL, "6:urgent:k"),
        ("urgent", vr.Priority.LOW, None),
        ("echo", vr.Priority.NORMAL, None),
    ]
    # an explicit priority overrides every task's own, and the options apply to all
    batch = [Echo(text="c"), Urgent(level="critical"), Urgent(level=0)]
    ids = await queue.enqueue_many(batch, priority=vr.Priority.HIGH, delay=7, lease=30, max_failures=None)
    for job_id, task in zip(ids, batch, strict=True):
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert (raw[b"kind"].decode(), raw[b"priority"]) == (task.kind(), b"high")
        assert (raw[b"lease_ms"], raw[b"max_failures"], raw.get(b"carry")) == (b"30000", b"none", None)
        assert int(raw[b"eligible_at"]) - int(raw[b"created_at"]) == 7_000
        assert raw[b"payload"] == msgpack.packb(task.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"text": "x"}, vr.TaskDefinitionError, r"vr\.Task instance, got dict"),
        (Urgent(level="urgent"), ValueError, "unknown priority 'urgent'"),
        (Urgent(key=7), vr.TaskDefinitionError, "urgent.dedup_key.. must return str or None, got int"),
        (Urgent(key=""), vr.ConfigurationError, "urgent dedup key must be 1 to 1024 bytes"),
        (Urgent(key="x" * 2000), vr.ConfigurationError, "got 2000 bytes"),
        (Urgent(level="x" * (1 << 20)), vr.PayloadTooLarge, "urgent payload is .* over the cap"),
    ],
)
@pytest.mark.parametrize("position", [0, 1, 2])
async def test_enqueue_many_checks_every_task_as_enqueue_does(
    queue: vr.Queue, bad: Any, error: type[Exception], match: str, position: int
) -> None:
    with pytest.raises(error, match=match):
        await queue.enqueue(bad)
    tasks: list[Any] = [Echo(text="ok"), Urgent(), Echo(text="ok")]
    tasks[position] = bad
    with pytest.raises(error, match=match):
        await queue.enqueue_many(tasks)
    assert (await queue.counts())["pending"] == 0


async def test_enqueue_many_checks_its_arguments_with_the_first_task(queue: vr.Queue) -> None:
    # The first task's own errors come first, as from enqueue; then the call's arguments.
    with pytest.raises(vr.TaskDefinitionError, match=r"vr\.Task"):
        await queue.enqueue_many([{"text": "x"}, Echo(text="ok")], priority="urgent")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unknown priority"):
        await queue.enqueue_many([Echo(text="ok"), {"text": "x"}], priority="urgent")  # type: ignore[list-item]
    with pytest.raises(vr.ConfigurationError, match="max_failures"):
        await queue.enqueue_many([Echo(text="ok")] * 3, max_failures=0)
    with pytest.raises(vr.ConfigurationError, match="lease must be positive"):
        await queue.enqueue_many([Echo(text="ok")] * 3, lease=0.0001)
    with pytest.raises(ValueError, match="delay"):
        await queue.enqueue_many([Echo(text="ok")] * 3, delay=float("nan"))
    assert await queue.enqueue_many([], priority="urgent", max_failures=0) == []  # nothing to check them with
    assert (await queue.counts())["pending"] == 0


async def test_payload_cap_is_checked_before_redis(url: str, queue_name: str) -> None:
    client = vr.Client.from_url(url, max_payload_bytes=100)
    try:
        q = client.queue(queue_name)
        with pytest.raises(vr.PayloadTooLarge, match="over the cap"):
            await q.enqueue(Echo(text="x" * 200))
        assert (await q.counts())["pending"] == 0
    finally:
        await client.aclose()


async def test_bad_names_are_rejected(client: vr.Client) -> None:
    for name in ["", "a{b}", "a:b", "a*", "with space", "line\nbreak", "x" * 200, "ü"]:
        with pytest.raises(vr.ConfigurationError, match="queue name"):
            client.queue(name)


# -- outcomes --------------------------------------------------------------------------


async def test_completed_with_note(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="hello"))
    state: dict[str, Any] = {}
    await drain(queue, EchoJob, state=state)
    info = await queue.get(job_id)
    assert info is not None
    assert (info.state, info.note, info.run_count) == (vr.JobState.COMPLETED, "hello", 1)
    assert info.finished_at is not None and info.lease_owner
    assert state["ran"] == ["hello"]
    assert await events(queue, job_id) == ["enqueued", "claimed", "completed"]


async def test_pause_persists_carry_and_is_not_a_failure(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Steps(steps=4))
    await drain(queue, StepsJob, max_failures=1)  # pauses must never trip the backstop
    info = await queue.get(job_id)
    assert info is not None
    assert (info.state, info.run_count, info.failures) == (vr.JobState.COMPLETED, 4, 0)
    assert info.carry == {"n": 4, "seen": []}
    assert info.result == {"n": 4}
    journal = await queue.journal(job_id)
    paused = [e for e in journal if e.event == "paused"]
    assert [e.note for e in paused] == ["step 1", "step 2", "step 3"]
    assert [e.attachment for e in paused] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [e.run for e in paused] == [1, 2, 3]


class Quiet(vr.Task[Counter]):
    """Pauses once with an attachment, then completes with none."""

    KIND: ClassVar[str] = "quiet"


class QuietJob(Quiet, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Counter], state: Any) -> vr.Outcome:
        ctx.carry.n += 1
        if ctx.carry.n == 1:
            ctx.set_attachment({"first": True})
            return vr.Outcome.pause_in(0)
        return vr.Outcome.completed()


async def test_the_hash_keeps_the_latest_runs_attachment_the_journal_every_runs(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Quiet())
    await drain(queue, QuietJob)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED
    assert (info.attachment, info.result) == (None, None)  # run 2 attached nothing
    journal = await queue.journal(job_id)
    assert [(e.event, e.attachment) for e in journal if e.event in ("paused", "completed")] == [
        ("paused", {"first": True}),
        ("completed", None),
    ]


async def test_initial_carry(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Steps(steps=3), carry=Counter(n=2))
    await drain(queue, StepsJob)
    info = await queue.get(job_id)
    assert info is not None and info.run_count == 1 and info.carry == {"n": 3, "seen": []}


async def test_pause_with_delay_sets_eligibility(queue: vr.Queue) -> None:
    class Later(vr.Task):
        KIND: ClassVar[str] = "later"

    class LaterJob(Later, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            return vr.Outcome.pause_in(3600) if ctx.run_count == 1 else vr.Outcome.completed()

    job_id = await queue.enqueue(Later())
    worker = make_worker(queue, LaterJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (
                (info := await queue.get(job_id)) is None
                or info.run_count < 1
                or info.state != vr.JobState.PENDING
            ):
                await anyio.sleep(0.02)
        worker.shutdown()
    assert info.eligible_at is not None and info.updated_at is not None
    assert (info.eligible_at - info.updated_at).total_seconds() == pytest.approx(3600, abs=1)
    journal = await queue.journal(job_id)
    assert journal[-1].event == "paused" and journal[-1].details["delay_ms"] == "3600000"


async def test_retry_records_failures_with_backoff_then_completes(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Flaky(fail_times=2))
    await drain(queue, FlakyJob, jitter=0.0)
    info = await queue.get(job_id)
    assert info is not None
    assert (info.state, info.failures, info.run_count) == (vr.JobState.COMPLETED, 2, 3)
    assert info.carry == {"n": 3, "seen": []}  # carry persisted across failures
    failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
    assert [e.note for e in failed] == ["boom 1", "boom 2"]
    assert [e.attachment for e in failed] == [{"attempt": 1}, {"attempt": 2}]
    # Fibonacci: the first two retries are immediate (multipliers 0, 0)
    assert [e.details["delay_ms"] for e in failed] == ["0", "0"]
    assert [e.details["failures"] for e in failed] == ["1", "2"]


async def test_retry_delay_matches_backoff_delay(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Flaky(fail_times=100))

    class SlowBackoff(Flaky):
        KIND: ClassVar[str] = "flaky"

    # run the job by hand through four failures with the worker's retry path
    worker = make_worker(
        queue, FlakyJob, jitter=0.25, max_failures=None, backoff=vr.Backoff.fibonacci(base=0.001, cap=1.0)
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while (info := await queue.get(job_id)) is None or info.failures < 6:
                await anyio.sleep(0.02)
        worker.shutdown()
    failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
    for e in failed[:6]:
        n = int(e.details["failures"])
        # Flaky declares its own backoff (base 0.01, cap 0.05): the task's policy wins
        want = vr.backoff_delay(job_id, n, base=0.01, cap=0.05, jitter=0.25)
        assert int(e.details["delay_ms"]) == round(want * 1000)


async def test_permanent_error_goes_straight_to_dead(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Doomed())
    await drain(queue, DoomedJob)
    info = await queue.get(job_id)
    assert info is not None
    assert (info.state, info.note, info.failures, info.run_count) == (vr.JobState.DEAD, "resource gone", 1, 1)
    assert info.attachment == {"status": 410}  # an attachment survives a raised error
    journal = await queue.journal(job_id)
    assert journal[-1].event == "dead" and journal[-1].details["reason"] == "permanent"
    assert (await queue.counts())["dead"] == 1


async def test_backstop_counts_failures_and_kills(queue: vr.Queue) -> None:
    a = await queue.enqueue(Flaky(fail_times=100))
    b = await queue.enqueue(Flaky(fail_times=100), max_failures=2)  # per-job override wins
    await drain(queue, FlakyJob, max_failures=4)
    ia, ib = await queue.get(a), await queue.get(b)
    assert ia is not None and ib is not None
    assert (ia.state, ia.failures) == (vr.JobState.DEAD, 4)
    assert (ib.state, ib.failures) == (vr.JobState.DEAD, 2)
    last = (await queue.journal(a))[-1]
    assert last.event == "dead" and last.details["reason"] == "max_failures"
    assert "4 failed runs" in (last.note or "")


async def test_backstop_none_disables(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Flaky(fail_times=6))
    await drain(queue, FlakyJob, max_failures=None)
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.COMPLETED, 6)


async def test_history_lets_a_task_decide_its_fate(queue: vr.Queue) -> None:
    class GiveUp(vr.Task):
        KIND: ClassVar[str] = "give_up"

    class GiveUpJob(GiveUp, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            failures = [e for e in ctx.history if e.event == "failed"]
            if len(failures) >= 2:
                raise vr.TaskError.permanent(f"gave up after {len(failures)} failures, run {ctx.run_count}")
            raise RuntimeError("try again")

    job_id = await queue.enqueue(GiveUp())
    await drain(queue, GiveUpJob)
    info = await queue.get(job_id)
    assert info is not None and info.note == "gave up after 2 failures, run 3"


async def test_handler_returning_garbage_dies_at_its_first_run(queue: vr.Queue) -> None:
    class Bad(vr.Task):
        KIND: ClassVar[str] = "bad_return"

    class BadJob(Bad, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            return "done"  # type: ignore[return-value]

    job_id = await queue.enqueue(Bad())
    await drain(queue, BadJob)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD and info.run_count == 1
    assert "must return a vr.Outcome" in ((await queue.journal(job_id))[-1].note or "")


async def test_unstorable_attachment_fails_fast(queue: vr.Queue) -> None:
    class Att(vr.Task):
        KIND: ClassVar[str] = "att"

    class AttJob(Att, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            ctx.set_attachment(object())
            return vr.Outcome.completed()

    job_id = await queue.enqueue(Att(), max_failures=1)
    await drain(queue, AttJob)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD
    assert "cannot encode" in ((await queue.journal(job_id))[-2].note or "")


# -- ordering --------------------------------------------------------------------------


async def test_priority_then_eligibility_then_creation_order(queue: vr.Queue) -> None:
    ran: list[str] = []

    class Mark(vr.Task):
        KIND: ClassVar[str] = "mark"
        label: str

    class MarkJob(Mark, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            ran.append(self.label)
            return vr.Outcome.completed()

    await queue.enqueue(Mark(label="low"), priority=vr.Priority.LOW)
    await queue.enqueue_many([Mark(label=f"normal-{i}") for i in range(3)])
    await queue.enqueue(Mark(label="critical"), priority=vr.Priority.CRITICAL)
    await queue.enqueue(Mark(label="high"), priority="high")
    await drain(queue, MarkJob, concurrency=1)
    assert ran == ["critical", "high", "normal-0", "normal-1", "normal-2", "low"]


async def test_priority_labels_are_the_lowercase_names(queue: vr.Queue) -> None:
    assert [p.label for p in sorted(vr.Priority)] == ["low", "normal", "high", "critical"]
    for p in vr.Priority:
        assert p.label == p.name.lower() and vr.Priority.parse(p.label) is p
        assert queue.keys.pending(p).endswith(f":pending:{p.name.lower()}")


async def test_delayed_job_waits_for_its_time(queue: vr.Queue) -> None:
    later = await queue.enqueue(Echo(text="later"), delay=0.6)
    now = await queue.enqueue(Echo(text="now"))
    state: dict[str, Any] = {}
    await drain(queue, EchoJob, state=state, concurrency=4)
    assert state["ran"] == ["now", "later"]
    a, b = await queue.get(now), await queue.get(later)
    assert a is not None and b is not None and b.finished_at is not None and b.eligible_at is not None
    assert b.finished_at >= b.eligible_at
    assert (b.eligible_at - b.created_at).total_seconds() == pytest.approx(0.6, abs=0.05)


# -- bad jobs in the queue --------------------------------------------------------------


async def test_unknown_kind_goes_to_dead_and_the_worker_goes_on(queue: vr.Queue) -> None:
    class Stranger(vr.Task):
        KIND: ClassVar[str] = "stranger"

    stranger = await queue.enqueue(Stranger())
    echo = await queue.enqueue(Echo(text="fine"))
    await drain(queue, EchoJob)
    s, e = await queue.get(stranger), await queue.get(echo)
    assert s is not None and e is not None
    assert s.state == vr.JobState.DEAD and "no handler for kind 'stranger'" in (s.note or "")
    assert (await queue.journal(stranger))[-1].details["reason"] == "unknown_kind"
    assert e.state == vr.JobState.COMPLETED


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("payload", b"\xc1\xff garbage"),
        ("payload", b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94."),
        ("payload", b"\x81\xa5steps\xa3abc"),  # valid msgpack, fails validation (steps: int)
        ("carry", b"\xc1"),
    ],
)
async def test_undecodable_bytes_go_to_dead(
    client: vr.Client, queue: vr.Queue, field: str, raw: bytes
) -> None:
    job_id = await queue.enqueue(Steps(steps=1))
    ok = await queue.enqueue(Echo(text="fine"))
    await client.redis.hset(queue.keys.job(job_id), field, raw)
    await drain(queue, StepsJob, EchoJob)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD
    assert (await queue.journal(job_id))[-1].details["reason"] == "invalid_payload"
    assert "does not" in (info.note or "")
    assert (await queue.get(ok)).state == vr.JobState.COMPLETED  # type: ignore[union-attr]


# -- registration ------------------------------------------------------------------------


async def test_register_rejects_what_it_cannot_run(queue: vr.Queue) -> None:
    worker = vr.Worker(queue, handle_signals=False)
    with pytest.raises(vr.TaskDefinitionError, match=r"vr\.Handler"):
        worker.register(Echo)  # a Task without a handler
    worker.register(EchoJob)

    class Impostor(vr.Task, vr.Handler[None]):
        KIND: ClassVar[str] = "echo"

    with pytest.raises(vr.TaskDefinitionError, match="already registered"):
        worker.register(Impostor)

    class BadCarry(BaseModel):
        required: int

    class NeedsCarry(vr.Task[BadCarry], vr.Handler[None]):
        KIND: ClassVar[str] = "needs"

    worker.register(NeedsCarry)  # the class is fine; its default carry is not
    with pytest.raises(vr.TaskDefinitionError, match="default"):
        NeedsCarry.default_carry()


async def test_worker_without_handlers_refuses_to_run(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="no handlers"):
        await vr.Worker(queue, handle_signals=False).run()
