"""The journal holds what the job's hash cannot say (lua/include/journal.lua):
enqueue writes none, a claim writes none, the first entry is written by the
first event the hash cannot imply, and readers put back what the hash says
(the `enqueued` entry, each run's `claimed` entry: records.py journal_from)."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, make_worker, run_until_event
from tests.tasks import Echo
from venturi_redis._model.records import JournalEntry, LazyJournal, enqueued_entry
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


async def claim(queue: vr.Queue, count: int = 10) -> list[tuple[str, str, list[JournalEntry]]]:
    """Run claim.lua; returns (id, token, history) per claimed job, as a worker reads them."""
    reply = calls.claim_reply(await claim_raw(queue, count), "tok")
    return [
        (job[0], job[6], list(LazyJournal(job[11], (job[13], job[8].label, job[14])))) for job in reply.jobs()
    ]


async def stream(queue: vr.Queue, job_id: str) -> list[JournalEntry]:
    raw = await queue.client.redis.xrange(queue.keys.journal(job_id))
    return [JournalEntry.from_stream(i, f) for i, f in raw]


async def test_a_pending_job_has_no_stream_but_reads_its_enqueued_entry(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), priority=vr.Priority.HIGH, delay=60)
    assert await queue.client.redis.exists(queue.keys.journal(job_id)) == 0
    info = await queue.get(job_id)
    assert info is not None and info.eligible_at is not None
    (entry,) = await queue.journal(job_id)
    created_ms = int(info.created_at.timestamp() * 1000)
    eligible_ms = int(info.eligible_at.timestamp() * 1000)
    assert entry.id == f"{created_ms}-0"
    assert (entry.event, entry.run, entry.at, entry.note) == ("enqueued", 0, info.created_at, None)
    assert entry.details == {"priority": "high", "eligible_at": str(eligible_ms)}
    assert eligible_ms == created_ms + 60_000


async def test_a_claim_writes_no_journal_and_the_reader_shows_the_run(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), priority="low")
    synthesized = await queue.journal(job_id)
    ((claimed_id, _, history),) = await claim(queue)
    assert claimed_id == job_id
    # The history handed to the run is the journal before it, exactly as a reader shows it.
    assert history == synthesized
    assert await queue.client.redis.exists(queue.keys.journal(job_id)) == 0
    info = await queue.get(job_id)
    assert info is not None and info.state is vr.JobState.RUNNING
    enqueued, claimed = await queue.journal(job_id)
    assert enqueued == synthesized[0]
    assert (claimed.event, claimed.run, claimed.details) == ("claimed", 1, {"worker": "w1"})
    assert claimed.at == info.updated_at and claimed.id > enqueued.id


async def test_a_first_run_completion_is_the_journals_one_entry(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), priority="high")
    synthesized = await queue.journal(job_id)
    ((_, token, _),) = await claim(queue)
    c = queue.client
    done = calls.complete(queue.keys, c._now_arg(), [calls.completion(job_id, token, "ok", b"", b"", b"")])
    assert calls.completed(await c.sender.call(done)) == [calls.APPLIED]
    (only,) = await stream(queue, job_id)
    assert (only.event, only.run, only.note) == ("completed", 1, "ok")
    assert only.details.keys() == {"worker", "claimed_at"}
    journal = await queue.journal(job_id)
    assert [e.event for e in journal] == ["enqueued", "claimed", "completed"]
    assert journal[0] == synthesized[0]  # the hash still says what enqueue wrote
    assert journal[1].at == JournalEntry.from_stream("0-1", {b"at": only.details["claimed_at"].encode()}).at
    assert journal[2] == only


async def test_a_later_claim_sends_the_journal_with_its_runs(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), priority="high")
    ((_, token, first),) = await claim(queue)
    assert [e.event for e in first] == ["enqueued"]
    c, k = queue.client, queue.keys
    call = calls.release(
        k, c._now_arg(), job_id=job_id, token=token, priority=vr.Priority.HIGH, carry=b"", note="bye"
    )
    assert list(await c.sender.call(call)) == [1]
    # The release wrote the `enqueued` entry first (a cold path), then its own.
    assert [e.event for e in await stream(queue, job_id)] == ["enqueued", "released"]
    ((_, _, later),) = await claim(queue)
    assert [(e.event, e.run) for e in later] == [("enqueued", 0), ("claimed", 1), ("released", 1)]
    assert [(e.event, e.run) for e in await queue.journal(job_id)] == [
        ("enqueued", 0),
        ("claimed", 1),
        ("released", 1),
        ("claimed", 2),
    ]


@pytest.mark.parametrize("offset_ms", [10 * 365 * 86_400_000, -10 * 365 * 86_400_000])
async def test_a_caller_clock_far_from_redis_time_keeps_ids_increasing(url: str, offset_ms: int) -> None:
    import time

    clock = Clock(int(time.time() * 1000) + offset_ms)
    async with vr.Client.from_url(url, clock=clock) as c:
        q = c.queue("clock-" + str(abs(offset_ms) % 997) + ("f" if offset_ms > 0 else "p"))
        job_id = await q.enqueue(Echo(text="x"))
        clock.ms += 5
        ((_, token, history),) = await claim(q)
        assert [e.event for e in history] == ["enqueued"]
        assert history[0].id == f"{clock.ms - 5}-0"
        clock.ms += 5
        c2, k = q.client, q.keys
        call = calls.release(
            k, c2._now_arg(), job_id=job_id, token=token, priority=vr.Priority.NORMAL, carry=b"", note="bye"
        )
        res = await c2.sender.call(call)
        assert list(res) == [1]
        raw = await stream(q, job_id)
        assert [e.event for e in raw] == ["enqueued", "released"]
        ids = [tuple(int(p) for p in e.id.split("-")) for e in raw]
        assert ids == sorted(ids) and len(set(ids)) == 2
        journal = await q.journal(job_id)
        assert [e.event for e in journal] == ["enqueued", "claimed", "released"]
        # the `at` fields follow the caller's clock, whatever the stream ids say
        assert [int(e.at.timestamp() * 1000) for e in journal] == [clock.ms - 10, clock.ms - 5, clock.ms]


async def test_a_refusal_on_a_never_claimed_job_keeps_enqueued_first(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"))
    c, k = queue.client, queue.keys
    call = calls.release(
        k, c._now_arg(), job_id=job_id, token="stale", priority=vr.Priority.NORMAL, carry=b"", note="bye"
    )
    res = await c.sender.call(call)
    assert res[0] == 0
    assert [e.event for e in await stream(queue, job_id)] == ["enqueued", "refused"]


async def test_cancel_of_a_never_claimed_job(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"), delay=30)
    synthesized = await queue.journal(job_id)
    assert await queue.cancel(job_id) == "cancelled"
    raw = await stream(queue, job_id)
    assert [e.event for e in raw] == ["enqueued", "cancelled"]
    # eligible_at is dropped from the hash by the cancel, but the entry kept it.
    assert raw[0] == synthesized[0]
    assert raw[0].details["eligible_at"] != ""
    assert raw[1].details == {"from": "pending"}


class Tagged(vr.Task):
    """Merges by replacing; records the journal `merge` was shown."""

    KIND: ClassVar[str] = "tagged_journal"
    key: str
    urgent: bool = False
    seen: ClassVar[list[list[JournalEntry]]] = []

    def dedup_key(self) -> str | None:
        return self.key

    def priority(self) -> vr.Priority:
        return vr.Priority.CRITICAL if self.urgent else vr.Priority.LOW

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        Tagged.seen.append(list(existing.journal))
        return vr.Merge.replace()


async def test_a_merge_that_moves_priority_journals_the_original_priority_first(queue: vr.Queue) -> None:
    Tagged.seen.clear()
    a = await queue.enqueue(Tagged(key="k"))
    synthesized = await queue.journal(a)
    assert synthesized[0].details["priority"] == "low"
    assert await queue.enqueue(Tagged(key="k", urgent=True)) == a
    # Task.merge saw the `enqueued` entry though no stream existed yet, and was
    # asked once (even when merge.lua first met NOSCRIPT on a fresh server).
    assert Tagged.seen == [synthesized]
    Tagged.seen.clear()
    raw = await stream(queue, a)
    assert [e.event for e in raw] == ["enqueued", "merged"]
    assert raw[0] == synthesized[0]
    assert raw[0].details["priority"] == "low"
    assert raw[1].details.keys() == {"decision", "by", "priority"}
    assert (raw[1].details["decision"], raw[1].details["priority"]) == ("replace", "critical")
    info = await queue.get(a)
    assert info is not None and info.priority == vr.Priority.CRITICAL
    # A second merge sees the stream itself.
    assert await queue.enqueue(Tagged(key="k")) == a
    assert [[e.event for e in s] for s in Tagged.seen] == [["enqueued", "merged"]]


async def test_the_first_run_history_contains_enqueued(queue: vr.Queue) -> None:
    seen: list[list[str]] = []

    class Hist(vr.Task):
        KIND: ClassVar[str] = "hist_journal"

    class HistJob(Hist, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            seen.append([e.event for e in ctx.history])
            return vr.Outcome.completed()

    job_id = await queue.enqueue(Hist())
    worker = make_worker(queue, HistJob)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert seen == [["enqueued"]]
    assert [e.event for e in await queue.journal(job_id)] == ["enqueued", "claimed", "completed"]


def test_enqueued_entry_matches_the_lua_id_rule() -> None:
    assert enqueued_entry(b"1700000000000", b"normal", b"1700000000005")[0] == "1700000000000-0"
    assert enqueued_entry(b"0", b"normal", b"0")[0] == "0-1"


class Parking(vr.Task):
    """Ends its first run the way ``how`` says; runs again complete."""

    KIND: ClassVar[str] = "parking"
    how: str
    key: str | None = None

    def dedup_key(self) -> str | None:
        return self.key

    def backoff(self) -> vr.Backoff:
        return vr.Backoff.fibonacci(base=60, cap=60)  # the retried job waits, pending


class ParkingJob(Parking, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.how == "pause":
            return vr.Outcome.pause_in(60)
        if self.how == "suspend":
            return vr.Outcome.suspend(note="waiting for input")
        if self.how == "retry":
            raise RuntimeError("try again later")
        if self.how == "dead":
            raise vr.TaskError.permanent("gone")
        return vr.Outcome.completed()


async def complete_raw(queue: vr.Queue, job_id: str, token: str) -> None:
    """Run complete.lua for one job (no worker), as its committer would."""
    c = queue.client
    call = calls.complete(queue.keys, c._now_arg(), [calls.completion(job_id, token, "", b"", b"", b"")])
    await c.sender.call(call)


def error_bytes(entries: list[JournalEntry]) -> int:
    """What a failed run's exception type and traceback tail add to a journal: their
    fields and values, with a listpack's per-element overhead (header, back-length)."""
    return sum(
        len(name) + len(value) + 16
        for e in entries
        for name, value in e.details.items()
        if name in ("error_type", "traceback")
    )


# What each way of leaving the worker journals (as a reader shows it), and
# what its stream holds (the hash says the rest: journal.lua). A retry's first
# two waits are 0 (fib(n) - 1), so the job runs three times before it waits,
# pending.
PARKED = {
    "complete": (["claimed", "completed"], ["completed"]),
    "pause": (["claimed", "paused"], ["enqueued", "paused"]),
    "suspend": (["claimed", "suspended"], ["enqueued", "suspended"]),
    "retry": (
        ["claimed", "failed", "claimed", "failed", "claimed", "failed"],
        ["enqueued", "failed", "failed", "failed"],
    ),
    "dead": (["claimed", "dead"], ["enqueued", "dead"]),
}


@pytest.mark.parametrize("how", sorted(PARKED))
async def test_a_job_leaving_its_worker_keeps_a_compact_journal(
    backend: str, queue: vr.Queue, how: str
) -> None:
    """A stream's first node is preallocated at 4 KB (Redis 6.2 and later); a job that
    leaves its worker gets its journal copied at its exact size, with the same
    entries and ids, and later entries still append after them."""
    job_id = await queue.enqueue(Parking(how=how))
    key = queue.keys.journal(job_id)
    r = queue.client.redis
    shown, held = PARKED[how]
    expected = ["enqueued", *shown]
    worker = make_worker(queue, ParkingJob)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while len(entries := await stream(queue, job_id)) < len(held):
                await anyio.sleep(0.02)
        worker.shutdown()
    assert [e.event for e in entries] == held
    assert [e.event for e in await queue.journal(job_id)] == expected
    info = await r.xinfo_stream(key)
    assert info["last-generated-id"].decode() == entries[-1].id
    # The stream's own counter, copied with it (XINFO reports it since Redis 7.0).
    if "entries-added" in info:
        assert info["entries-added"] == len(held)
    if backend != "memory":  # fakeredis has no MEMORY USAGE and no preallocation
        # ~4,700 B before compacting
        assert await r.memory_usage(key, samples=0) < 1500 + error_bytes(entries)
    # The stream goes on after the copy: a stale worker's late outcome is
    # journaled after the last entry, with a greater id.
    await complete_raw(queue, job_id, "stale-token")
    after = await stream(queue, job_id)
    assert [e.event for e in after] == [*held, "refused"]
    assert after[:-1] == entries


async def test_compacting_keeps_a_journal_ttl(backend: str, queue: vr.Queue) -> None:
    """An operator's EXPIRE on a journal survives the copy (RENAME and COPY keep it)."""
    job_id = await queue.enqueue(Parking(how="complete"))
    ((claimed, token, _),) = await claim(queue)
    assert claimed == job_id
    c, k = queue.client, queue.keys
    call = calls.release(
        k, c._now_arg(), job_id=job_id, token=token, priority=vr.Priority.NORMAL, carry=b"", note=""
    )
    assert list(await c.sender.call(call)) == [1]
    key = queue.keys.journal(job_id)
    r = queue.client.redis
    await r.pexpire(key, 600_000)
    ((_, token, _),) = await claim(queue)
    call = calls.pause(
        k,
        c._now_arg(),
        job_id=job_id,
        token=token,
        priority=vr.Priority.NORMAL,
        delay_ms=60_000,
        note="",
        attachment=b"",
        carry=b"",
    )
    applied, _ = await c.sender.call(call)
    assert applied == 1
    assert [e.event for e in await stream(queue, job_id)] == ["enqueued", "released", "paused"]
    if backend != "memory":  # the copy is made on real servers only
        assert await r.memory_usage(key, samples=0) < 1500
    assert 590_000 < await r.pttl(key) <= 600_000


@pytest.mark.parametrize("left", ["entries", "a string"])
async def test_a_first_completion_starts_its_journal_alone_whatever_the_scratch_holds(
    backend: str, queue: vr.Queue, left: str
) -> None:
    """complete.lua writes a first run's entry to the queue's scratch key and
    copies it to the journal: entries left there by hand never reach a job's
    journal, a scratch of the wrong type only takes the longer way, and the
    scratch is gone after the call either way."""
    job_id = await queue.enqueue(Echo(text="x"))
    ((claimed, token, _),) = await claim(queue)
    assert claimed == job_id
    r = queue.client.redis
    scratch = queue.keys.prefix + "journal-compact"
    if left == "entries":
        await r.xadd(scratch, {"event": "forged"})
    else:
        await r.set(scratch, "junk")
    await complete_raw(queue, job_id, token)
    assert [e.event for e in await stream(queue, job_id)] == ["completed"]
    assert (await queue.get(job_id)).state is vr.JobState.COMPLETED
    if backend != "memory":  # fakeredis: no preallocation, so no copy and no scratch
        assert await r.exists(scratch) == 0
        assert await r.memory_usage(queue.keys.journal(job_id), samples=0) < 1500


async def test_a_first_completion_appends_to_a_journal_that_exists(backend: str, queue: vr.Queue) -> None:
    """A journal started before the run ended (here a stale worker's refused
    completion) gets the entry after its own, and is compacted all the same."""
    job_id = await queue.enqueue(Echo(text="x"))
    ((_, token, _),) = await claim(queue)
    await complete_raw(queue, job_id, "stale-token")
    before = await stream(queue, job_id)
    assert [e.event for e in before][-1] == "refused"
    await complete_raw(queue, job_id, token)
    after = await stream(queue, job_id)
    assert after[:-1] == before
    assert after[-1].event == "completed"
    assert (await queue.get(job_id)).state is vr.JobState.COMPLETED
    if backend != "memory":
        assert await queue.client.redis.memory_usage(queue.keys.journal(job_id), samples=0) < 1500


async def test_a_first_completion_on_a_journal_of_the_wrong_type_writes_nothing(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"))
    ((_, token, _),) = await claim(queue)
    r = queue.client.redis
    await r.set(queue.keys.journal(job_id), "not a stream")
    before = await r.hgetall(queue.keys.job(job_id))
    await complete_raw(queue, job_id, token)
    assert await r.hgetall(queue.keys.job(job_id)) == before
    assert await r.get(queue.keys.journal(job_id)) == b"not a stream"
    assert await r.exists(queue.keys.prefix + "journal-compact") == 0


@pytest.mark.parametrize("op", ["cancel", "merge", "reclaim", "resume", "retry"])
async def test_an_operator_transition_keeps_a_compact_journal(backend: str, queue: vr.Queue, op: str) -> None:
    """The transitions a worker does not make compact the journal too."""
    r, k = queue.client.redis, queue.keys
    if op == "cancel":
        job_id = await queue.enqueue(Parking(how="complete"))
        assert await queue.cancel(job_id) == "cancelled"
        last = "cancelled"
    elif op == "merge":
        job_id = await queue.enqueue(Parking(how="complete", key="k"))
        assert await queue.enqueue(Parking(how="complete", key="k")) == job_id
        last = "merged"
    elif op == "reclaim":
        job_id = await queue.enqueue(Parking(how="complete"))
        await claim_raw(queue, 1, lease_ms=1)
        await anyio.sleep(0.05)
        call = calls.reclaim(k, queue.client._now_arg(), batch=10, max_failures="25")
        await queue.client.sender.call(call)
        last = "lease_expired"
    elif op == "resume":
        job_id = await queue.enqueue(Parking(how="suspend"))
        await run_until_event(queue, job_id, "suspended", ParkingJob)
        assert await queue.resume(job_id, 1) == 1
        last = "resumed"
    else:
        job_id = await queue.enqueue(Parking(how="dead"))
        await run_until_event(queue, job_id, "dead", ParkingJob)
        assert await queue.retry(job_id)
        last = "retried"
    entries = await stream(queue, job_id)
    assert [e.event for e in entries][-1] == last
    if backend != "memory":
        assert await r.memory_usage(k.journal(job_id), samples=0) < 1500 + error_bytes(entries)
