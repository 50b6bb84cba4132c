"""A damaged workflow key never hurts unrelated work (issue 38 item 1).

Each case turns one key a child's completion touches into the wrong type, then
completes the child together with 20 unrelated jobs in one complete.lua call
(a worker's batch). Before, the script failed part way: jobs listed in
`completed` with a hash still `running`, out of the running set, for good.
Now every job of the batch completes; a dependent whose own key is damaged is
quarantined (dead, reason corrupt, a note naming the key); a damaged
queue-wide key defers the telling to the reclaim sweep, once repaired.
"""

from __future__ import annotations

import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs
from tests.tasks import Echo
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio


async def _setup(queue: vr.Queue) -> tuple[str, str, list[str]]:
    """A child with a parent waiting on it, and 20 unrelated jobs: all claimed, none finished."""
    child = await queue.enqueue(Echo(text="child"))
    parent = await queue.enqueue(Echo(text="parent"), after=[child])
    others = [await queue.enqueue(Echo(text=f"other{i}")) for i in range(20)]
    assert (await queue.get(parent)).state is vr.JobState.WAITING  # type: ignore[union-attr]
    return child, parent, others


async def _complete_all(queue: vr.Queue) -> list[str]:
    """Claim every pending job and complete them all in one script call, the child in the middle."""
    claimed = claimed_jobs(await claim_raw(queue, 100))
    c = queue.client
    completions = [calls.completion(job_id, token, "", b"", b"", b"") for job_id, token in claimed]
    completions.insert(10, completions.pop(0))  # the child (enqueued first) amid the others
    replies = await c.sender.call(calls.complete(queue.keys, c._now_arg(), completions))
    assert list(replies) == [1] * len(claimed)
    return [job_id for job_id, _ in claimed]


async def _agrees(queue: vr.Queue, job_id: str, state: vr.JobState) -> None:
    """The hash, the index sets and the journal agree on the job's state."""
    info = await queue.get(job_id)
    assert info is not None and info.state is state
    r, k = queue.client.redis, queue.keys
    assert await r.zscore(k.running, job_id) is None
    index = {
        vr.JobState.COMPLETED: k.completed,
        vr.JobState.DEAD: k.dead,
        vr.JobState.PENDING: k.pending(vr.Priority.NORMAL),
    }
    if state in index:
        assert await r.zscore(index[state], job_id) is not None
    assert (await queue.journal(job_id))[-1].event in {"completed", "dead", "ready"}


PARENT_KEYS = {
    "deps": lambda k, p: f"{k.prefix}deps:{p}",
    "depresults": lambda k, p: f"{k.prefix}depresults:{p}",
    "hash": lambda k, p: k.job(p),
    "journal": lambda k, p: k.journal(p),
}


@pytest.mark.parametrize("damaged", sorted(PARENT_KEYS))
async def test_a_parent_with_a_damaged_key_is_quarantined_and_the_batch_completes(
    queue: vr.Queue, damaged: str
) -> None:
    child, parent, others = await _setup(queue)
    r = queue.client.redis
    key = PARENT_KEYS[damaged](queue.keys, parent)
    await r.delete(key)
    await r.set(key, "broken by hand")
    assert sorted(await _complete_all(queue)) == sorted([child, *others])
    for job_id in (child, *others):
        await _agrees(queue, job_id, vr.JobState.COMPLETED)
    assert await r.zscore(queue.keys.dead, parent) is not None
    assert await r.zscore(queue.keys.waiting, parent) is None
    if damaged != "hash":  # a hash of the wrong type keeps its value: nothing to read the note from
        info = await queue.get(parent)
        assert info is not None and info.state is vr.JobState.DEAD
        assert info.dead_reason is vr.DeadReason.CORRUPT
        assert info.note is not None and key in info.note
    assert await r.get(key) == b"broken by hand"  # the evidence is kept


async def test_a_damaged_waiting_set_defers_the_parent_until_it_is_repaired(queue: vr.Queue) -> None:
    child, parent, others = await _setup(queue)
    r, k = queue.client.redis, queue.keys
    await r.delete(k.waiting)
    await r.set(k.waiting, "broken by hand")
    await _complete_all(queue)
    for job_id in (child, *others):
        await _agrees(queue, job_id, vr.JobState.COMPLETED)
    assert (await queue.get(parent)).state is vr.JobState.WAITING  # type: ignore[union-attr]
    assert await r.sismember(f"{k.prefix}graph:orphans", child)
    # Repaired (the waiting set back as a sorted set), the reclaim sweep tells the parent.
    await r.delete(k.waiting)
    await r.zadd(k.waiting, {parent: 1})
    await queue.store.reclaim(batch=100, max_failures="")
    await _agrees(queue, parent, vr.JobState.PENDING)


async def test_a_child_whose_dependents_set_is_damaged_still_tells_its_parent(queue: vr.Queue) -> None:
    child, parent, others = await _setup(queue)
    r, k = queue.client.redis, queue.keys
    await r.delete(f"{k.prefix}dependents:{child}")
    await r.set(f"{k.prefix}dependents:{child}", "broken by hand")
    await _complete_all(queue)
    for job_id in (child, *others):
        await _agrees(queue, job_id, vr.JobState.COMPLETED)
    await _agrees(queue, parent, vr.JobState.PENDING)  # found through the waiting set
