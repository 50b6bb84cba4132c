"""Guarantees of the Lua transitions that only a mutation of the scripts showed
undefended: each test here failed with one line of lua/ removed or inverted
(docs/guarantees.md; the campaign's table is in the branch's report). The
clock is the client's, driven by the test, so a lease expires on demand."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.tasks import Echo
from venturi_redis._store import calls, calls_ending, calls_obs, calls_ops

pytestmark = pytest.mark.anyio

T0 = 1_900_000_000_000
LEASE = 1_000


class Keyed(vr.Task):
    KIND: ClassVar[str] = "guarantees-keyed"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.keep()


class Throttled(Keyed):
    KIND: ClassVar[str] = "guarantees-throttled"

    @classmethod
    def dedup_window(cls) -> float:
        return 60.0


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


async def send(queue: vr.Queue, call: calls.Call) -> Any:
    return await queue.client.sender.call(call)


async def claim(queue: vr.Queue, base: str, worker: str = "w1") -> tuple[str, str]:
    """One job claimed under the token base ``base`` (a worker's claims each have their own)."""
    call = calls.claim(
        queue.keys, queue.client._now_arg(), count=1, worker=worker, token_base=base, default_lease_ms=LEASE
    )
    ((job_id, token),) = [(job[0], job[6]) for job in calls.claim_reply(await send(queue, call), base).jobs()]
    return job_id, token


async def reclaim(queue: vr.Queue, max_failures: str = "25") -> None:
    now = queue.client._now_arg()
    await send(queue, calls.reclaim(queue.keys, now, batch=100, max_failures=max_failures))


@pytest.fixture
def clock(queue: vr.Queue) -> Clock:
    queue.client.clock = clock = Clock(T0)
    return clock


async def taken_over(queue: vr.Queue, clock: Clock) -> tuple[str, str, str]:
    """A job whose first run lost its lease and which a second claim now runs:
    (id, the stale token, the live one)."""
    await queue.enqueue(Echo(text="x"))
    job_id, stale = await claim(queue, "old", "w-old")
    clock.ms += LEASE + 1
    await reclaim(queue)
    again, live = await claim(queue, "new", "w-new")
    assert again == job_id and live != stale
    return job_id, stale, live


def ending(
    queue: vr.Queue, op: str, job_id: str, token: str, attachment: bytes = b"", carry: bytes = b"c"
) -> calls.Call:
    k, now = queue.keys, queue.client._now_arg()
    normal = vr.Priority.NORMAL
    if op == "complete":
        return calls_ending.complete(
            k, now, [calls_ending.completion(job_id, token, "", attachment, carry, b"")]
        )
    if op == "release":
        return calls_ending.release(k, now, job_id=job_id, token=token, priority=normal, carry=carry, note="")
    if op == "pause":
        return calls_ending.pause(
            k, now, job_id=job_id, token=token, priority=normal, delay_ms=0, note="", attachment=attachment,
            carry=carry,
        )  # fmt: skip
    if op == "suspend":
        return calls_ending.suspend(
            k, now, job_id=job_id, token=token, note="", attachment=attachment, carry=carry, output=b"o"
        )
    if op == "retry":
        return calls_ending.retry(
            k, now, job_id=job_id, token=token, priority=normal, note="e", attachment=attachment, carry=carry,
            base_ms=0, cap_ms=0, jitter=0.0, max_failures="none",
        )  # fmt: skip
    if op == "dead":
        return calls_ending.dead(
            k,
            now,
            job_id=job_id,
            token=token,
            note="e",
            attachment=attachment,
            carry=carry,
            reason="permanent",
        )
    if op == "cancel":
        return calls_ending.cancel(
            k, now, job_id=job_id, note="n", token=token, attachment=attachment, carry=carry
        )
    if op == "progress":
        return calls_obs.progress(k, now, job_id=job_id, token=token, value=b"p")
    return calls.extend(k, now, [(job_id, token, 60_000)])


ENDINGS = ["complete", "release", "pause", "suspend", "retry", "dead", "cancel"]


@pytest.mark.parametrize("op", [*ENDINGS, "progress", "extend"])
async def test_a_worker_whose_lease_was_taken_cannot_write_the_job(
    queue: vr.Queue, clock: Clock, op: str
) -> None:
    """Fencing, script by script: the stale token's call changes neither the
    job's hash nor its place in running; the run that holds the lease goes on."""
    job_id, stale, live = await taken_over(queue, clock)
    r, k = queue.client.redis, queue.keys
    before = await r.hgetall(k.job(job_id)), await r.zscore(k.running, job_id)
    await send(queue, ending(queue, op, job_id, stale))
    assert (await r.hgetall(k.job(job_id)), await r.zscore(k.running, job_id)) == before
    # The live run can still end it.
    assert await send(queue, ending(queue, "complete", job_id, live)) == [1]


LEASE_FIELDS = (b"lease_token", b"lease_expires", b"claimed_at")


@pytest.mark.parametrize("attachment", [b"", b"\x81\xa1a\x01"], ids=["bare", "attachment"])
@pytest.mark.parametrize("op", ENDINGS)
async def test_a_run_that_ends_leaves_no_lease_on_the_job(
    queue: vr.Queue, clock: Clock, op: str, attachment: bytes
) -> None:
    """Leaving running drops the lease with the run (an attachment or not):
    the ended run's token is no longer the job's."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    await send(queue, ending(queue, op, job_id, token, attachment))
    left = await queue.client.redis.hgetall(queue.keys.job(job_id))
    assert left[b"state"] != b"running"
    assert [f for f in LEASE_FIELDS if f in left] == []


@pytest.mark.parametrize("op", ENDINGS)
async def test_the_reclaim_drops_the_lease_and_a_late_outcome_is_refused_as_the_job_is_pending(
    queue: vr.Queue, clock: Clock, op: str
) -> None:
    """The reclaim drops the lease, and the refusal journaled says why: the job
    is no longer running (not only that the token differs)."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "old")
    clock.ms += LEASE + 1
    await reclaim(queue)
    left = await queue.client.redis.hgetall(queue.keys.job(job_id))
    assert [f for f in LEASE_FIELDS if f in left] == []
    reply = await send(queue, ending(queue, op, job_id, token))
    assert reply in ([0, b"job is pending"], [b"job is pending"])
    last = (await queue.journal(job_id))[-1]
    assert (last.event, last.note, last.details.get("attempted")) == ("refused", "job is pending", op)


async def test_a_renewed_lease_is_not_reclaimed_at_its_first_expiry(queue: vr.Queue, clock: Clock) -> None:
    """extend moves the lease in the hash and in the running set, which the
    reclaim reads: the run keeps its job past the claim's lease."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    clock.ms += LEASE // 2
    assert calls.extended(await send(queue, ending(queue, "extend", job_id, token))).lost == []
    clock.ms += LEASE
    await reclaim(queue)
    r, k = queue.client.redis, queue.keys
    expires = await r.hget(k.job(job_id), "lease_expires")
    assert int(expires) == clock.ms - LEASE + 60_000 == await r.zscore(k.running, job_id)
    assert await send(queue, ending(queue, "complete", job_id, token)) == [1]


@pytest.mark.parametrize("op", ["release", "pause", "retry"])
async def test_a_job_back_in_pending_takes_its_dedup_key_back(queue: vr.Queue, clock: Clock, op: str) -> None:
    """Dedup: the claim freed the key; a run that ends back in pending is again
    the key's merge candidate, so a new enqueue of the key merges into it."""
    job_id = await queue.enqueue(Keyed(key="k"))
    claimed, token = await claim(queue, "one")
    assert (await send(queue, ending(queue, op, claimed, token, carry=b"")))[0] == 1
    assert await queue.enqueue(Keyed(key="k")) == job_id


@pytest.mark.parametrize("op", ["release", "pause", "retry"])
async def test_a_run_that_ends_back_in_pending_wakes_one_idle_worker(
    queue: vr.Queue, clock: Clock, op: str
) -> None:
    """Its job is claimable again: one wake token, or idle workers blocked on
    the wake list wait for their poll to see it."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    r = queue.client.redis
    await r.delete(queue.keys.wake)  # as an idle worker's short claim leaves it
    assert (await send(queue, ending(queue, op, job_id, token)))[0] == 1
    assert await r.llen(queue.keys.wake) == 1


async def test_a_throttled_job_keeps_its_key_while_it_runs_past_its_first_lease(
    queue: vr.Queue, clock: Clock
) -> None:
    """Throttle: the key stays with the running job (an enqueue of it returns
    the job) when the reclaim's sweep looks again at the claim's lease end."""
    job_id = await queue.enqueue(Throttled(key="k"))
    _, token = await claim(queue, "one")
    clock.ms += LEASE // 2
    await send(queue, ending(queue, "extend", job_id, token))
    clock.ms += LEASE
    await reclaim(queue)
    assert await queue.enqueue(Throttled(key="k")) == job_id


@pytest.mark.parametrize("how", ["lease_expired", "failed"])
async def test_a_job_whose_cancel_was_requested_is_not_counted_retrying_after_its_run(
    queue: vr.Queue, clock: Clock, how: str
) -> None:
    """Its run failed or lost its lease: back to pending for the claim to
    cancel, not to run again. No retry: counts() and the listing say so."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    assert await queue.cancel(job_id) == "requested"
    if how == "failed":
        assert (await send(queue, ending(queue, "retry", job_id, token)))[0] == 1
    else:
        clock.ms += LEASE + 1
        await reclaim(queue)
    assert (await queue.get(job_id)).state == vr.JobState.PENDING  # type: ignore[union-attr]
    assert (await queue.counts())["retrying"] == 0
    assert await queue.list_jobs(state="retrying") == []


async def test_a_completion_sent_twice_in_one_call_completes_once_and_journals_no_refusal(
    queue: vr.Queue, clock: Clock
) -> None:
    """A batch that carries one run twice: the second is answered as the first
    left it, and the journal tells of one completion, no refused outcome."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    one = calls_ending.completion(job_id, token, "", b"", b"", b"")
    reply = await send(queue, calls_ending.complete(queue.keys, queue.client._now_arg(), [one, one]))
    assert reply == [1, b"job is completed"]
    assert [e.event for e in await queue.journal(job_id)] == ["enqueued", "claimed", "completed"]


async def test_the_reclaim_never_runs_again_a_finished_job_left_in_running(
    queue: vr.Queue, clock: Clock
) -> None:
    """A running-set member whose job is not running (written by hand, or a
    restore from a torn snapshot) is dropped from the set, the job untouched."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    assert await send(queue, ending(queue, "complete", job_id, token)) == [1]
    r, k = queue.client.redis, queue.keys
    await r.zadd(k.running, {job_id: clock.ms})
    before = await r.hgetall(k.job(job_id))
    clock.ms += LEASE + 1
    await reclaim(queue)
    assert await r.hgetall(k.job(job_id)) == before
    assert await r.zscore(k.running, job_id) is None
    assert (await queue.counts())["pending"] == 0


async def test_a_completion_trims_at_most_twice_as_many_as_it_completes(
    queue: vr.Queue, clock: Clock
) -> None:
    """Retention inside complete keeps each call's work bounded: past its
    bound, the completed set shrinks two per completion (the sweep does the rest)."""
    r, k = queue.client.redis, queue.keys
    await r.zadd(k.completed, {f"old-{i}": clock.ms - 10_000 + i for i in range(10)})
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    one = calls_ending.completion(job_id, token, "", b"", b"", b"")
    assert await send(queue, calls_ending.complete(k, queue.client._now_arg(), [one], keep_ms="1000")) == [1]
    assert await r.zrange(k.completed, 0, -1) == [f"old-{i}".encode() for i in range(2, 10)] + [
        job_id.encode()
    ]


async def test_a_running_job_quarantined_at_its_lease_end_keeps_no_lease(
    queue: vr.Queue, clock: Clock
) -> None:
    """Quarantine: the run's token and lease end with the job (dead, corrupt)."""
    await queue.enqueue(Echo(text="x"))
    job_id, _ = await claim(queue, "one")
    r, k = queue.client.redis, queue.keys
    await r.set(k.journal(job_id), "not a stream")
    clock.ms += LEASE + 1
    await reclaim(queue)
    left = await r.hgetall(k.job(job_id))
    assert (left[b"state"], left[b"dead_reason"]) == (b"dead", b"corrupt")
    assert [f for f in (b"lease_token", b"lease_expires") if f in left] == []


async def test_a_throttled_run_that_lost_its_key_opens_no_window_on_completion(
    queue: vr.Queue, clock: Clock
) -> None:
    """Throttle: only the key's holder holds it past its run; a job that runs
    as its own row (another took the key) leaves the holder's look alone."""
    job_id = await queue.enqueue(Throttled(key="k"))
    _, token = await claim(queue, "one")
    r, k = queue.client.redis, queue.keys
    (field,) = await r.hkeys(k.dedup)
    await r.hset(k.dedup, field, "another")
    look = await r.zscore(k.dedup_held, field)
    clock.ms += 10
    assert await send(queue, ending(queue, "complete", job_id, token, carry=b"")) == [1]
    assert await r.zscore(k.dedup_held, field) == look
    assert await r.hget(k.job(job_id), "dedup_until") is None


async def dead_job(queue: vr.Queue, task: vr.Task, *, cancel: bool = False) -> str:
    """A job that died in its run (its cancel requested first, if ``cancel``)."""
    job_id = await queue.enqueue(task)
    _, token = await claim(queue, "one")
    if cancel:
        assert await queue.cancel(job_id) == "requested"
    assert await send(queue, ending(queue, "dead", job_id, token, carry=b"")) == [1]
    return job_id


async def retry_dead(queue: vr.Queue, job_id: str) -> None:
    await send(queue, calls_ops.retry_dead(queue.keys, queue.client._now_arg(), ids=[job_id], note="again"))


async def test_a_dead_job_retried_takes_its_dedup_key_back(queue: vr.Queue, clock: Clock) -> None:
    job_id = await dead_job(queue, Keyed(key="k"))
    await retry_dead(queue, job_id)
    assert await queue.enqueue(Keyed(key="k")) == job_id


async def test_a_dead_job_retried_runs_again_though_a_cancel_was_requested_in_its_last_run(
    queue: vr.Queue, clock: Clock
) -> None:
    """The operator's retry is a fresh start: the old cancel request does not
    make the claim cancel it."""
    job_id = await dead_job(queue, Echo(text="x"), cancel=True)
    await retry_dead(queue, job_id)
    assert await claim(queue, "two") == (job_id, "two.1")


async def test_a_dead_job_retried_or_purged_leaves_the_retrying_index(queue: vr.Queue, clock: Clock) -> None:
    """A dead job left in `retrying` (the claim quarantined it while it waited
    for a retry) is no retry: an operator's retry or purge takes it out."""
    r, k = queue.client.redis, queue.keys
    retried = await dead_job(queue, Echo(text="x"))
    purged = await dead_job(queue, Echo(text="y"))
    await r.zadd(k.retrying, {retried: clock.ms, purged: clock.ms})
    await retry_dead(queue, retried)
    await send(
        queue, calls_ops.purge(k, queue.client._now_arg(), state="dead", keep_ms=0, batch=10, ids=[purged])
    )
    assert await r.zrange(k.retrying, 0, -1) == []


async def test_a_purge_removes_only_jobs_in_the_purged_state_and_their_own_dedup_keys(
    queue: vr.Queue, clock: Clock
) -> None:
    """A dead job whose key another job took keeps the index to that job; an id
    in the dead set whose job is pending (restored by hand) keeps its job."""
    r, k = queue.client.redis, queue.keys
    gone = await dead_job(queue, Keyed(key="k"))
    holder = await queue.enqueue(Keyed(key="k"))
    stray = await queue.enqueue(Echo(text="x"))
    await r.zadd(k.dead, {stray: clock.ms})
    clock.ms += 1
    await send(queue, calls_ops.purge(k, queue.client._now_arg(), state="dead", keep_ms=0, batch=10))
    assert await queue.get(gone) is None
    assert await queue.enqueue(Keyed(key="k")) == holder
    assert (await queue.get(stray)).state == vr.JobState.PENDING  # type: ignore[union-attr]


def merge(queue: vr.Queue, holder: str, decision: str, field: str = "") -> calls.Call:
    normal = vr.Priority.NORMAL
    return calls.merge(
        queue.keys, queue.client._now_arg(), holder=holder, old_priority=normal, new_priority=normal,
        decision=decision, payload=b"\x81\xa3key\xa1z", carry_action="", carry=b"", by="new", dedup=field,
    )  # fmt: skip


async def test_a_merge_that_finds_its_job_claimed_changes_nothing(queue: vr.Queue, clock: Clock) -> None:
    """Dedup merges into a pending job only: a claim between the enqueue's read
    and its merge leaves the running job's task as its run read it."""
    job_id = await queue.enqueue(Keyed(key="k"))
    await claim(queue, "one")
    r, k = queue.client.redis, queue.keys
    before = await r.hgetall(k.job(job_id))
    assert calls.merged(await send(queue, merge(queue, job_id, "replace"))) is False
    assert await r.hgetall(k.job(job_id)) == before


async def test_a_throttle_check_answers_for_the_keys_holder_only(queue: vr.Queue, clock: Clock) -> None:
    """Decision `check`: a running throttled job that no longer holds its key
    (another took it) is not the enqueue's answer, and the key stays the other's."""
    running = await queue.enqueue(Throttled(key="k"))
    await claim(queue, "one")
    r, k = queue.client.redis, queue.keys
    (field,) = await r.hkeys(k.dedup)
    await r.hset(k.dedup, field, "another")
    assert calls.merged(await send(queue, merge(queue, running, "check", field.decode()))) is False
    assert await r.hget(k.dedup, field) == b"another"


async def test_a_pause_with_a_negative_delay_is_refused_by_the_script(queue: vr.Queue, clock: Clock) -> None:
    """The script checks its own argument (a caller that skipped the client's
    check): nothing is written, the run still holds its job."""
    await queue.enqueue(Echo(text="x"))
    job_id, token = await claim(queue, "one")
    call = ending(queue, "pause", job_id, token)
    call.args[4] = -5  # ARGV[5], the delay
    before = await queue.client.redis.hgetall(queue.keys.job(job_id))
    with pytest.raises(vr.ConfigurationError, match="pause delay must be a whole number"):
        await send(queue, call)
    assert await queue.client.redis.hgetall(queue.keys.job(job_id)) == before


async def test_a_resumed_job_leaves_suspended_and_a_second_suspend_drops_the_first_input(
    queue: vr.Queue, clock: Clock
) -> None:
    """A suspended job waits for a new resume: the value its last resume gave
    is not what its next run reads."""
    job_id = await queue.enqueue(Echo(text="x"))
    for n in (1, 2):
        _, token = await claim(queue, f"run{n}")
        assert await send(queue, ending(queue, "suspend", job_id, token, carry=b"")) == [1]
        assert await queue.client.redis.hget(queue.keys.job(job_id), "resume_input") is None
        assert await queue.resume(job_id, n) == 1
        assert await queue.client.redis.zscore(queue.keys.suspended, job_id) is None


async def test_a_job_leaving_pending_without_its_key_leaves_the_holders_entry(
    queue: vr.Queue, clock: Clock
) -> None:
    """Dedup: a job back in pending while another held its key runs as its own
    row; cancelling it does not take the key from the holder."""
    own_row = await queue.enqueue(Keyed(key="k"))
    _, token = await claim(queue, "one")
    holder = await queue.enqueue(Keyed(key="k"))
    assert (await send(queue, ending(queue, "release", own_row, token, carry=b"")))[0] == 1
    assert await queue.cancel(own_row) == "cancelled"
    assert await queue.enqueue(Keyed(key="k")) == holder


async def test_a_throttled_run_that_lost_its_key_dies_without_freeing_the_holders(
    queue: vr.Queue, clock: Clock
) -> None:
    """Throttle: a job that no longer holds its key frees no key when it dies."""
    job_id = await queue.enqueue(Throttled(key="k"))
    _, token = await claim(queue, "one")
    r, k = queue.client.redis, queue.keys
    (field,) = await r.hkeys(k.dedup)
    await r.hset(k.dedup, field, "another")
    assert await send(queue, ending(queue, "dead", job_id, token, carry=b"")) == [1]
    assert await r.hget(k.dedup, field) == b"another"


async def test_a_completed_job_trimmed_by_retention_leaves_the_expiring_index(
    queue: vr.Queue, clock: Clock
) -> None:
    """Retention: a trimmed job with a start deadline takes its `expiring`
    entry with it, not at its deadline (a day's deadline kept a day of them)."""
    job_id = await queue.enqueue(Echo(text="x"), expires=86_400)
    _, token = await claim(queue, "one")
    one = calls_ending.completion(job_id, token, "", b"", b"", b"")
    call = calls_ending.complete(queue.keys, queue.client._now_arg(), [one], max_kept="0")
    assert await send(queue, call) == [1]
    assert await queue.get(job_id) is None
    assert await queue.client.redis.zscore(queue.keys.expiring, job_id) is None
