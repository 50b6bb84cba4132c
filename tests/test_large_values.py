"""Big values and floods, from producers and from inside handlers (docs/guarantees.md, "Sizes and limits").

Every value a job stores is capped where it is made, every call of many jobs
is bounded, and what is over a bound is an error raised where someone can act
on it: the producer's call (nothing sent), or the run, which fails with a note
naming the cap (never a worker crash, a stuck job, a batch of other jobs
failed with it, or a Redis blocked for seconds). The caps are lowered here so
a few hundred KB show what megabytes would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from venturi_redis._model.sizes import NOTE_CHARS, PROGRESS_BYTES
from venturi_redis._store.store import KEEP_ALL, QueueStore
from venturi_redis._worker import dependencies, failure_log, outbox
from venturi_redis._worker.execute import TRACEBACK_TAIL
from venturi_redis._worker.failure_log import FailureLog

pytestmark = pytest.mark.anyio

KB = 1024


@pytest.fixture(autouse=True)
def fresh_failure_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # The failed-run WARNING is rate-limited per process: other tests' runs must not use up these lines.
    monkeypatch.setattr(failure_log, "FAILURES", FailureLog())


class Big(vr.Task):
    KIND: ClassVar[str] = "large.big"
    what: str
    size: int = 0


class BigJob(Big, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.what == "result":
            return vr.Outcome.completed(result="r" * self.size)
        if self.what == "rows":  # a result model with a huge list
            return vr.Outcome.completed(result=Rows(rows=list(range(self.size))))
        if self.what == "output":
            return vr.Outcome.suspend(output="o" * self.size)
        if self.what == "note":
            return vr.Outcome.completed_with("n" * self.size)
        if self.what == "raise":
            raise ValueError("e" * self.size)
        return vr.Outcome.completed()


class Rows(BaseModel):
    rows: list[int]


async def _hash(queue: vr.Queue, job_id: str) -> dict[bytes, bytes]:
    raw: dict[bytes, bytes] = await queue.client.redis.hgetall(queue.keys.job(job_id))
    return raw


# -- what a run writes ------------------------------------------------------------------------


async def test_a_result_or_output_over_its_cap_fails_the_run_with_a_note_naming_it(
    url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with vr.Client.from_url(url, max_result_bytes=64 * KB) as client:
        queue = client.queue(queue_name)
        fits = await queue.enqueue(Big(what="result", size=60 * KB))
        over = await queue.enqueue(Big(what="result", size=65 * KB))
        rows = await queue.enqueue(Big(what="rows", size=100_000))
        output = await queue.enqueue(Big(what="output", size=65 * KB))
        others = [await queue.enqueue(Big(what="none")) for _ in range(10)]
        with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
            await drain(queue, BigJob, max_failures=1, concurrency=20)

        done = await queue.get(fits)
        assert done is not None and done.state == vr.JobState.COMPLETED and done.result == "r" * 60 * KB
        for job_id, what in ((over, "result"), (rows, "result"), (output, "output")):
            info = await queue.get(job_id)
            assert info is not None and info.state == vr.JobState.DEAD, job_id
            assert info.note is not None and info.note.startswith(f"{what} cannot be stored: ")
            assert "over the cap of 65,536 (Client(max_result_bytes=...))" in info.note
            raw = await _hash(queue, job_id)
            assert b"result" not in raw and b"output" not in raw  # nothing of it written
            (failed,) = [e for e in await queue.journal(job_id) if e.event == "failed"]
            assert failed.details["error_type"] == "venturi_redis.PayloadTooLarge"
        # The rows model: its size, and the type that was returned, named.
        info = await queue.get(rows)
        assert info is not None and "the Rows returned is " in (info.note or "")
        # The other jobs of the same batches ran once, unharmed.
        for job_id in others:
            info = await queue.get(job_id)
            assert info is not None and info.state == vr.JobState.COMPLETED and info.run_count == 1
        # The operator sees it in the log, not only in Redis.
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job {over} ")]
        assert any("failed: venturi_redis.PayloadTooLarge: result cannot be stored" in m for m in said)


class Grow(BaseModel):
    items: list[str] = []


class Growing(vr.Task[Grow]):
    KIND: ClassVar[str] = "large.growing"
    mode: str


class GrowingJob(Growing, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Grow], state: Any) -> vr.Outcome:
        if ctx.run_count == 1:
            ctx.carry.items = ["fits"]
            return vr.Outcome.pause_in(0)
        if self.mode == "carry":
            ctx.carry.items = ["x" * 1000] * 20  # ~20 KB: over the 10 KB cap
            return vr.Outcome.suspend(output="waiting")
        if self.mode == "attachment-set":
            ctx.set_attachment({"log": "a" * 20 * KB})  # raises at once: the run fails here
            return vr.Outcome.completed()
        # Under the cap when set, over it when the run ends: only the end can tell.
        evidence: list[str] = []
        ctx.set_attachment(evidence)
        evidence.extend(["a" * 1000] * 20)
        return vr.Outcome.completed()


async def test_a_carry_or_attachment_over_the_cap_is_not_saved_and_fails_the_run(
    url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with vr.Client.from_url(url, max_payload_bytes=10 * KB) as client:
        queue = client.queue(queue_name)
        carry = await queue.enqueue(Growing(mode="carry"))
        set_big = await queue.enqueue(Growing(mode="attachment-set"))
        grew = await queue.enqueue(Growing(mode="attachment-grew"))
        with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
            await drain(queue, GrowingJob, max_failures=1)
        # One WARNING per failed run (its failure and its death), as for any failure.
        for job_id in (carry, set_big, grew):
            said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job {job_id} ")]
            assert len(said) == 2 and "PayloadTooLarge" in said[0] and " is dead " in said[1], said

        info = await queue.get(carry)
        assert info is not None and info.state == vr.JobState.DEAD  # not suspended with a lost carry
        assert info.note == (
            "the run's state was not saved: its carry is 20,"
            + info.note.split("its carry is 20,", 1)[1]  # its exact size, whatever msgpack takes
        )
        assert "over the cap of 10,240 (Client(max_payload_bytes=...))" in info.note
        assert info.carry == {"items": ["fits"]}  # the last carry that fit: what a retry starts from
        assert info.output is None

        info = await queue.get(set_big)
        assert info is not None and info.state == vr.JobState.DEAD
        assert info.note is not None and info.note.startswith("the attachment is ")
        assert "over the cap of 10,240 (Client(max_payload_bytes=...))" in info.note
        (failed,) = [e for e in await queue.journal(set_big) if e.event == "failed"]
        assert failed.details["error_type"] == "venturi_redis.PayloadTooLarge"
        assert "ctx.set_attachment(" in failed.details["traceback"]  # where the mistake was made

        info = await queue.get(grew)
        assert info is not None and info.state == vr.JobState.DEAD
        assert info.note is not None and "its attachment is " in info.note
        assert b"attachment" not in await _hash(queue, grew)
        assert all(e.attachment is None for e in await queue.journal(grew))


async def test_a_huge_exception_or_note_is_a_bounded_note_log_line_and_traceback(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    size = 1 << 20
    raised = await queue.enqueue(Big(what="raise", size=size))
    noted = await queue.enqueue(Big(what="note", size=size))
    with caplog.at_level(logging.WARNING, logger="venturi_redis.worker"):
        await drain(queue, BigJob, max_failures=1)

    cut = f"... ({size - NOTE_CHARS:,} more characters not kept)"
    for job_id, letter in ((raised, "e"), (noted, "n")):
        info = await queue.get(job_id)
        assert info is not None and info.note == letter * NOTE_CHARS + cut
    journal = await queue.journal(raised)
    (failed,) = [e for e in journal if e.event == "failed"]
    assert failed.note == "e" * NOTE_CHARS + cut
    tb = failed.details["traceback"]
    # The frames that raised it are kept; the message's line is cut in its middle.
    assert len(tb) <= TRACEBACK_TAIL + 4 and 'raise ValueError("e" * self.size)' in tb
    assert tb.endswith("e" * 100) and "characters not kept" in tb
    # The WARNING lines (the failed run, the death) stay readable.
    lines = [r.getMessage() for r in caplog.records if raised in r.getMessage()]
    assert len(lines) == 2 and all(len(line) < NOTE_CHARS + 300 for line in lines)
    # So does the queue's event stream (a dashboard's feed): every note in it is bounded.
    entries = await queue.client.redis.xrange(queue.keys.events)
    notes = [fields[b"note"] for _, fields in entries if b"note" in fields]
    assert notes and max(len(n) for n in notes) < NOTE_CHARS + 100


async def test_one_value_past_what_redis_takes_costs_its_batch_nothing() -> None:
    # Redis refuses an argument over proto-max-bulk-len (512 MB by default; 16 MB here,
    # over the default result cap of 8 MiB) with a protocol error and closes the
    # connection: before the caps, a result past it failed every completion pipelined
    # with it (their leases expired, and all ran again, charged a failure), and its own
    # job died "lease expired".
    with RedisServer("--proto-max-bulk-len", "16mb") as server:
        async with vr.Client.from_url(server.url) as client:
            queue = client.queue("large")
            big = await queue.enqueue(Big(what="result", size=17 << 20))
            others = [await queue.enqueue(Big(what="result", size=10)) for _ in range(20)]
            await drain(queue, BigJob, max_failures=1, concurrency=30, lease=5)
            info = await queue.get(big)
            assert info is not None and info.state == vr.JobState.DEAD
            assert "Client(max_result_bytes=...)" in (info.note or "")
            for job_id in others:
                info = await queue.get(job_id)
                assert info is not None and info.state == vr.JobState.COMPLETED
                assert (info.run_count, info.failures) == (1, 0)


async def test_a_burst_of_large_results_goes_out_in_bounded_calls(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst of runs with large results is written by several complete calls,
    # each holding about _COMPLETE_BYTES of values (before: up to 200 jobs' in
    # one call, all copied by Redis while it served nobody else).
    monkeypatch.setattr(outbox, "_COMPLETE_BYTES", 64 * KB)
    calls: list[int] = []
    complete_op = QueueStore.complete_op

    def counted(self: QueueStore, completions: Any, retention: Any = KEEP_ALL) -> Any:
        calls.append(len(completions))
        return complete_op(self, completions, retention)

    monkeypatch.setattr(QueueStore, "complete_op", counted)
    Together.arrived = 0
    Together.all_in = anyio.Event()
    ids = [await queue.enqueue(Together(n=12)) for _ in range(12)]
    await drain(queue, TogetherJob, concurrency=12)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED and info.result == "t" * 30 * KB
    assert sum(calls) == 12 and max(calls) <= 3  # 3 x 30 KB reach the 64 KB budget


class Together(vr.Task):
    KIND: ClassVar[str] = "large.together"
    n: int
    arrived: ClassVar[int] = 0
    all_in: ClassVar[anyio.Event]


class TogetherJob(Together, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        Together.arrived += 1
        if Together.arrived == self.n:
            Together.all_in.set()
        await Together.all_in.wait()  # all finish at once: one burst of completions
        return vr.Outcome.completed(result="t" * 30 * KB)


class Part(vr.Task):
    KIND: ClassVar[str] = "large.part"
    n: int


class PartJob(Part, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=str(self.n) * 10 * KB)


class Gather(vr.Task):
    KIND: ClassVar[str] = "large.gather"


class GatherJob(Gather, vr.Handler[Any]):
    seen: ClassVar[dict[str, Any]] = {}

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        GatherJob.seen = await ctx.dependency_results()
        return vr.Outcome.completed()


async def test_a_fan_in_reads_its_dependency_results_by_bounded_pages(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A parent of many children with sizeable results holds them all in one hash
    # (2,000 results of 50 KB: 100 MB, which one HGETALL held Redis 267 ms to copy).
    monkeypatch.setattr(dependencies, "PAGE_BYTES", 64 * KB)
    pages: list[int] = []
    redis = queue.client.redis
    hscan = redis.hscan

    async def counted(key: str, cursor: int = 0, *args: Any, **kwargs: Any) -> Any:
        got = await hscan(key, cursor, *args, **kwargs)
        pages.append(sum(len(v) for v in got[1].values()))
        return got

    monkeypatch.setattr(redis, "hscan", counted)
    flow = await queue.enqueue_flow(Gather(), [Part(n=n % 10) for n in range(30)])
    await drain(queue, PartJob, GatherJob, concurrency=10)
    assert len(GatherJob.seen) == 30
    assert all(GatherJob.seen[c] == str(n % 10) * 10 * KB for n, c in enumerate(flow.children_ids))
    # 300 KB in pages that follow the sizes, never in one read. HSCAN's COUNT is a hint:
    # it returns whole buckets, and with 30 fields in a 32-slot table under a hash seed
    # each server draws at random, a page held 13 fields (133 KB) for COUNT 6 in one run.
    assert len(pages) >= 3 and max(pages) <= 4 * 64 * KB


# -- progress ----------------------------------------------------------------------------------


class Flood(vr.Task):
    KIND: ClassVar[str] = "large.flood"


class FloodJob(Flood, vr.Handler[Any]):
    seen: ClassVar[dict[str, Any]] = {}

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        ticks = 0

        async def beside() -> None:  # any other task of the worker's loop: a lease renewal, a job
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(beside())
        await ctx.report_progress(0)  # written at once; the next ones are held back
        start, i = ticks, 0
        # A loop of nothing but reports, until the loop let the task beside it run a few
        # times: before, it never did (a million reports held it for 5 s, no lease
        # renewed); bounded so the old code ends too.
        while ticks - start < 3 and i < 3_000_000:
            i += 1
            await ctx.report_progress(i)
        other.cancel()
        FloodJob.seen.update(reports=i, moved=ticks - start >= 3)
        try:
            await ctx.report_progress("p" * PROGRESS_BYTES)
        except vr.PayloadTooLarge as exc:
            FloodJob.seen["too_large"] = str(exc)
        return vr.Outcome.completed()


async def test_progress_in_a_tight_loop_is_coalesced_and_leaves_the_loop_free(queue: vr.Queue) -> None:
    FloodJob.seen = {}
    job_id = await queue.enqueue(Flood())
    await drain(queue, FloodJob)
    assert FloodJob.seen["moved"], "a loop of held-back reports never yielded to the event loop"
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED
    assert info.progress == FloodJob.seen["reports"]  # the last value landed
    entries = await queue.client.redis.xrange(queue.keys.events)
    writes = sum(1 for _, f in entries if f.get(b"event") == b"progress")
    assert 1 <= writes < FloodJob.seen["reports"]  # coalesced: not one write per report
    assert f"over the cap of {PROGRESS_BYTES:,}" in FloodJob.seen["too_large"]


# -- producers -----------------------------------------------------------------------------------


class Item(vr.Task):
    KIND: ClassVar[str] = "large.item"
    pad: str = ""


async def test_enqueue_many_over_the_batch_caps_raises_before_anything_is_sent(
    url: str, queue_name: str
) -> None:
    async with vr.Client.from_url(url, max_batch_jobs=5, max_batch_bytes=1000) as client:
        queue = client.queue(queue_name)
        # Counted before any task is encoded: not even the bad ones are looked at.
        with pytest.raises(vr.ConfigurationError, match=r"at most 5 tasks per call, got 6.*max_batch_jobs"):
            await queue.enqueue_many([object()] * 6)  # type: ignore[list-item]
        with pytest.raises(vr.PayloadTooLarge, match=r"over 1,000 bytes encoded.*max_batch_bytes"):
            await queue.enqueue_many([Item(pad="p" * 300) for _ in range(4)])
        assert (await queue.counts())["pending"] == 0  # nothing written
        assert len(await queue.enqueue_many([Item(pad="p" * 100) for _ in range(5)])) == 5
    async with vr.Client.from_url(url) as client:  # the default: 10,000
        with pytest.raises(vr.ConfigurationError, match="at most 10,000 tasks per call, got 10,001"):
            await client.queue(queue_name).enqueue_many([Item()] * 10_001)


async def test_sync_and_sharded_enqueue_many_take_the_same_caps(url: str, queue_name: str) -> None:
    with (
        vr.SyncClient(url, max_batch_jobs=3) as sc,
        pytest.raises(vr.ConfigurationError, match="at most 3 tasks per call"),
    ):
        sc.queue(queue_name).enqueue_many([Item()] * 4)
    async with vr.Client.from_url(url, max_batch_jobs=3) as client:
        sharded = vr.ShardedQueue(client, queue_name, partitions=2)
        with pytest.raises(vr.ConfigurationError, match="at most 3 tasks per call, got 4"):
            await sharded.enqueue_many([Item()] * 4)
        assert (await sharded.counts())["pending"] == 0


async def test_concurrent_single_enqueues_share_calls_of_bounded_bytes(
    url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst of a web server's enqueues shares enqueue.lua calls (up to 500 jobs
    # each): with large payloads, one call carries at most max_batch_bytes of them.
    calls: list[int] = []
    enqueue = QueueStore.enqueue

    async def counted(self: QueueStore, jobs: Any) -> Any:
        calls.append(len(jobs))
        return await enqueue(self, jobs)

    monkeypatch.setattr(QueueStore, "enqueue", counted)
    async with vr.Client.from_url(url, max_batch_bytes=1000) as client:
        queue = client.queue(queue_name)
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(queue.enqueue, Item(pad="p" * 300))
        assert (await queue.counts())["pending"] == 20
    # The first went alone (enqueue_one); the 19 that waited, 4 a call (4 x ~310 bytes reach 1,000).
    assert sum(calls) == 19 and max(calls) <= 4


async def test_enqueue_flow_over_its_caps_raises_before_anything_is_sent(url: str, queue_name: str) -> None:
    async with vr.Client.from_url(url, max_batch_bytes=1000) as client:
        queue = client.queue(queue_name)
        with pytest.raises(vr.PayloadTooLarge, match=r"enqueue_flow of 5 tasks.*max_batch_bytes"):
            await queue.enqueue_flow(Item(), [Item(pad="p" * 300) for _ in range(4)])
        # Counted before any child is encoded (a 10,001st child would be refused as late as that).
        with pytest.raises(
            vr.ConfigurationError, match=r"at most 10,000 children, got 10,001.*tree of flows"
        ):
            await queue.enqueue_flow(Item(), [object()] * 10_001)  # type: ignore[list-item]
        assert (await queue.counts())["waiting"] == 0 and (await queue.counts())["pending"] == 0


async def test_the_caps_take_whole_numbers_up_to_what_redis_takes() -> None:
    for option in ("max_payload_bytes", "max_result_bytes"):
        for bad in (0, -1, True, 1.5, "1", (500 << 20) + 1, 512 << 20):
            with pytest.raises(vr.ConfigurationError, match=option):
                vr.Client(None, **{option: bad})  # checked first: no connection is looked at
        async with vr.Client.from_url("memory://caps", **{option: 500 << 20}) as client:
            assert getattr(client, option) == 500 << 20
    for option in ("max_batch_jobs", "max_batch_bytes"):
        for bad in (0, True, 2.0):
            with pytest.raises(vr.ConfigurationError, match=option):
                vr.Client(None, **{option: bad})
    async with vr.Client.from_url("memory://caps") as client:
        assert (client.max_payload_bytes, client.max_result_bytes) == (1 << 20, 8 << 20)
        assert (client.max_batch_jobs, client.max_batch_bytes) == (10_000, 32 << 20)
