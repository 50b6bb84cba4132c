"""A queue written by the release before 0.2 keeps working after the upgrade (issue 42).

Each test writes jobs by hand exactly as the previous release's scripts left
them (its claim journaled an explicit `claimed` entry and wrote no
`claimed_at`; its first journaled event wrote the `enqueued` entry; its
quarantine and bad payloads said `bad_payload`; a dead job's reason was in its
journal only), then runs this release's code on them: pending, running and
finished jobs are claimed, finished and read correctly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs
from tests.tasks import Echo, EchoJob
from venturi_redis._model.codec import pack_model
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio

T0 = 1_700_000_000_000


async def _old_pending(queue: vr.Queue, job_id: str, *, journal: list[dict[str, str]] | None = None) -> None:
    """A pending job as the previous release's enqueue (and, with ``journal``, later scripts) left it."""
    r, k = queue.client.redis, queue.keys
    await r.hset(
        k.job(job_id),
        mapping={
            "kind": Echo.KIND,
            "state": "pending",
            "priority": "normal",
            "eligible_at": str(T0),
            "created_at": str(T0),
            "payload": pack_model(Echo(text=job_id)),
        },
    )
    await r.zadd(k.pending(vr.Priority.NORMAL), {job_id: T0})
    if journal:
        await r.xadd(
            k.journal(job_id),
            {"event": "enqueued", "at": str(T0), "run": "0", "priority": "normal", "eligible_at": str(T0)},
            id=f"{T0}-0",
        )
        for n, fields in enumerate(journal, 1):
            await r.xadd(k.journal(job_id), fields, id=f"{T0 + n}-0")


async def _old_journal(queue: vr.Queue, job_id: str) -> None:
    """A job's journal as the previous release's claim left it: `enqueued`, then an explicit `claimed`."""
    r, journal = queue.client.redis, queue.keys.journal(job_id)
    enqueued = {"event": "enqueued", "at": str(T0), "run": "0", "priority": "normal", "eligible_at": str(T0)}
    await r.xadd(journal, enqueued, id=f"{T0}-0")  # type: ignore[arg-type]
    claimed = {"event": "claimed", "at": str(T0 + 1), "run": "1", "worker": "old-worker"}
    await r.xadd(journal, claimed, id=f"{T0 + 1}-0")  # type: ignore[arg-type]


async def test_a_pending_job_and_a_job_pending_again_run_and_read_back(queue: vr.Queue) -> None:
    await _old_pending(queue, "01OLDPENDING000000000000AA")
    # Failed once under the old release: explicit `claimed`, then `failed` (no claimed_at).
    await _old_pending(
        queue,
        "01OLDRETRY00000000000000AA",
        journal=[
            {"event": "claimed", "at": str(T0 + 1), "run": "1", "worker": "old-worker"},
            {
                "event": "failed",
                "at": str(T0 + 2),
                "run": "1",
                "note": "boom",
                "failures": "1",
                "delay_ms": "0",
            },
        ],
    )
    await queue.client.redis.hset(
        queue.keys.job("01OLDRETRY00000000000000AA"), mapping={"run_count": "1", "failures": "1"}
    )
    state: dict[str, Any] = {}
    worker = vr.Worker(queue, state=state, concurrency=2, handle_signals=False, poll_interval=0.1)
    worker.register(EchoJob)
    with anyio.fail_after(20):
        await worker.run(until_idle=True)
    assert sorted(state["ran"]) == ["01OLDPENDING000000000000AA", "01OLDRETRY00000000000000AA"]
    fresh = await queue.journal("01OLDPENDING000000000000AA")
    assert [(e.event, e.run) for e in fresh] == [("enqueued", 0), ("claimed", 1), ("completed", 1)]
    again = await queue.journal("01OLDRETRY00000000000000AA")
    # The old run's explicit claim stays as it is; the new run's is put back from its completion.
    assert [(e.event, e.run) for e in again] == [
        ("enqueued", 0),
        ("claimed", 1),
        ("failed", 1),
        ("claimed", 2),
        ("completed", 2),
    ]
    assert again[1].details["worker"] == "old-worker"
    assert again[3].details["worker"] == worker.id


async def test_a_job_running_under_the_old_release_completes_and_reads_back(queue: vr.Queue) -> None:
    """Claimed by the previous release (an explicit `claimed` entry, no claimed_at,
    a held concurrency slot and no `hooks` flag): this release completes it,
    gives its slot back, and adds no second `claimed` entry."""
    r, k = queue.client.redis, queue.keys
    job_id = "01OLDRUNNING000000000000AA"
    await queue.set_limit(Echo.KIND, concurrency=1)
    await r.hset(
        k.job(job_id),
        mapping={
            "kind": Echo.KIND,
            "state": "running",
            "priority": "normal",
            "eligible_at": str(T0),
            "created_at": str(T0),
            "payload": pack_model(Echo(text="x")),
            "run_count": "1",
            "lease_owner": "old-worker",
            "lease_token": "oldtok.1",
            "lease_expires": str(T0 + 30_000),
            "updated_at": str(T0 + 1),
            "slot": "k",
        },
    )
    await r.hset(k.limits_state, Echo.KIND, "1")  # the slot its claim took
    await r.zadd(k.running, {job_id: T0 + 30_000})
    await r.xadd(
        k.journal(job_id),
        {"event": "enqueued", "at": str(T0), "run": "0", "priority": "normal", "eligible_at": str(T0)},
        id=f"{T0}-0",
    )
    await r.xadd(
        k.journal(job_id),
        {"event": "claimed", "at": str(T0 + 1), "run": "1", "worker": "old-worker"},
        id=f"{T0 + 1}-0",
    )
    c = queue.client
    done = calls.complete(k, c._now_arg(), [calls.completion(job_id, "oldtok.1", "", b"", b"", b"")])
    assert calls.completed(await c.sender.call(done)) == [calls.APPLIED]
    assert [(e.event, e.run) for e in await queue.journal(job_id)] == [
        ("enqueued", 0),
        ("claimed", 1),
        ("completed", 1),
    ]
    assert int(await r.hget(k.limits_state, Echo.KIND) or 0) == 0  # its slot is back
    # ... so another job of the kind is claimed at once.
    fresh = await queue.enqueue(Echo(text="y"))
    assert [j for j, _ in claimed_jobs(await claim_raw(queue, 5))] == [fresh]


async def test_a_running_old_job_whose_lease_expired_is_reclaimed(queue: vr.Queue) -> None:
    r, k = queue.client.redis, queue.keys
    job_id = "01OLDEXPIRED000000000000AA"
    await r.hset(
        k.job(job_id),
        mapping={
            "kind": Echo.KIND,
            "state": "running",
            "priority": "normal",
            "eligible_at": str(T0),
            "created_at": str(T0),
            "payload": pack_model(Echo(text="x")),
            "run_count": "1",
            "lease_owner": "old-worker",
            "lease_token": "oldtok.1",
            "lease_expires": str(T0 + 1),
        },
    )
    await r.zadd(k.running, {job_id: T0 + 1})
    await r.xadd(k.journal(job_id), {"event": "enqueued", "at": str(T0), "run": "0"}, id=f"{T0}-0")
    await r.xadd(
        k.journal(job_id),
        {"event": "claimed", "at": str(T0 + 1), "run": "1", "worker": "old-worker"},
        id=f"{T0 + 1}-0",
    )
    requeued = await queue.store.reclaim(batch=10, max_failures="25")
    assert requeued.ids == [job_id]
    events = [(e.event, e.run, e.details.get("worker")) for e in await queue.journal(job_id)]
    assert events == [("enqueued", 0, None), ("claimed", 1, "old-worker"), ("lease_expired", 1, "old-worker")]


async def test_finished_jobs_of_the_old_release_read_back_with_their_dead_reason(queue: vr.Queue) -> None:
    r, k = queue.client.redis, queue.keys
    for job_id, reason in (
        ("01OLDDEADPERM000000000000A", "permanent"),
        ("01OLDDEADBAD0000000000000A", "bad_payload"),
    ):
        await r.hset(
            k.job(job_id),
            mapping={
                "kind": Echo.KIND,
                "state": "dead",
                "priority": "normal",
                "created_at": str(T0),
                "payload": pack_model(Echo(text="x")),
                "run_count": "1",
                "failures": "1",
                "note": "gone",
                "finished_at": str(T0 + 2),
            },
        )
        await r.zadd(k.dead, {job_id: T0 + 2})
        await r.xadd(k.journal(job_id), {"event": "enqueued", "at": str(T0), "run": "0"}, id=f"{T0}-0")
        await r.xadd(
            k.journal(job_id),
            {"event": "claimed", "at": str(T0 + 1), "run": "1", "worker": "w"},
            id=f"{T0 + 1}-0",
        )
        await r.xadd(
            k.journal(job_id),
            {"event": "dead", "at": str(T0 + 2), "run": "1", "reason": reason},
            id=f"{T0 + 2}-0",
        )
    perm = await queue.get("01OLDDEADPERM000000000000A")
    bad = await queue.get("01OLDDEADBAD0000000000000A")
    assert perm is not None and perm.dead_reason is vr.DeadReason.PERMANENT
    assert bad is not None and bad.dead_reason is vr.DeadReason.INVALID_PAYLOAD
    # And an operator's retry of an old dead job runs it under this release.
    assert await queue.retry("01OLDDEADPERM000000000000A")
    info = await queue.get("01OLDDEADPERM000000000000A")
    assert info is not None and info.state is vr.JobState.PENDING and info.dead_reason is None


class Quiet(vr.Task):
    KIND: ClassVar[str] = "upgrade_quiet"


async def test_a_queue_whose_events_were_off_by_default_now_has_them(queue: vr.Queue) -> None:
    """The previous release left the `events` field absent (its default was off);
    absent now means on: an old queue's enqueue is an event, and `set_events(False)`
    still turns them off (the field '0')."""
    seen: list[str] = []

    async def follow() -> None:
        async for event in queue.events(since="0"):
            seen.append(event.event)
            if event.event == "enqueued":
                return

    job_id = await queue.enqueue(Quiet())
    with anyio.fail_after(10):
        await follow()
    assert seen == ["enqueued"]
    await queue.set_events(False)
    await queue.enqueue(Quiet())
    entries = await queue.client.redis.xrange(queue.keys.events)
    assert [f[b"event"] for _, f in entries] == [b"enqueued", b"events_off"]
    assert entries[0][1][b"job"] == job_id.encode()
