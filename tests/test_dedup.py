"""Deduplication: the indexed candidacy key and the content-aware merge under WATCH."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

import venturi_redis as vr
from tests.helpers import events, keys_matching, run_until_event
from venturi_redis._model.codec import pack_model
from venturi_redis._store import calls
from venturi_redis._store.keys import dedup_field
from venturi_redis._transport.fastpack import FastPackConnection
from venturi_redis._transport.lane import Lane

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
    details = journal[-1].details
    by = details.pop("by")
    assert details == {"decision": "replace", "priority": "high"}
    assert len(by) == 26 and by != a  # the merging enqueue's own id, not the job's
    assert await queue.get(by) is None  # a merge creates no job


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
    call = calls.claim(queue.keys, now, count=1, worker="probe", token_base="tok", default_lease_ms=60_000)
    await queue.client.sender.call(call)


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
    await client.sender.call(
        calls.release(
            queue.keys, "", job_id=a, token=token, priority=vr.Priority.NORMAL, carry=b"", note="released"
        ),
    )
    assert (await queue.get(a)).state == vr.JobState.PENDING  # type: ignore[union-attr]
    assert await index_of(client, queue, "refresh", "f") == b
    assert await queue.enqueue(Refresh(feed_id="f", urls=["u10"])) == b


async def test_a_job_the_claim_quarantines_frees_its_key(client: vr.Client, queue: vr.Queue) -> None:
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    await client.redis.hset(queue.keys.job(a), "created_at", "not a time")  # corrupt by hand
    await drain_one(queue, "")
    assert (await queue.get(a)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    # a dead job is no candidate: the key is free, and an enqueue makes a new row
    # (before, it kept pointing at the dead job: every enqueue of the key
    # re-read it until MergeConflictError)
    assert await index_of(client, queue, "refresh", "f") is None
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u2"]))
    assert b != a and await index_of(client, queue, "refresh", "f") == b


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
    names = {k.decode() for k in await keys_matching(client.redis, f"*{queue.name}*")}
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
    producers, per_producer, keys = 20, 100 if backend == "redis" else 40, 10
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


# -- the wire: round trips, WATCH, connections left behind --------------------------------------


def _command_names(packed: Any) -> list[str]:
    """The command names in one write (RESP arrays of bulk strings)."""
    data = packed if isinstance(packed, bytes) else b"".join(bytes(part) for part in packed)
    names, i = [], 0
    while i < len(data):
        end = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : end]), end + 2
        for n in range(count):
            end = data.index(b"\r\n", i)
            size, i = int(data[i + 1 : end]), end + 2
            if n == 0:
                names.append(data[i : i + size].decode().upper())
            i += size + 2
    return names


class Wire:
    """Records every write a connection sends: the connection and the commands in it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[tuple[AbstractConnection, list[str]]] = []
        self._hook: Callable[[], Awaitable[None]] | None = None
        self._lose_exec = ""
        self._writing: set[int] = set()  # the connections inside a recorded write (their id)
        for cls in (AbstractConnection, FastPackConnection):
            monkeypatch.setattr(cls, "send_packed_command", self._recording(cls.send_packed_command))
        # The enqueue lane writes to its transport itself once it reads its own replies.
        lane_send = Lane._send

        async def send(lane: Lane, data: bytes) -> Any:
            self.writes.append((lane._conn, _command_names(data)))
            return await lane_send(lane, data)

        monkeypatch.setattr(Lane, "_send", send)

    def names(self) -> list[list[str]]:
        return [names for _, names in self.writes]

    def watched(self) -> list[AbstractConnection]:
        return [conn for conn, names in self.writes if names[0] == "WATCH"]

    def once_after_watch_reply(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` once, just after the next WATCH's reply is read (before any reply behind it)."""
        self._hook = hook

    def once_lose_exec(self, when: str) -> None:
        """Fail the connection of the next MULTI/EXEC write: ``before`` it is sent, or ``after``
        (the server runs it, its reply is lost)."""
        self._lose_exec = when

    def _recording(self, original: Any) -> Any:
        async def send_packed_command(conn: AbstractConnection, command: Any, *args: Any, **kw: Any) -> Any:
            # Once per write, by the outermost recorder: a subclass's send may call its
            # base class's (FastPackConnection's, memory://'s connection class's, which
            # is not patched here: _transport/memory.py).
            if id(conn) in self._writing:
                return await original(conn, command, *args, **kw)
            self._writing.add(id(conn))
            try:
                names = _command_names(command)
                self.writes.append((conn, names))
                if names[0] == "WATCH" and self._hook is not None:
                    self._hook_next_read(conn, self._hook)
                    self._hook = None
                if names[-1] == "EXEC" and self._lose_exec:
                    when, self._lose_exec = self._lose_exec, ""
                    if when == "before":
                        raise RedisConnectionError("injected: the connection failed before EXEC went out")
                    self._fail_next_read(conn)
                return await original(conn, command, *args, **kw)
            finally:
                self._writing.discard(id(conn))

        return send_packed_command

    @staticmethod
    def _fail_next_read(conn: AbstractConnection) -> None:
        async def lost(*args: Any, **kw: Any) -> Any:
            del conn.read_response
            raise RedisConnectionError("injected: the connection failed before EXEC's reply came back")

        conn.read_response = lost  # type: ignore[method-assign]

    @staticmethod
    def _hook_next_read(conn: AbstractConnection, hook: Callable[[], Awaitable[None]]) -> None:
        read_response = conn.read_response

        async def read_then_hook(*args: Any, **kw: Any) -> Any:
            del conn.read_response
            reply = await read_response(*args, **kw)
            await hook()
            return reply

        conn.read_response = read_then_hook  # type: ignore[method-assign]


async def test_a_merge_is_three_round_trips_with_watch_first(
    queue: vr.Queue, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The enqueue script, WATCH with both reads, MULTI/EXEC (redis-py's own path on a cluster)."""
    a = await queue.enqueue(Count(key="k"), carry=Tally(n=1))
    assert await queue.enqueue(Count(key="k"), carry=Tally(n=1)) == a  # connections made, scripts loaded
    wire = Wire(monkeypatch)
    assert await queue.enqueue(Count(key="k"), carry=Tally(n=1)) == a
    watch_and_reads = (
        [["WATCH"], ["HGETALL"], ["XRANGE"]] if backend == "cluster" else [["WATCH", "HGETALL", "XRANGE"]]
    )
    assert wire.names() == [["EVALSHA"], *watch_and_reads, ["MULTI", "EVALSHA", "EXEC"]]
    # WATCH, the reads and MULTI/EXEC share one connection: that is what makes EXEC see a change.
    assert len({id(conn) for conn, _ in wire.writes[1:]}) == 1
    assert (await queue.get(a)).carry == {"n": 3}  # type: ignore[union-attr]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_merge_whose_exec_reply_is_lost_is_applied_once(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """``after``: the server ran EXEC and the reply was lost; asking ``merge`` again would count twice."""
    a = await queue.enqueue(Count(key="k"), carry=Tally(n=1))
    assert await queue.enqueue(Count(key="k"), carry=Tally(n=1)) == a  # merge.lua loaded
    wire = Wire(monkeypatch)
    wire.once_lose_exec(when)
    assert await queue.enqueue(Count(key="k"), carry=Tally(n=1)) == a
    assert not wire._lose_exec  # the fault was injected
    sent = [names for names in wire.names() if names[-1] == "EXEC"]
    assert len(sent) == (2 if when == "before" else 1)  # no second EXEC when the first went in
    assert (await queue.get(a)).carry == {"n": 3}  # type: ignore[union-attr]
    journal = await queue.journal(a)
    assert [e.event for e in journal] == ["enqueued", "merged", "merged"]
    assert journal[1].details["by"] != journal[2].details["by"]  # one entry per enqueue call


def _with_another_client(url: str, work: Callable[[vr.Client], Awaitable[None]]) -> None:
    """Run ``work`` on a client of its own, on a thread of its own, and wait for it."""

    async def main() -> None:
        other = vr.Client.from_url(url)
        try:
            await work(other)
        finally:
            await other.aclose()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(anyio.run, main).result()


async def test_a_change_between_the_reads_and_exec_makes_the_merge_retry(queue: vr.Queue, url: str) -> None:
    seen: list[int] = []

    class Racy(Count):
        KIND: ClassVar[str] = "count"

        def merge(self, existing: vr.Pending[Count, Tally]) -> vr.Merge[Count, Tally]:
            seen.append(existing.carry.n)
            if len(seen) == 1:
                # Another producer's merge lands after our reads, before our EXEC.
                async def bump(other: vr.Client) -> None:
                    await other.redis.hset(queue.keys.job(existing.job_id), "carry", pack_model(Tally(n=10)))

                _with_another_client(url, bump)
            return super().merge(existing)

    a = await queue.enqueue(Count(key="k"))
    # merge.lua loaded: a NOSCRIPT retry would re-check the hash and hide a lost WATCH.
    assert await queue.enqueue(Count(key="k")) == a
    assert await queue.enqueue(Racy(key="k")) == a
    assert seen == [1, 10]  # the first decision was not applied; the second saw the change
    assert (await queue.get(a)).carry == {"n": 11}  # type: ignore[union-attr]
    assert await events(queue, a) == ["enqueued", "merged", "merged"]


@pytest.mark.parametrize("interruption", ["cancelled", "error reply"])
async def test_a_merge_interrupted_between_two_replies_leaves_none_unread(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, interruption: str
) -> None:
    a = await queue.enqueue(Count(key="k"), carry=Tally(n=1))
    wire = Wire(monkeypatch)
    error_reply = interruption == "error reply"
    expected = pytest.raises(ResponseError, match="NOPERM") if error_reply else nullcontext()
    with anyio.CancelScope() as scope, expected:

        async def interrupt() -> None:
            # Here the replies to the reads are still unread.
            if error_reply:
                raise ResponseError("NOPERM (injected)")
            scope.cancel()
            await anyio.lowlevel.checkpoint()

        wire.once_after_watch_reply(interrupt)
        await queue.enqueue(Count(key="k"), carry=Tally(n=1))
    info = await queue.get(a)
    assert info is not None and info.carry == {"n": 1}  # nothing applied
    # The connection it used, taken as it is (as a pool that did not check would hand it
    # out): the next reply read on it is the next command's, not a leftover.
    (conn,) = wire.watched()
    await conn.send_command("PING")
    assert await conn.read_response() == b"PONG"
    assert await queue.enqueue(Count(key="k"), carry=Tally(n=1)) == a
    assert (await queue.get(a)).carry == {"n": 2}  # type: ignore[union-attr]


async def test_a_merge_that_applies_nothing_leaves_no_watch_behind(queue: vr.Queue) -> None:
    """A stale WATCH on a pooled connection would fail an unrelated MULTI/EXEC later."""
    a = await queue.enqueue(Refresh(feed_id="f", urls=["u1"]))
    b = await queue.enqueue(Refresh(feed_id="f", urls=["u2"], decision="independent"))
    assert b != a
    await queue.client.redis.hset(queue.keys.job(a), "note", "touched")
    assert await events(queue, a) == ["enqueued"]  # a MULTI/EXEC on the pooled connection
