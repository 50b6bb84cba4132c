"""The operator-side scripts meet a job whose own data is corrupt (issue 26, item 3).

The worker-side scripts quarantine such a job (tests/test_quarantine.py). An
operator's operation on one job (cancel, resume, retry, a dedup merge into
it) refuses it instead, with ``vr.CorruptQueueError`` naming the job and what
is wrong, and writes nothing: the job stays where it was, for the claim or
the reclaim to quarantine, or for the operator to repair. An operation on
many (retry of every dead job, purge) handles the healthy ones normally and
leaves the corrupt one as it was. docs/guarantees.md, "Corrupt jobs are
quarantined", lists each case.

Damage, as redis-cli would do it: ``SET job:<id> x``, ``SET journal:<id> x``,
``HDEL job:<id> state``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw
from tests.tasks import Echo
from venturi_redis._store import calls, calls_obs

pytestmark = pytest.mark.anyio

DAMAGES = ["job", "journal", "state", "bogus"]
WHY = {
    "job": "job key is not a hash",
    "journal": "journal key is not a stream",
    "state": "state field is missing",
    "bogus": 'state field "bogus" is not a job state',
}
SETS = ("pending:critical", "pending:high", "pending:normal", "pending:low", "running", "suspended", "dead")
SETS += ("completed", "cancelled", "waiting")


async def _damage(queue: vr.Queue, job_id: str, how: str) -> None:
    r = queue.client.redis
    if how == "state":
        await r.hdel(queue.keys.job(job_id), "state")
        return
    if how == "bogus":
        await r.hset(queue.keys.job(job_id), "state", "bogus")
        return
    key = queue.keys.job(job_id) if how == "job" else queue.keys.journal(job_id)
    if how == "journal":
        await r.xadd(key, {"event": "x"})  # a journal that existed: SET replaces it
    await r.delete(key)
    await r.set(key, "x")


async def _where(queue: vr.Queue, job_id: str) -> tuple[Any, ...]:
    """Everything an operation could write about one job: its hash, its sets, its journal."""
    r = queue.client.redis
    job, journal = queue.keys.job(job_id), queue.keys.journal(job_id)
    hash_ = await r.hgetall(job) if (await r.type(job)) == b"hash" else await r.get(job)
    stream = await r.xrange(journal) if (await r.type(journal)) == b"stream" else await r.get(journal)
    sets = [s for s in SETS if await r.zscore(queue.keys.prefix + s, job_id) is not None]
    return hash_, stream, sets, await r.hgetall(queue.keys.dedup)


async def _consistent(queue: vr.Queue, job_id: str, state: vr.JobState) -> None:
    """The job's state field agrees with the one set it is in, and with its journal's last entry."""
    info = await queue.get(job_id)
    assert info is not None and info.state == state
    _, _, sets, _ = await _where(queue, job_id)
    want = f"pending:{info.priority.label}" if state == vr.JobState.PENDING else state.value
    assert sets == [want]
    last = (await queue.journal(job_id))[-1].event
    assert last == {"pending": "retried", "cancelled": "cancelled"}.get(state.value, last)


async def _claim(queue: vr.Queue, count: int) -> list[tuple[str, str]]:
    reply = calls.claim_reply(await claim_raw(queue, count), "tok")
    return [(job[0], job[6]) for job in reply.jobs()]


async def _running(queue: vr.Queue, n: int) -> list[tuple[str, str]]:
    await queue.enqueue_many([Echo(text=str(i)) for i in range(n)])
    return await _claim(queue, n)


async def _suspended(queue: vr.Queue) -> str:
    ((job_id, token),) = await _running(queue, 1)
    call = calls.suspend(
        queue.keys, "", job_id=job_id, token=token, note="", attachment=b"", carry=b"", output=b""
    )
    assert calls.transition(await queue.client.sender.call(call)).applied
    return job_id


async def _dead(queue: vr.Queue, n: int) -> list[str]:
    ids = []
    for job_id, token in await _running(queue, n):
        call = calls.dead(
            queue.keys,
            "",
            job_id=job_id,
            token=token,
            note="gone",
            attachment=b"",
            carry=b"",
            reason="permanent",
        )
        assert calls.transition(await queue.client.sender.call(call)).applied
        ids.append(job_id)
    return ids


# -- cancel ---------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "running", "suspended"])
@pytest.mark.parametrize("how", DAMAGES)
async def test_cancel_refuses_a_corrupt_job_and_writes_nothing(queue: vr.Queue, how: str, state: str) -> None:
    if state == "pending":
        job_id = await queue.enqueue(Echo(text="x"))
    elif state == "running":
        ((job_id, _),) = await _running(queue, 1)
    else:
        job_id = await _suspended(queue)
    await _damage(queue, job_id, how)
    before = await _where(queue, job_id)
    with pytest.raises(vr.CorruptQueueError, match=f"job {job_id}: {WHY[how]}"):
        await queue.cancel(job_id)
    assert await _where(queue, job_id) == before


async def test_cancel_of_a_healthy_job_is_unchanged(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="x"))
    assert await queue.cancel(job_id) == "cancelled"
    await _consistent(queue, job_id, vr.JobState.CANCELLED)
    assert await queue.cancel(job_id) == "finished"
    assert await queue.cancel("nope") == "not_found"


# -- resume ---------------------------------------------------------------------


@pytest.mark.parametrize("how", DAMAGES)
async def test_resume_refuses_a_corrupt_job_and_writes_nothing(queue: vr.Queue, how: str) -> None:
    job_id = await _suspended(queue)
    await _damage(queue, job_id, how)
    before = await _where(queue, job_id)
    with pytest.raises(vr.CorruptQueueError, match=f"job {job_id}: {WHY[how]}"):
        await queue.resume(job_id, "input")
    assert await _where(queue, job_id) == before


async def test_resume_refuses_a_bad_priority(queue: vr.Queue) -> None:
    job_id = await _suspended(queue)
    await queue.client.redis.hset(queue.keys.job(job_id), "priority", "urgent")
    before = await _where(queue, job_id)
    with pytest.raises(vr.CorruptQueueError, match=f'job {job_id}: priority field "urgent"'):
        await queue.resume(job_id, "input")
    assert await _where(queue, job_id) == before
    assert await queue.resume("nope") == 0  # an unknown job is still a plain refusal


# -- retry of dead jobs -----------------------------------------------------------


@pytest.mark.parametrize("kind", [None, "echo"])
@pytest.mark.parametrize("how", [*DAMAGES, "priority"])
async def test_retry_dead_moves_the_healthy_and_leaves_the_corrupt_one(
    queue: vr.Queue, how: str, kind: str | None
) -> None:
    ids = await _dead(queue, 4)
    bad = ids[1]
    if how == "priority":
        await queue.client.redis.hset(queue.keys.job(bad), "priority", "urgent")
    else:
        await _damage(queue, bad, how)
    before = await _where(queue, bad)
    moved = await queue.retry_dead(kind=kind)  # by kind: its read of each job's kind copes too
    assert sorted(moved) == sorted(i for i in ids if i != bad)
    for job_id in moved:
        await _consistent(queue, job_id, vr.JobState.PENDING)
    assert await _where(queue, bad) == before
    why = WHY.get(how, 'priority field "urgent"')
    with pytest.raises(vr.CorruptQueueError, match=f"job {bad}: {why}"):
        await queue.retry(bad)
    assert await _where(queue, bad) == before
    assert await queue.retry(ids[0]) is False  # healthy and no longer dead: a plain no


# -- purge ----------------------------------------------------------------------


@pytest.mark.parametrize("how", DAMAGES)
async def test_purge_removes_a_corrupt_finished_job_with_the_others(queue: vr.Queue, how: str) -> None:
    ids = await _dead(queue, 3)
    await _damage(queue, ids[1], how)
    assert await queue.purge("dead") == 3
    r = queue.client.redis
    for job_id in ids:
        assert await r.exists(queue.keys.job(job_id), queue.keys.journal(job_id)) == 0
    assert (await queue.counts())["dead"] == 0


# -- progress -------------------------------------------------------------------


@pytest.mark.parametrize("how", DAMAGES)
async def test_progress_of_a_corrupt_job_is_refused_and_writes_nothing(queue: vr.Queue, how: str) -> None:
    ((job_id, token),) = await _running(queue, 1)
    await _damage(queue, job_id, how)
    before = await _where(queue, job_id)
    call = calls_obs.progress(queue.keys, "", job_id=job_id, token=token, value=b"\x01")
    reply = await queue.client.sender.call(call)
    assert calls_obs.progressed(reply) is (how == "journal")  # progress is not journaled
    if how != "journal":
        assert await _where(queue, job_id) == before


# -- queue pause and resume -------------------------------------------------------


async def test_queue_pause_and_resume_ignore_a_corrupt_job(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(len(DAMAGES))])
    for how, job_id in zip(DAMAGES, ids, strict=True):
        await _damage(queue, job_id, how)
    before = [await _where(queue, i) for i in ids]
    await queue.pause()
    await queue.resume_queue()
    assert [await _where(queue, i) for i in ids] == before


async def test_queue_pause_and_resume_name_a_wrong_type_meta_key(queue: vr.Queue) -> None:
    # The pause flag lives in the queue's meta hash: overwritten by hand, both
    # say which key, as vr.CorruptQueueError, not a raw WRONGTYPE.
    await queue.client.redis.set(queue.keys.meta, "x")
    for operation in (queue.pause, queue.resume_queue):
        with pytest.raises(vr.CorruptQueueError, match=f"{re.escape(queue.keys.meta)} is not a hash"):
            await operation()
    assert await queue.client.redis.get(queue.keys.meta) in (b"x", "x")


# -- a dedup merge into a corrupt job ----------------------------------------------


class Keyed(vr.Task):
    KIND: ClassVar[str] = "keyed"
    key: str
    n: int = 0

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Keyed, Any]) -> vr.Merge[Keyed, Any]:
        return vr.Merge.replace()


@pytest.mark.parametrize("how", [*DAMAGES, "priority"])
async def test_a_merge_into_a_corrupt_job_is_refused_and_writes_nothing(queue: vr.Queue, how: str) -> None:
    holder = await queue.enqueue(Keyed(key="k"))
    if how == "priority":
        await queue.client.redis.hset(queue.keys.job(holder), "priority", "urgent")
    else:
        await _damage(queue, holder, how)
    before = await _where(queue, holder)
    why = WHY.get(how, 'priority field "urgent"')
    with pytest.raises(vr.CorruptQueueError, match=f"job {holder}: {why}"):
        await queue.enqueue(Keyed(key="k", n=1))
    assert await _where(queue, holder) == before
    assert (await queue.counts())["pending"] == 1  # no second job either


async def test_merge_script_refuses_a_corrupt_job_itself(queue: vr.Queue) -> None:
    """The second line of defence: merge.lua checks the job before its first write,
    for a caller that skipped the client's reads."""
    holder = await queue.enqueue(Keyed(key="k"))
    await _damage(queue, holder, "journal")
    before = await _where(queue, holder)
    call = calls.merge(
        queue.keys,
        "",
        holder=holder,
        old_priority=vr.Priority.NORMAL,
        new_priority=vr.Priority.HIGH,
        decision="replace",
        payload=b"\x80",
        carry_action="reset",
        carry=b"",
        by="x",
    )
    with pytest.raises(vr.CorruptQueueError, match=f"job {holder}: journal key is not a stream"):
        await queue.client.sender.call(call)
    assert await _where(queue, holder) == before


@pytest.mark.parametrize("how", ["job", "journal"])
async def test_a_workers_own_cancel_of_a_corrupt_job_is_refused(queue: vr.Queue, how: str) -> None:
    """The worker ending its run cancelled (cancel.lua with its lease token): a refusal,
    as for its other outcomes (lease.lua check_owner), not a script error."""
    ((job_id, token),) = await _running(queue, 1)
    await _damage(queue, job_id, how)
    before = await _where(queue, job_id)
    call = calls.cancel(queue.keys, "", job_id=job_id, note="stop", token=token)
    got = calls.transition(await queue.client.sender.call(call))
    assert got == calls.Transition(False, WHY[how])
    assert await _where(queue, job_id) == before


@pytest.mark.parametrize("damage", ["ttl", "snapshot"])
async def test_an_offloads_damaged_snapshot_or_ttl_never_fails_its_completion(
    queue: vr.Queue, damage: str
) -> None:
    # An offload job settles its snapshot after its own transition is
    # written: an offload_ttl that is not whole ms (3600000.5), or a snapshot key
    # overwritten with a string, used to fail the script half way (the job
    # completed, the caller's snapshot never settled, the reply an error).
    async def build(n: int) -> int:
        return n * 2

    fn = vr.offload(queue=queue.name, kind="tests.quarantine_offload")(build)
    handle = await fn.offload(queue.client, n=21)
    r = queue.client.redis
    snapshot = queue.keys.offload(handle.key.rsplit(":", 1)[1])
    if damage == "ttl":
        await r.hset(queue.keys.job(handle.job_id), "offload_ttl", "3600000.5")
    else:
        await r.set(snapshot, "x")
    worker = vr.Worker(queue, handle_signals=False, check_eviction_policy=False, poll_interval=0.2)
    worker.register(fn)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    info = await queue.get(handle.job_id)
    assert info is not None and (info.state, info.result) == (vr.JobState.COMPLETED, 42)
    assert await r.type(snapshot) in (b"hash", "hash")
    settled = await vr.read_result(queue.client, handle)
    assert settled is not None and (settled.status, settled.value) == ("completed", 42)
    if damage == "ttl":  # the retention is kept, in whole ms (PEXPIRE failed on the fraction)
        assert 0 < await r.pttl(snapshot) <= 3_600_000
