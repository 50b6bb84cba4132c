"""Deduplication: the indexed candidacy key and the content-aware merge under WATCH."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import events, run_until_event
from venturi_redis._keys import dedup_field

pytestmark = pytest.mark.anyio


class Seen(BaseModel):
    merges: int = 0
    fetched: list[str] = []


class Refresh(vr.Task[Seen]):
    """The issue's example: union the URLs of every pending refresh of one feed."""

    KIND: ClassVar[str] = "refresh"
    feed_id: str
    urls: list[str]
    decision: str = "with"  # which Merge the incoming task asks for (for the tests)
    urgent: bool = False

    def dedup_key(self) -> str | None:
        return self.feed_id

    def priority(self) -> vr.Priority:
        return vr.Priority.HIGH if self.urgent else vr.Priority.NORMAL

    def merge(self, existing: vr.Pending[Refresh, Seen]) -> vr.Merge[Refresh, Seen]:
        if self.decision == "keep":
            return vr.Merge.keep()
        if self.decision == "replace":
            return vr.Merge.replace()
        if self.decision == "independent":
            return vr.Merge.independent()
        if self.decision == "explode":
            raise LookupError(f"cannot merge into {existing.job_id}")
        union = sorted(set(existing.payload.urls) | set(self.urls))
        carry = existing.carry.model_copy(update={"merges": existing.carry.merges + 1})
        return vr.Merge.with_(
            Refresh(feed_id=self.feed_id, urls=union, urgent=self.urgent or existing.payload.urgent), carry
        )


class RefreshJob(Refresh, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[Seen], state: None) -> vr.Outcome:
        ctx.carry.fetched += self.urls
        if ctx.run_count == 1:
            return vr.Outcome.pause_in_with(3600, "first pass done")
        return vr.Outcome.completed()


async def index_of(client: vr.Client, queue: vr.Queue, kind: str, key: str) -> str | None:
    raw = await client.redis.hget(queue.keys.dedup, dedup_field(kind, key))
    return raw.decode() if raw else None


# -- the four decisions -------------------------------------------------------------------


async def test_no_candidate_creates_and_indexes(client: vr.Client, queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f1", urls=["u1"]))
    b = await queue.enqueue(Refresh(feed_id="f2", urls=["u2"]))
    assert a != b
    assert await index_of(client, queue, "refresh", "f1") == a
    info = await queue.get(a)
    assert info is not None and info.dedup == dedup_field("refresh", "f1")


async def test_keep_leaves_the_job_untouched_but_journals(queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]), carry=Seen(merges=5))
    before = await queue.get(a)
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u2"], decision="keep", urgent=True))
    after = await queue.get(a)
    assert b == a
    assert before is not None and after is not None
    assert (after.payload, after.carry, after.priority) == (before.payload, before.carry, before.priority)
    journal = await queue.journal(a)
    assert [e.event for e in journal] == ["enqueued", "merged"]
    assert journal[-1].details["decision"] == "keep"
    assert (await queue.counts())["pending"] == 1


async def test_replace_swaps_payload_and_resets_carry(client: vr.Client, queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]), carry=Seen(merges=5))
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u2"], decision="replace", urgent=True))
    info = await queue.get(a)
    assert b == a and info is not None
    assert info.payload["urls"] == ["u2"]
    assert info.carry is None  # reset to the default
    assert info.priority == vr.Priority.HIGH  # the incoming task's priority
    assert await client.redis.zscore(queue.keys.pending(vr.Priority.HIGH), a) is not None
    assert await client.redis.zscore(queue.keys.pending(vr.Priority.NORMAL), a) is None
    journal = await queue.journal(a)
    assert journal[-1].details == {"decision": "replace", "priority": "high"}


async def test_with_computes_payload_and_carry_and_moves_priority(client: vr.Client, queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u2", "u1"]))
    eligible = (await queue.get(a)).eligible_at  # type: ignore[union-attr]
    assert await queue.enqueue(Refresh(feed_id="f", urls=["u3", "u1"])) == a
    assert await queue.enqueue(Refresh(feed_id="f", urls=["u0"], urgent=True)) == a
    info = await queue.get(a)
    assert info is not None
    assert info.payload["urls"] == ["u0", "u1", "u2", "u3"]
    assert info.carry == {"merges": 2, "fetched": []}
    assert info.priority == vr.Priority.HIGH
    assert info.eligible_at == eligible  # a merge never changes when the job runs
    assert await client.redis.zscore(queue.keys.pending(vr.Priority.HIGH), a) is not None
    assert (await queue.counts())["pending"] == 1
    assert [e.details.get("decision") for e in await queue.journal(a)] == [None, "with", "with"]


async def test_independent_adds_a_row_and_the_index_follows_the_newest(
    client: vr.Client, queue: vr.Queue
) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u2"], decision="independent"))
    assert b != a
    assert await index_of(client, queue, "refresh", "f") == b
    assert (await queue.counts())["pending"] == 2
    assert await events(queue, a) == ["enqueued"]
    # the next collision merges into the newest
    assert await queue.enqueue(Refresh(feed_id="f", urls=["u3"])) == b
    # claiming the older job leaves the newer one's index entry alone
    await drain_one(queue)
    assert await index_of(client, queue, "refresh", "f") in (b, None)


async def drain_one(queue: vr.Queue, now: str = "") -> None:
    """Claim one job by hand (as a worker would), at ``now`` ms or the server's time."""
    await queue.client.scripts.call(
        queue.client.redis,
        "claim",
        queue.keys.claim,
        [queue.keys.prefix, now, 1, "probe", "tok", 60_000],
    )


async def test_merge_that_raises_writes_nothing(queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    with pytest.raises(LookupError, match=a):
        await queue.enqueue(Refresh(feed_id="f", urls=["u2"], decision="explode"))
    info = await queue.get(a)
    assert info is not None and info.payload["urls"] == ["u1"]
    assert await events(queue, a) == ["enqueued"]
    assert (await queue.counts())["pending"] == 1


async def test_merge_into_a_paused_job_that_already_ran(queue: vr.Queue) -> None:
    seen: dict[str, Any] = {}

    class Inspect(Refresh):
        KIND: ClassVar[str] = "refresh"

        def merge(self, existing: vr.Pending[Refresh, Seen]) -> vr.Merge[Refresh, Seen]:
            seen.update(
                run_count=existing.run_count,
                carry=existing.carry,
                journal=[e.event for e in existing.journal],
            )
            return super().merge(existing)

    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    await run_until_event(queue, a, "paused", RefreshJob)
    assert await queue.enqueue(Inspect(feed_id="f", urls=["u2"])) == a
    assert seen == {
        "run_count": 1,
        "carry": Seen(merges=0, fetched=["u1"]),
        "journal": ["enqueued", "claimed", "paused"],
    }
    info = await queue.get(a)
    assert info is not None
    assert info.carry == {"merges": 1, "fetched": ["u1"]}  # the run's progress survives the merge
    assert info.payload["urls"] == ["u1", "u2"]


# -- the index and its invariants -------------------------------------------------------------


async def test_claim_frees_the_key_and_a_returning_job_takes_it_back_only_if_free(
    client: vr.Client, queue: vr.Queue
) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    await run_until_event(queue, a, "paused", RefreshJob)
    # a paused the job with the key free: it is the candidate again
    assert await index_of(client, queue, "refresh", "f") == a
    # now claim it by hand (an hour on, when its pause is over): the key frees,
    # and a new enqueue makes a new row
    info = await queue.get(a)
    assert info is not None and info.eligible_at is not None
    await drain_one(queue, str(int(info.eligible_at.timestamp() * 1000) + 1))
    assert await index_of(client, queue, "refresh", "f") is None
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u9"]))
    assert b != a and await index_of(client, queue, "refresh", "f") == b
    # a comes back to pending (released) while b holds the key: b keeps it
    token = (await client.redis.hget(queue.keys.job(a), "lease_token")).decode()
    await client.scripts.call(
        client.redis,
        "release",
        [
            queue.keys.job(a),
            queue.keys.journal(a),
            queue.keys.running,
            queue.keys.pending(vr.Priority.NORMAL),
            queue.keys.dedup,
        ],
        [a, token, "", b"", "released", queue.keys.wake],
    )
    assert (await queue.get(a)).state == vr.JobState.PENDING  # type: ignore[union-attr]
    assert await index_of(client, queue, "refresh", "f") == b
    assert await queue.enqueue(Refresh(feed_id="f", urls=["u10"])) == b


async def test_batch_collisions_behave_like_one_by_one(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many(
        [
            Refresh(feed_id="f", urls=["a"]),
            Refresh(feed_id="g", urls=["x"]),
            Refresh(feed_id="f", urls=["b"]),
            Refresh(feed_id="f", urls=["c"], decision="replace"),
        ]
    )
    assert ids[0] == ids[2] == ids[3] != ids[1]
    info = await queue.get(ids[0])
    assert info is not None and info.payload["urls"] == ["c"] and info.carry is None
    assert [e.details.get("decision") for e in await queue.journal(ids[0])] == [None, "with", "replace"]
    assert (await queue.counts())["pending"] == 2


@pytest.mark.parametrize(
    "key",
    [
        "{hash}tag",
        "a:b",
        "*",
        "multi\nline",
        "tab\there",
        "ünïcødé",
        "x" * 1024,
        "venturi:{other}:job:1",
        "3:a:b",
    ],
)
async def test_awkward_keys_are_stored_safely_and_looked_up_exactly(
    client: vr.Client, queue: vr.Queue, key: str
) -> None:
    a = await queue.enqueue(Refresh(feed_id=key, urls=["1"]))
    assert await queue.enqueue(Refresh(feed_id=key, urls=["2"])) == a
    other = key[:-1] + ("y" if key[-1] != "y" else "z")
    assert await queue.enqueue(Refresh(feed_id=other, urls=["3"])) != a
    assert await index_of(client, queue, "refresh", key) == a
    # the key never becomes part of a key name: the queue's keys are all there is
    names = {k.decode() for k in await client.redis.keys(f"*{queue.name}*")}
    assert all(n.startswith(queue.keys.prefix) for n in names)


async def test_fields_of_different_kinds_never_collide() -> None:
    assert dedup_field("a", "b:c") != dedup_field("a:b", "c")
    assert dedup_field("3:a", "b") != dedup_field("3", "a:b")


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("", vr.ConfigurationError),
        ("x" * 1025, vr.ConfigurationError),
        ("\ud800", vr.ConfigurationError),
        (42, vr.TaskDefinitionError),
    ],
)
async def test_bad_keys_are_rejected_before_redis(queue: vr.Queue, key: Any, error: type[Exception]) -> None:
    class Odd(vr.Task):
        KIND: ClassVar[str] = "odd"

        def dedup_key(self) -> Any:
            return key

    with pytest.raises(error):
        await queue.enqueue(Odd())
    assert (await queue.counts())["pending"] == 0


# -- races ---------------------------------------------------------------------------------------


class Tally(BaseModel):
    n: int = 0


class Count(vr.Task[Tally]):
    KIND: ClassVar[str] = "count"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Count, Tally]) -> vr.Merge[Count, Tally]:
        return vr.Merge.with_(self, Tally(n=existing.carry.n + 1))


async def test_concurrent_producers_lose_no_update(queue: vr.Queue, backend: str) -> None:
    producers, per_producer, keys = 20, 200 if backend == "redis" else 60, 10
    sent: dict[str, int] = dict.fromkeys((f"k{i}" for i in range(keys)), 0)
    finished = 0

    async def producer(seed: int) -> None:
        nonlocal finished
        rng = random.Random(seed)
        for _ in range(per_producer):
            key = f"k{rng.randrange(keys)}"
            sent[key] += 1
            await queue.enqueue(Count(key=key), carry=Tally(n=1))
        finished += 1

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for p in range(producers):
                tg.start_soon(producer, p)
    assert finished == producers
    counts = await queue.counts()
    assert counts["pending"] == keys
    for key, n in sent.items():
        job_id = (await queue.client.redis.hget(queue.keys.dedup, dedup_field("count", key))).decode()
        info = await queue.get(job_id)
        assert info is not None and info.carry == {"n": n}, key


async def test_merge_racing_a_claim_lands_exactly_once(queue: vr.Queue) -> None:
    outcomes = {"merged": 0, "new_row": 0}
    for round_ in range(40):
        key = f"race-{round_}"
        first = await queue.enqueue(Count(key=key), carry=Tally(n=1))
        result: dict[str, str] = {}

        async def enqueue(k: str = key, result: dict[str, str] = result) -> None:
            result["id"] = await queue.enqueue(Count(key=k), carry=Tally(n=1))

        async with anyio.create_task_group() as tg:
            tg.start_soon(enqueue)
            tg.start_soon(drain_one, queue)
        journal = [e.event for e in await queue.journal(first)]
        if result["id"] == first:
            # merged before the claim: the claimed job carries both enqueues
            assert journal == ["enqueued", "merged", "claimed"]
            assert (await queue.get(first)).carry == {"n": 2}  # type: ignore[union-attr]
            outcomes["merged"] += 1
        else:
            # the claim won: the enqueue made a new pending row, the claimed job saw no merge
            assert journal == ["enqueued", "claimed"]
            new = await queue.get(result["id"])
            assert new is not None and new.state == vr.JobState.PENDING and new.carry == {"n": 1}
            outcomes["new_row"] += 1
        await queue.client.redis.delete(queue.keys.running)  # keep rounds independent
        await queue.client.redis.delete(*queue.keys.pending_high_first)
    assert sum(outcomes.values()) == 40


async def test_merge_after_a_script_flush_asks_merge_once(client: vr.Client, queue: vr.Queue) -> None:
    """NOSCRIPT inside MULTI applied nothing: the same decision is applied, merge() not asked again."""
    calls: list[str] = []

    class Once(vr.Task):
        KIND: ClassVar[str] = "once_merge"
        key: str = "k"
        n: int = 0

        def dedup_key(self) -> str | None:
            return self.key

        def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
            calls.append(existing.job_id)
            return vr.Merge.replace()

    first = await queue.enqueue(Once(n=1))
    await client.redis.script_flush()
    assert await queue.enqueue(Once(n=2)) == first
    assert calls == [first]
    info = await queue.get(first)
    assert info is not None and info.payload["n"] == 2
    assert (await events(queue, first))[-1] == "merged"
