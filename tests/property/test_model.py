"""Scenario 7: the state machine, model-checked against real Redis.

A hypothesis ``RuleBasedStateMachine`` drives the Lua transitions directly,
the way the worker does (``tests/chaos/driver.py``), with a controlled clock,
and keeps a plain Python model of what every job should be. Rules: enqueue
(with and without a dedup key, so merges happen), claim, complete, fail,
pause, release, suspend, resume, dead, an operator's cancel and retry of
dead jobs, queue pause, lease renewal, lease expiry and reclaim, and stale
outcomes from a lease that is gone.

After every step, on the real keys:

* each job's hash state equals the model's, and the job sits in exactly the
  one index its state names (its own priority's pending set when pending);
* the dedup index equals the model's and only points at pending jobs;
* no running job lacks a lease (token, expiry, and a running score equal to
  the expiry);
* each job's journal is a path through the state machine
  (docs/state-machine.md), ending in the job's current state.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import venturi_redis as vr
from tests.chaos.driver import Clock, Driver
from tests.servers import RedisServer
from venturi_redis._model.records import JOURNAL_FIELDS, journal_from
from venturi_redis._store.keys import dedup_field

LONG = os.environ.get("VENTURI_LONG", "") not in ("", "0")
LEASE_MS = 1000
MAX_FAILURES = 2
PRIORITIES = ["critical", "high", "normal", "low"]
HAS_CANCEL = hasattr(vr.Queue, "cancel")
HAS_RETRY_DEAD = hasattr(vr.Queue, "retry_dead")
# Paths the run went through, counted over all examples: the test asserts the
# interesting ones were reached, so it cannot pass by exploring nothing.
SEEN: Counter[str] = Counter()


def event(what: str) -> None:
    SEEN[what] += 1
    hypothesis_event(what)


class Plain(vr.Task):
    KIND: ClassVar[str] = "model.plain"
    n: int = 0


class Keyed(vr.Task):
    """Dedup by ``key``; the default merge replaces the pending payload."""

    KIND: ClassVar[str] = "model.keyed"
    key: str
    n: int = 0

    def dedup_key(self) -> str | None:
        return self.key


@dataclass
class MJob:
    id: str
    state: str
    prio: str
    eligible: int
    field: str = ""
    token: str = ""
    expires: int = 0
    failures: int = 0
    flagged: bool = False  # cancel requested while running
    died: int = 0  # when it went dead (its score in the dead set)


# Each journal event: the states it may follow, and the state it leads to.
# "failed" and "expired" are the moments after a failed run / a reclaimed
# lease: the job is back in pending unless a "dead" follows at once.
_AFTER_PENDING = {"pending", "failed", "expired"}
TRANSITIONS: dict[str, tuple[set[str | None], str | None]] = {
    "enqueued": ({None}, "pending"),
    "merged": (_AFTER_PENDING, None),
    "claimed": (_AFTER_PENDING, "running"),
    "completed": ({"running"}, "completed"),
    "paused": ({"running"}, "pending"),
    "released": ({"running"}, "pending"),
    "failed": ({"running"}, "failed"),
    "lease_expired": ({"running"}, "expired"),
    "dead": ({"running", "failed", "expired"}, "dead"),
    "suspended": ({"running"}, "suspended"),
    "resumed": ({"suspended"}, "pending"),
    "cancel_requested": ({"running"}, None),
    "cancelled": (_AFTER_PENDING | {"suspended", "running"}, "cancelled"),
    "retried": ({"dead"}, "pending"),
    "refused": (
        {"pending", "failed", "expired", "running", "suspended", "completed", "dead", "cancelled"},
        None,
    ),
}


def walk(events: list[str]) -> str:
    """The state a journal leads to; raises AssertionError on a step the machine forbids."""
    if not events:
        # Enqueue writes no stream: the first journaled event writes `enqueued`
        # first, so only a job untouched since enqueue (pending) has none.
        return "pending"
    state: str | None = None
    for i, name in enumerate(events):
        assert name in TRANSITIONS, f"unknown journal event {name!r} in {events}"
        before, after = TRANSITIONS[name]
        assert state in before, f"{name!r} after {state!r} (entry {i}) in {events}"
        if after is not None:
            state = after
    assert state is not None
    return {"failed": "pending", "expired": "pending"}.get(state, state)


class QueueModel(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    url: ClassVar[str]
    serial: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.client: vr.Client = self.portal.call(self._connect)
        self.q = self.client.queue(f"model-{os.getpid()}-{next(self.serial)}")
        self.d = Driver(self.q, max_failures=str(MAX_FAILURES))
        self.jobs: dict[str, MJob] = {}
        self.index: dict[str, str] = {}  # dedup field -> job id
        self.stale: list[tuple[str, str]] = []  # (job id, a token that lost its lease)
        self.queue_paused = False
        self.tokens = itertools.count()

    async def _connect(self) -> vr.Client:
        import redis.asyncio as aioredis

        return vr.Client(aioredis.Redis.from_url(self.url), clock=self.clock)

    def teardown(self) -> None:
        self.portal.call(self.client.aclose)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.portal.call(fn, *args)

    # -- helpers ---------------------------------------------------------------

    def in_state(self, state: str) -> list[MJob]:
        return sorted((j for j in self.jobs.values() if j.state == state), key=lambda j: j.id)

    def to_pending(self, job: MJob, eligible: int) -> None:
        """Back to pending (pause, retry, release, reclaim, resume): the dedup key is
        taken back only if no other pending job holds it."""
        job.state, job.eligible, job.token, job.expires = "pending", eligible, "", 0
        if job.field and job.field not in self.index:
            self.index[job.field] = job.id
            event("dedup key taken back")
        elif job.field:
            event("dedup key held by another: runs as its own row")

    def leave_running(self, job: MJob) -> None:
        self.stale.append((job.id, job.token))
        job.token, job.expires = "", 0

    # -- producers -------------------------------------------------------------

    @rule(prio=st.sampled_from(PRIORITIES), delay=st.sampled_from([0, 0, 700]))
    def enqueue(self, prio: str, delay: int) -> None:
        job_id = self.run(lambda: self.q.enqueue(Plain(), priority=prio, delay=delay / 1000))
        self.jobs[job_id] = MJob(job_id, "pending", prio, self.clock.ms + delay)

    @rule(key=st.sampled_from(["a", "{b}", "c: *\n"]), prio=st.sampled_from(PRIORITIES))
    def enqueue_keyed(self, key: str, prio: str) -> None:
        field = dedup_field(Keyed.KIND, key)
        job_id = self.run(lambda: self.q.enqueue(Keyed(key=key), priority=prio))
        holder = self.index.get(field)
        if holder is not None:
            assert job_id == holder, "a pending job held the key: the task must merge into it"
            event("merged into a pending job")
            self.jobs[holder].prio = prio  # Merge.replace takes the incoming priority
        else:
            assert job_id not in self.jobs
            self.jobs[job_id] = MJob(job_id, "pending", prio, self.clock.ms, field=field)
            self.index[field] = job_id

    @rule(ms=st.sampled_from([5, 100, 400, 1000, 2500]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    # -- the worker's side -----------------------------------------------------

    @rule(count=st.integers(1, 3), queue_paused=st.sampled_from([False] * 5 + [True]))
    def claim(self, count: int, queue_paused: bool) -> None:
        """A claim; now and then on a queue an operator paused (it then resumes it)."""
        if queue_paused:
            self.run(self.q.pause)
            self.queue_paused = True
        token = f"t{next(self.tokens)}"
        got = self.run(self.d.claim, count, "model-worker", token, LEASE_MS)
        expected: list[str] = []
        if not self.queue_paused:
            now = self.clock.ms
            for level in PRIORITIES:
                eligible = sorted(
                    (
                        j
                        for j in self.jobs.values()
                        if j.state == "pending" and j.prio == level and j.eligible <= now
                    ),
                    key=lambda j: (j.eligible, j.id),
                )
                for job in eligible:
                    if len(expected) == count:
                        break
                    if job.flagged:
                        # (It takes none of the claim's places: the next eligible one does.)
                        # Cancelled while running, then sent back to pending: the
                        # claim finishes the cancel instead of running it again.
                        job.state = "cancelled"
                        event("claim finished a requested cancel")
                        if self.index.get(job.field) == job.id:
                            del self.index[job.field]
                        continue
                    expected.append(job.id)
                    job.state, job.expires = "running", now + LEASE_MS
                    job.token = f"{token}.{len(expected)}"
                    if self.index.get(job.field) == job.id:
                        del self.index[job.field]
        assert [i for i, _ in got] == expected
        for job_id, tok in got:
            assert tok == self.jobs[job_id].token
        if self.queue_paused:
            event("claim on a paused queue")
            self.run(self.q.resume_queue)
            self.queue_paused = False

    @precondition(lambda self: bool(self.in_state("running")))
    @rule(
        data=st.data(),
        # "fail" three times: the retry backstop needs failures of one job in
        # a row, and the seeded run must reach it whatever the claim order.
        outcome=st.sampled_from(["complete", "fail", "fail", "fail", "pause", "release", "suspend", "dead"]),
    )
    def finish(self, data: st.DataObject, outcome: str) -> None:
        job = data.draw(st.sampled_from(self.in_state("running")))
        now = self.clock.ms
        if outcome == "complete":
            assert self.run(self.d.complete, job.id, job.token) == [1]
            self.leave_running(job)
            job.state = "completed"
        elif outcome == "fail":
            # No backoff: the retried job is eligible at once, so the backstop
            # is reachable in a few steps (the delay itself is tested elsewhere).
            reply = self.run(lambda: self.d.retry(job.id, job.token, base_ms=0, cap_ms=0))
            self.leave_running(job)
            job.failures += 1
            if job.failures >= MAX_FAILURES:
                event("retry hit the backstop")
                assert reply[:2] == [1, b"dead"]
                job.state, job.died = "dead", now
            else:
                assert reply[:2] == [1, b"pending"]
                assert int(reply[2]) == 0
                self.to_pending(job, now + int(reply[2]))
        elif outcome == "pause":
            assert self.run(self.d.pause, job.id, job.token, 300) == [1, now + 300]
            self.leave_running(job)
            self.to_pending(job, now + 300)
        elif outcome == "release":
            assert self.run(self.d.release, job.id, job.token) == [1]
            self.leave_running(job)
            self.to_pending(job, now)
        elif outcome == "suspend":
            assert self.run(self.d.suspend, job.id, job.token) == [1]
            self.leave_running(job)
            job.state = "suspended"
        else:
            assert self.run(self.d.dead, job.id, job.token) == [1]
            self.leave_running(job)
            job.failures += 1
            job.state, job.died = "dead", now

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data(), outcome=st.sampled_from(["complete", "fail", "pause", "suspend", "dead"]))
    def stale_outcome(self, data: st.DataObject, outcome: str) -> None:
        """A worker whose lease is gone reports anyway: refused, nothing changes."""
        job_id, token = data.draw(st.sampled_from(self.stale))
        fn = {
            "complete": self.d.complete,
            "fail": self.d.retry,
            "pause": self.d.pause,
            "suspend": self.d.suspend,
            "dead": self.d.dead,
        }[outcome]
        reply = self.run(fn, job_id, token)
        assert reply[0] == 0, reply
        event("stale outcome refused")

    @precondition(lambda self: bool(self.in_state("running") or self.stale))
    @rule()
    def renew_leases(self) -> None:
        held = [(j.id, j.token) for j in self.in_state("running")]
        renewed = self.run(self.d.extend, held + self.stale[-3:], LEASE_MS)
        lost = renewed.lost + [f"cancel:{i}" for i in renewed.cancel_requested]
        for job in self.in_state("running"):
            job.expires = self.clock.ms + LEASE_MS
        expect = [i for i, _ in self.stale[-3:]]
        expect += [f"cancel:{j.id}" for j in self.in_state("running") if j.flagged]
        assert sorted(lost) == sorted(expect)

    @rule()
    def reclaim(self) -> None:
        """A reclaim sweep at the current time."""
        self._reclaim()

    @precondition(lambda self: bool(self.in_state("running")))
    @rule()
    def expire_leases(self) -> None:
        """Every lease held now runs out (its worker died), then a sweep."""
        self.clock.advance(LEASE_MS)
        self._reclaim()

    def _reclaim(self) -> None:
        now = self.clock.ms
        requeued, died, ids = self.run(self.d.reclaim)
        expired = sorted(
            (j for j in self.in_state("running") if j.expires <= now), key=lambda j: (j.expires, j.id)
        )
        assert ids == [j.id for j in expired]
        n_dead = 0
        for job in expired:
            self.leave_running(job)
            job.failures += 1
            if job.failures >= MAX_FAILURES:
                job.state, job.died = "dead", now
                n_dead += 1
                event("reclaim hit the backstop")
            else:
                self.to_pending(job, now)
        assert (requeued, died) == (len(expired) - n_dead, n_dead)

    @precondition(lambda self: bool(self.in_state("suspended")))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.in_state("suspended")))
        assert self.run(self.q.resume, job.id, {"input": 1}) == 1
        self.to_pending(job, self.clock.ms)

    @precondition(lambda self: HAS_CANCEL and bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """An operator's cancel (``queue.cancel``, lua/cancel.lua) of any job."""
        self._cancel(data.draw(st.sampled_from(sorted(self.jobs.values(), key=lambda j: j.id))))

    @precondition(lambda self: HAS_CANCEL and bool(self.in_state("running")))
    @rule(data=st.data())
    def cancel_running(self, data: st.DataObject) -> None:
        """The same, aimed at a running job: only requested, finished by its worker or a claim."""
        self._cancel(data.draw(st.sampled_from(self.in_state("running"))))

    def _cancel(self, job: MJob) -> None:
        result = self.run(self.q.cancel, job.id)
        if job.state in ("pending", "suspended"):
            assert result == "cancelled"
            if self.index.get(job.field) == job.id:
                del self.index[job.field]
            job.state = "cancelled"
        elif job.state == "running":
            assert result == "requested"
            job.flagged = True
        else:
            assert result == "finished"

    @precondition(lambda self: HAS_RETRY_DEAD and bool(self.in_state("dead")))
    @rule()
    def retry_dead(self) -> None:
        """An operator sends every dead job back to pending with a fresh failure budget."""
        moved = self.run(self.q.retry_dead)
        # Oldest death first (the dead set's order: a tie by id), so of two
        # dead jobs with one dedup key the one that died first takes it back.
        dead = sorted(self.in_state("dead"), key=lambda j: (j.died, j.id))
        assert moved == [j.id for j in dead]
        for job in dead:
            job.failures, job.flagged = 0, False
            self.to_pending(job, self.clock.ms)
        event("operator retried dead jobs")

    # -- what must always hold ---------------------------------------------------

    @invariant()
    def redis_matches_the_model(self) -> None:
        self.run(self._check)

    async def _check(self) -> None:
        r = self.client.redis
        k = self.q.keys
        indexes = {
            **{f"pending:{p}": k.pending(vr.Priority.parse(p)) for p in PRIORITIES},
            "running": k.running,
            "suspended": k.suspended,
            "completed": k.completed,
            "dead": k.dead,
            "cancelled": k.cancelled,
        }
        jobs = sorted(self.jobs.values(), key=lambda j: j.id)
        # One round trip for every job: its hash fields, its score in every index, its journal.
        pipe = r.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(k.job(job.id), "state", "priority", "lease_token", "lease_expires", "failures")
            for key in indexes.values():
                pipe.zscore(key, job.id)
            pipe.xrange(k.journal(job.id))
            pipe.hmget(k.job(job.id), *JOURNAL_FIELDS)
        pipe.hgetall(k.dedup)
        replies = await pipe.execute()
        per = 3 + len(indexes)
        for n, job in enumerate(jobs):
            h, *scores, stream, implied = replies[n * per : (n + 1) * per]
            # The journal as a reader shows it (what the hash says put back: records.py).
            journal = journal_from(stream, implied)
            state, prio, token, expires, failures = (v.decode() if v is not None else None for v in h)
            assert state == job.state, (job, state)
            assert prio == job.prio, (job, prio)
            assert int(failures or 0) == job.failures, (job, failures)
            where = {name: s for name, s in zip(indexes, scores, strict=True) if s is not None}
            want = f"pending:{job.prio}" if job.state == "pending" else job.state
            assert list(where) == [want], (job, where)
            if job.state == "pending":
                assert where[want] == job.eligible, (job, where)
            if job.state == "running":
                # No running job without a lease.
                assert token == job.token and token, (job, token)
                assert int(expires or 0) == job.expires == where["running"], (job, expires, where)
            else:
                assert not token, (job, token)
            events = [fields[b"event"].decode() for _, fields in journal]
            assert walk(events) == job.state, (job, events)
        index = {a.decode(): b.decode() for a, b in replies[-1].items()}
        assert index == self.index
        for holder in index.values():
            assert self.jobs[holder].state == "pending"  # and the hash agreed, above


# The long run's 300 sequences of 100 steps: ~6x the CI run's work (it took
# 275 s beside other suites on a 2-core machine, against 300 s).
@pytest.mark.timeout(1800 if LONG else 300)
def test_state_machine_against_a_model(redis_server: RedisServer) -> None:
    SEEN.clear()
    with start_blocking_portal(backend="asyncio") as portal:
        QueueModel.portal = portal
        QueueModel.url = redis_server.url
        run_state_machine_as_test(
            QueueModel,
            settings=settings(
                max_examples=300 if LONG else 80,
                stateful_step_count=100 if LONG else 60,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                database=None,
                # CI explores the same (seeded) sequences every run, so the
                # coverage asserted below is stable; VENTURI_LONG=1 explores anew.
                derandomize=not LONG,
            ),
        )
    print("MODEL paths:", dict(sorted(SEEN.items())))
    expected = {
        "merged into a pending job",
        "dedup key taken back",
        "dedup key held by another: runs as its own row",
        "retry hit the backstop",
        "reclaim hit the backstop",
        "stale outcome refused",
    }
    if HAS_CANCEL:
        expected.add("claim finished a requested cancel")
    if HAS_RETRY_DEAD:
        expected.add("operator retried dead jobs")
    assert expected <= set(SEEN), expected - set(SEEN)


def test_walk_rejects_impossible_journals() -> None:
    assert walk(["enqueued", "claimed", "failed", "dead"]) == "dead"
    assert walk(["enqueued", "claimed", "lease_expired", "claimed", "completed", "refused"]) == "completed"
    with pytest.raises(AssertionError):
        walk(["enqueued", "completed"])
    with pytest.raises(AssertionError):
        walk(["enqueued", "claimed", "completed", "claimed"])
    with pytest.raises(AssertionError):
        walk(["claimed"])
