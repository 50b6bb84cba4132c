"""A job whose own data is corrupt is quarantined, never lost, and never stops the others.

Each test is a repro of issue 26 (items 2, 3 and 5): data corrupted by hand
(redis-cli), then the scripts run. The rule (docs/guarantees.md, "Corrupt
jobs are quarantined"): the corrupt job goes dead, reason ``corrupt``,
with a note naming what was wrong; the rest of the batch runs normally; a
queue-wide key of the wrong type stops the script before it moves any job
(``vr.CorruptQueueError`` from the script's coded error reply).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, drain, keys_matching, make_worker
from tests.tasks import Echo, EchoJob
from venturi_redis._model.errors import CorruptQueueError
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio


async def _claim(queue: vr.Queue, count: int) -> list[tuple[str, str]]:
    reply = calls.claim_reply(await claim_raw(queue, count), "tok")
    return [(job[0], job[6]) for job in reply.jobs()]


async def _dead_entry(queue: vr.Queue, job_id: str) -> Any:
    entries = [e for e in await queue.journal(job_id) if e.event == "dead"]
    assert len(entries) == 1, entries
    return entries[0]


async def _keys(queue: vr.Queue) -> set[str]:
    return {k.decode() for k in await keys_matching(queue.client.redis, f"{queue.keys.prefix}pending:*")}


async def _corrupt_one_of_six(queue: vr.Queue, field: str, value: str | None) -> tuple[str, list[str]]:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(6)])
    bad = ids[2]
    if value is None:
        await queue.client.redis.hdel(queue.keys.job(bad), *field.split(","))
    else:
        await queue.client.redis.hset(queue.keys.job(bad), field, value)
    return bad, [i for i in ids if i != bad]


@pytest.mark.parametrize(
    ("field", "value", "note"),
    [
        ("priority", "urgent", 'priority field "urgent" is not one of critical, high, normal, low'),
        ("kind", None, "kind field is missing"),
        ("state", None, "state field is missing"),
        ("kind,state,created_at", None, "state field is missing"),  # the payload is still there
        ("state", "running", "state is running while in a pending set"),
        ("created_at", "yesterday", "created_at field is not a time in ms"),
    ],
)
async def test_a_corrupt_pending_job_is_quarantined_and_the_others_run(
    queue: vr.Queue, field: str, value: str | None, note: str
) -> None:
    bad, good = await _corrupt_one_of_six(queue, field, value)
    state: dict[str, Any] = {}
    await drain(queue, EchoJob, state=state)
    assert sorted(state["ran"]) == sorted(str(i) for i in (0, 1, 3, 4, 5))
    for job_id in good:
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
    info = await queue.get(bad)
    assert info is not None and info.state == vr.JobState.DEAD and info.note == note
    entry = await _dead_entry(queue, bad)
    assert entry.details["reason"] == "corrupt" and entry.note == note
    counts = await queue.counts()
    assert counts["dead"] == 1 and counts["pending"] == 0 and counts["running"] == 0
    assert [j.id for j in await queue.list_jobs(state="dead")] == [bad]
    assert await _keys(queue) == set()  # no pending:urgent, nor any other


async def test_a_corrupt_priority_is_quarantined_by_the_reclaim(client: vr.Client, queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"))
    await _claim(queue, 1)
    await client.redis.hset(queue.keys.job(job_id), "priority", "urgent")
    await client.redis.hset(queue.keys.job(job_id), "lease_expires", "1")
    await client.redis.zadd(queue.keys.running, {job_id: 1})
    reclaim = calls.reclaim(queue.keys, client._now_arg(), batch=10, max_failures="none")
    got = calls.reclaimed(await client.sender.call(reclaim))
    assert got == calls.Reclaimed(0, 1, [job_id])
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD
    assert "urgent" in (info.note or "")
    assert await _keys(queue) == set()


@pytest.mark.parametrize("which", ["job", "journal"])
async def test_a_job_or_journal_key_of_the_wrong_type_is_quarantined(
    client: vr.Client, queue: vr.Queue, which: str
) -> None:
    """The claim reads a job's hash, and the journal of a job that has one (a
    re-run: its hash has run_count). A first claim reads no journal: a
    journal key damaged before it is met by the run's ending instead (the
    next test)."""
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(6)])
    bad = ids[3]
    key = queue.keys.job(bad) if which == "job" else queue.keys.journal(bad)
    if which == "journal":
        await client.redis.hset(queue.keys.job(bad), "run_count", "1")  # a re-run: its journal is read
    await client.redis.delete(key)
    await client.redis.set(key, "not a hash")
    claimed = await _claim(queue, 10)
    assert sorted(j for j, _ in claimed) == sorted(i for i in ids if i != bad)
    # Nobody charged: every claimed job is running once, none failed.
    assert sorted(m.decode() for m in await client.redis.zrange(queue.keys.running, 0, -1)) == sorted(
        j for j, _ in claimed
    )
    assert [m.decode() for m in await client.redis.zrange(queue.keys.dead, 0, -1)] == [bad]
    assert (await queue.counts())["pending"] == 0
    if which == "journal":
        info = await queue.get(bad)
        assert info is not None and info.state == vr.JobState.DEAD
        assert info.note == "journal key is not a stream"
    else:
        # The journal, read raw (the job's own reads fail on its hash, by design of the repro).
        entries = [f for _, f in await client.redis.xrange(queue.keys.journal(bad))]
        assert [(f[b"event"], f[b"note"], f[b"reason"]) for f in entries] == [
            (b"dead", b"job key is not a hash", b"corrupt")
        ]


@pytest.mark.parametrize("which", ["job", "journal"])
async def test_a_running_jobs_key_of_the_wrong_type_costs_its_batch_nothing(
    client: vr.Client, queue: vr.Queue, which: str
) -> None:
    """Damaged while it runs: its completion is refused with nothing written, the
    rest of the batch completes, and the reclaim quarantines it at its lease's end.
    Before, the XADD failed half way: jobs in the completed set still said running."""
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    claimed = await _claim(queue, 3)
    bad = ids[1]
    key = queue.keys.job(bad) if which == "job" else queue.keys.journal(bad)
    await client.redis.delete(key)
    await client.redis.set(key, "not a hash")
    done = calls.complete(
        queue.keys, client._now_arg(), [calls.completion(j, t, "", b"", b"", b"") for j, t in claimed]
    )
    why = "job key is not a hash" if which == "job" else "journal key is not a stream"
    got = calls.completed(await client.sender.call(done))
    replies = dict(zip([j for j, _ in claimed], got, strict=True))
    assert replies == {ids[0]: calls.APPLIED, bad: calls.Transition(False, why), ids[2]: calls.APPLIED}
    for job_id in (ids[0], ids[2]):
        info = await queue.get(job_id)
        assert info is not None and (info.state, info.failures) == (vr.JobState.COMPLETED, 0)
    assert [m.decode() for m in await client.redis.zrange(queue.keys.running, 0, -1)] == [bad]
    # Its lease runs out: the reclaim quarantines it, and nothing else.
    await client.redis.zadd(queue.keys.running, {bad: 1})
    reclaim = calls.reclaim(queue.keys, client._now_arg(), batch=10, max_failures="none")
    got = calls.reclaimed(await client.sender.call(reclaim))
    assert got == calls.Reclaimed(0, 1, [bad])
    assert [m.decode() for m in await client.redis.zrange(queue.keys.dead, 0, -1)] == [bad]
    if which == "journal":
        info = await queue.get(bad)
        assert info is not None and (info.state, info.note) == (vr.JobState.DEAD, why)
    else:
        entries = [f for _, f in await client.redis.xrange(queue.keys.journal(bad))]
        assert (entries[-1][b"event"], entries[-1][b"note"], entries[-1][b"reason"]) == (
            b"dead",
            why.encode(),
            b"corrupt",
        )
    counts = await queue.counts()
    assert (counts["completed"], counts["dead"], counts["running"]) == (2, 1, 0)


async def test_a_wrong_type_pending_set_leaves_no_job_half_moved(client: vr.Client, queue: vr.Queue) -> None:
    high = await queue.enqueue(Echo(text="c"), priority=vr.Priority.CRITICAL)
    normal = await queue.enqueue(Echo(text="n"))
    await client.redis.set(queue.keys.pending(vr.Priority.LOW), "broken")
    # The claim takes what comes before the broken set and returns it...
    claimed = await _claim(queue, 10)
    assert sorted(j for j, _ in claimed) == sorted([high, normal])
    assert sorted(m.decode() for m in await client.redis.zrange(queue.keys.running, 0, -1)) == sorted(
        [high, normal]
    )
    # ...and the next one, with nothing before it, reports the key and moves nothing.
    with pytest.raises(CorruptQueueError, match=r"pending:low is not a sorted set"):
        await claim_raw(queue, 10)
    for job_id, token in claimed:
        done = calls.complete(
            queue.keys, client._now_arg(), [calls.completion(job_id, token, "", b"", b"", b"")]
        )
        assert calls.completed(await client.sender.call(done)) == [calls.APPLIED]
    info = await queue.get(high)
    assert info is not None and (info.state, info.failures) == (vr.JobState.COMPLETED, 0)


async def test_a_wrong_type_completed_set_leaves_the_batch_running(
    client: vr.Client, queue: vr.Queue
) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    claimed = await _claim(queue, 3)
    await client.redis.set(queue.keys.completed, "broken")
    done = calls.complete(
        queue.keys, client._now_arg(), [calls.completion(j, t, "", b"", b"", b"") for j, t in claimed]
    )
    with pytest.raises(CorruptQueueError, match=r"completed is not a sorted set"):
        await client.sender.call(done)
    for job_id in ids:
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.RUNNING  # untouched: still theirs
    assert await client.redis.zcard(queue.keys.running) == 3
    # Repaired, the same completions go through.
    await client.redis.delete(queue.keys.completed)
    assert calls.completed(await client.sender.call(done)) == [calls.APPLIED] * 3


class NanPause(vr.Task):
    KIND = "nan-pause"


class NanPauseJob(NanPause, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
        if ctx.run_count == 1:
            return vr.Outcome("pause", delay_ms=float("nan"))  # type: ignore[arg-type]
        return vr.Outcome.completed()


async def test_a_nan_pause_is_a_failed_run_not_a_lost_job(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(NanPause())
    await drain(queue, NanPauseJob)
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.COMPLETED, 1)
    failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
    assert len(failed) == 1 and "nan" in (failed[0].note or "")  # refused by Outcome itself, or calls.py


async def test_a_nan_delay_is_refused_before_and_by_the_script(client: vr.Client, queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"))
    ((_, token),) = await _claim(queue, 1)
    with pytest.raises(vr.ConfigurationError, match="pause delay"):
        calls.pause(
            queue.keys,
            "",
            job_id=job_id,
            token=token,
            priority=vr.Priority.NORMAL,
            delay_ms=float("nan"),  # type: ignore[arg-type]
            note="",
            attachment=b"",
            carry=b"",
        )
    call = calls.pause(
        queue.keys,
        "",
        job_id=job_id,
        token=token,
        priority=vr.Priority.NORMAL,
        delay_ms=0,
        note="",
        attachment=b"",
        carry=b"",
    )
    call.args[4] = "nan"  # what a caller that skipped the check would send
    with pytest.raises(vr.ConfigurationError, match="pause delay"):
        await client.sender.call(call)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.RUNNING  # nothing written


async def test_a_worker_survives_a_broken_pending_set(client: vr.Client, queue: vr.Queue) -> None:
    """The claim's coded error is logged and retried; the jobs before the broken set still run."""
    job_id = await queue.enqueue(Echo(text="c"), priority=vr.Priority.CRITICAL)
    await client.redis.set(queue.keys.pending(vr.Priority.LOW), "broken")
    state: dict[str, Any] = {}
    worker = make_worker(queue, EchoJob, state=state, poll_interval=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while (info := await queue.get(job_id)) is None or info.state != vr.JobState.COMPLETED:
                await anyio.sleep(0.02)
        worker.shutdown()
    assert state["ran"] == ["c"]
