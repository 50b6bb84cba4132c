"""Ordered keys (issue 40): ``Task.order_key()``, ``queue.pause_key`` / ``resume_key``.

Jobs of one queue with the same order key run one at a time, in enqueue
order. The key's holder is the one job of the key that may be pending,
running, retrying or suspended; the others wait in ``order:queue``, in no
pending set (lua/include/order.lua). A failed job that will retry keeps the
key; a job that ends for good (completed, dead, cancelled, expired) lets the
next one go. On redis, memory and cluster (CONTRACT_MODULES).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain
from venturi_redis._store import calls
from venturi_redis.testing import Clock

pytestmark = pytest.mark.anyio


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    """A queue on a client with a test clock, and that clock (the client closed after)."""
    clock = Clock()
    async with vr.Client.from_url(url, clock=clock) as client:
        yield client.queue(queue_name), clock


class Step(vr.Task):
    KIND: ClassVar[str] = "ordering.step"
    key: str | None = None
    n: int = 0
    fail_runs: int = 0  # the first runs that fail (retried)
    permanent: bool = False  # fails for good on its first run
    dedup: str | None = None

    def order_key(self) -> str | None:
        return self.key

    def dedup_key(self) -> str | None:
        return self.dedup


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        running: set[str] = state.setdefault("running", set())
        if self.key is not None:
            # Two jobs of one key at once is the violation this feature exists to prevent.
            assert self.key not in running, f"two jobs of {self.key} at once"
            running.add(self.key)
        try:
            await anyio.sleep(0.001)
            state.setdefault("ran", []).append((self.key, self.n, ctx.run_count))
            if self.permanent:
                raise vr.TaskError.permanent("no")
            if ctx.run_count <= self.fail_runs:
                raise RuntimeError("again")
        finally:
            running.discard(self.key or "")
        return vr.Outcome.completed()


class Deduped(Step):
    KIND: ClassVar[str] = "ordering.deduped"

    def dedup_key(self) -> str | None:
        return "d"


class Posting(vr.Task):
    KIND: ClassVar[str] = "ordering.posting"
    key: str
    n: int

    def order_key(self) -> str | None:
        return self.key


class PostingBatch(Posting, vr.BatchHandler[dict[str, Any]]):
    BATCH_SIZE: ClassVar[int] = 10

    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Posting]], state: dict[str, Any]
    ) -> Sequence[vr.Outcome | BaseException] | None:
        keys = [item.task.key for item in items]
        assert len(keys) == len(set(keys)), f"two jobs of one key in a batch: {keys}"
        state.setdefault("ran", []).extend((item.task.key, item.task.n) for item in items)
        return None


BAD_KEYS: list[Any] = ["", "x" * 1025, "é" * 513, "\ud800", 5, b"a"]


class Bad(Step):
    KIND: ClassVar[str] = "ordering.bad"
    i: int = 0

    def order_key(self) -> Any:
        return BAD_KEYS[self.i]


async def _claim(queue: vr.Queue, count: int = 100) -> list[tuple[str, str]]:
    return claimed_jobs(await claim_raw(queue, count))


async def _complete(queue: vr.Queue, job: tuple[str, str]) -> None:
    c = queue.client
    call = calls.complete(queue.keys, c._now_arg(), [calls.completion(job[0], job[1], "", b"", b"", b"")])
    assert list(await c.sender.call(call)) == [1]


async def _state(queue: vr.Queue, job_id: str) -> vr.JobInfo:
    info = await queue.get(job_id)
    assert info is not None
    return info


async def test_one_job_of_a_key_is_claimable_at_a_time_in_enqueue_order(queue: vr.Queue) -> None:
    a = [await queue.enqueue(Step(key="a", n=i)) for i in range(3)]
    b = await queue.enqueue_many([Step(key="b", n=i) for i in range(3)])
    free = await queue.enqueue(Step(n=9))
    counts = await queue.counts()
    assert counts["ordered"] == 4 and counts["pending"] == 7
    first = await _claim(queue)
    assert sorted(j[0] for j in first) == sorted([a[0], b[0], free])
    assert await _claim(queue) == []
    info = await _state(queue, a[1])
    assert info.order_key == "a" and info.order_waiting and info.state is vr.JobState.PENDING
    assert not (await _state(queue, a[0])).order_waiting
    seen: list[str] = []
    for _ in range(3):
        batch = [j for j in first if j[0] in (a + b)]
        for job in batch:
            await _complete(queue, job)
            seen.append(job[0])
        first = await _claim(queue)
    assert [x for x in seen if x in a] == a
    assert [x for x in seen if x in b] == b
    counts = await queue.counts()
    assert counts["ordered"] == 0 and counts["pending"] == 0 and counts["completed"] == 6
    assert counts["running"] == 1  # the job without a key, never completed here


async def test_workers_run_each_key_in_order_one_at_a_time(queue: vr.Queue) -> None:
    tasks = [Step(key=f"k{i % 4}", n=i) for i in range(40)] + [Step(n=i) for i in range(10)]
    await queue.enqueue_many(tasks)
    state: dict[str, Any] = {}
    await drain(queue, StepJob, state=state, concurrency=8)
    ran = state["ran"]
    assert len(ran) == 50
    for k in range(4):
        assert [n for key, n, _ in ran if key == f"k{k}"] == list(range(k, 40, 4))
    assert (await queue.counts())["completed"] == 50


async def test_a_job_that_will_retry_holds_its_key(queue: vr.Queue) -> None:
    await queue.enqueue(Step(key="a", n=0, fail_runs=2))
    await queue.enqueue(Step(key="a", n=1))
    state: dict[str, Any] = {}
    await drain(queue, StepJob, state=state, concurrency=4)
    assert state["ran"] == [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("a", 1, 1)]


async def test_a_dead_job_releases_its_key(queue: vr.Queue) -> None:
    first = await queue.enqueue(Step(key="a", n=0, permanent=True))
    backstop = await queue.enqueue(Step(key="a", n=1, fail_runs=5), max_failures=2)
    await queue.enqueue(Step(key="a", n=2))
    state: dict[str, Any] = {}
    await drain(queue, StepJob, state=state, concurrency=4)
    assert [(n, run) for _, n, run in state["ran"]] == [(0, 1), (1, 1), (1, 2), (2, 1)]
    assert (await _state(queue, first)).state is vr.JobState.DEAD
    assert (await _state(queue, backstop)).state is vr.JobState.DEAD
    assert await queue.client.redis.hlen(queue.keys.order_held) == 0


async def test_a_cancelled_job_releases_its_key_and_a_cancelled_waiter_leaves_it(queue: vr.Queue) -> None:
    a = [await queue.enqueue(Step(key="a", n=i)) for i in range(4)]
    assert await queue.cancel(a[2]) == "cancelled"  # waiting: leaves the key's queue
    assert (await queue.counts())["ordered"] == 2
    assert await queue.cancel(a[0]) == "cancelled"  # the pending holder: a[1] goes
    got = await _claim(queue)
    assert [j[0] for j in got] == [a[1]]
    # A running holder cancelled by its worker's own ending: the next goes.
    assert await queue.cancel(a[1]) == "requested"
    c = queue.client
    call = calls.cancel(queue.keys, c._now_arg(), job_id=a[1], note="stop", token=got[0][1])
    await c.sender.call(call)
    assert [j[0] for j in await _claim(queue)] == [a[3]]
    assert (await _state(queue, a[2])).order_waiting is False


async def test_pause_key_holds_the_next_job_back_and_resume_key_lets_it_go(queue: vr.Queue) -> None:
    a = [await queue.enqueue(Step(key="a", n=i)) for i in range(3)]
    other = await queue.enqueue(Step(key="b"))
    assert await queue.pause_key("a") is True
    assert await queue.pause_key("a") is False
    assert [j[0] for j in await _claim(queue)] == [other]  # the pending holder was held back
    assert (await queue.counts())["ordered"] == 3
    assert (await _state(queue, a[0])).order_waiting
    late = await queue.enqueue(Step(key="a", n=3))
    assert await _claim(queue) == []
    assert await queue.resume_key("a") is True
    assert await queue.resume_key("a") is False
    got = await _claim(queue)
    assert [j[0] for j in got] == [a[0]]
    # Paused while its holder runs: the holder finishes, the next waits.
    await queue.pause_key("a")
    await _complete(queue, got[0])
    assert await _claim(queue) == []
    await queue.resume_key("a")
    got = await _claim(queue)
    assert [j[0] for j in got] == [a[1]]
    await _complete(queue, got[0])
    got = await _claim(queue)
    assert [j[0] for j in got] == [a[2]]
    await _complete(queue, got[0])
    assert [j[0] for j in await _claim(queue)] == [late]


async def test_a_retrying_holder_is_held_back_by_pause_key(queue: vr.Queue) -> None:
    first = await queue.enqueue(Step(key="a", n=0, fail_runs=1))
    second = await queue.enqueue(Step(key="a", n=1))
    # One run: it fails and waits for its retry (a 10-minute backoff).
    got = await _claim(queue)
    assert [j[0] for j in got] == [first]
    c = queue.client
    call = calls.retry(
        queue.keys, c._now_arg(), job_id=first, token=got[0][1], note="x", attachment=b"", carry=b"",
        priority=vr.Priority.NORMAL, base_ms=600_000, cap_ms=600_000, jitter=0.0, max_failures="none",
    )  # fmt: skip
    await c.sender.call(call)
    assert (await _state(queue, first)).state is vr.JobState.PENDING
    await queue.pause_key("a")
    await queue.resume_key("a")
    # Still the holder, still retrying later: the second waits behind it.
    info = await _state(queue, first)
    assert info.order_waiting is False and info.failures == 1
    assert (await _state(queue, second)).order_waiting


async def test_bad_order_keys_are_refused_with_nothing_written(queue: vr.Queue) -> None:
    for i in range(len(BAD_KEYS)):
        with pytest.raises(vr.ConfigurationError, match="order"):
            await queue.enqueue(Bad(i=i))
        with pytest.raises(vr.ConfigurationError, match="order"):
            await queue.enqueue_many([Step(key="ok"), Bad(i=i)])
    with pytest.raises(vr.ConfigurationError, match="order key and a dedup key"):
        await queue.enqueue(Deduped(key="a"))
    holder = await queue.enqueue(Step(n=1))
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.enqueue(Step(key="a"), after=[holder])
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.enqueue_flow(Step(), [Step(key="a")])
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.schedule("s", Step(key="a"), every=60)
    for value in ("", "x" * 1025, 5):
        with pytest.raises(vr.ConfigurationError):
            await queue.pause_key(value)  # type: ignore[arg-type]
    assert await queue.enqueue(Step(key="é" * 512)) != ""  # 1024 bytes: the most
    counts = await queue.counts()
    assert counts["pending"] == 2 and counts["ordered"] == 0


async def test_expiry_releases_a_key_and_drops_a_waiter(timed: tuple[vr.Queue, Clock]) -> None:
    queue, clock = timed
    first = await queue.enqueue(Step(key="a", n=0), expires=1)
    waiter = await queue.enqueue(Step(key="a", n=1), expires=1)
    last = await queue.enqueue(Step(key="a", n=2))
    clock.advance(2)
    # The reclaim's sweep ends the waiter; the claim ends the holder.
    await queue.store.reclaim(batch=100, max_failures="25")
    assert (await _state(queue, waiter)).state is vr.JobState.DEAD
    assert (await _state(queue, first)).state is vr.JobState.DEAD
    assert [j[0] for j in await _claim(queue)] == [last]
    # The claim's own expiry ending (no sweep first) lets the next go too.
    held = await queue.enqueue(Step(key="b", n=0), expires=1)
    nxt = await queue.enqueue(Step(key="b", n=1))
    clock.advance(2)
    assert await _claim(queue) == []  # it reached the expired holder first
    assert (await _state(queue, held)).state is vr.JobState.DEAD
    assert await _claim(queue) == []  # its key is let go by the reclaim's next sweep
    await queue.store.reclaim(batch=100, max_failures="25")
    assert [j[0] for j in await _claim(queue)] == [nxt]


async def test_a_reclaimed_holder_keeps_its_key_and_its_backstop_death_frees_it(
    timed: tuple[vr.Queue, Clock],
) -> None:
    queue, clock = timed
    first = await queue.enqueue(Step(key="a", n=0), lease=1)
    second = await queue.enqueue(Step(key="a", n=1))
    assert [j[0] for j in await _claim(queue)] == [first]
    clock.advance(2)
    await queue.store.reclaim(batch=100, max_failures="2")
    assert (await _state(queue, first)).state is vr.JobState.PENDING
    assert [j[0] for j in await _claim(queue)] == [first]  # its retry, still the holder
    clock.advance(2)
    await queue.store.reclaim(batch=100, max_failures="2")
    assert (await _state(queue, first)).state is vr.JobState.DEAD
    assert [j[0] for j in await _claim(queue)] == [second]


async def test_an_operators_retry_of_a_dead_job_joins_its_key_at_the_end(queue: vr.Queue) -> None:
    first = await queue.enqueue(Step(key="a", n=0, permanent=True))
    state: dict[str, Any] = {}
    await drain(queue, StepJob, state=state)
    second = await queue.enqueue(Step(key="a", n=1))
    assert await queue.retry(first)
    assert (await _state(queue, first)).order_waiting
    assert [j[0] for j in await _claim(queue)] == [second]


async def test_a_damaged_order_key_stops_ordered_jobs_only(queue: vr.Queue) -> None:
    r = queue.client.redis
    await r.set(queue.keys.order_held, "x")
    with pytest.raises(vr.CorruptQueueError, match="order:held"):
        await queue.enqueue(Step(key="a"))
    with pytest.raises(vr.CorruptQueueError, match="order:held"):
        await queue.enqueue_many([Step(n=1), Step(key="a")])
    with pytest.raises(vr.CorruptQueueError, match="order:held"):
        await queue.pause_key("a")
    plain = await queue.enqueue(Step(n=2))
    assert (await queue.counts())["pending"] == 1
    assert [j[0] for j in await _claim(queue)] == [plain]
    # A holder that ends while the key is damaged leaves it held: resume_key
    # after the repair lets the next go.
    await r.delete(queue.keys.order_held)
    first = await queue.enqueue(Step(key="a", n=0))
    second = await queue.enqueue(Step(key="a", n=1))
    got = await _claim(queue)
    assert [j[0] for j in got] == [first]
    await r.set(queue.keys.order_seq, "not a number")
    await _complete(queue, got[0])
    await r.delete(queue.keys.order_seq)
    assert await _claim(queue) == []
    assert await queue.resume_key("a") is False
    assert [j[0] for j in await _claim(queue)] == [second]


async def test_a_damaged_pending_set_leaves_the_key_held_and_the_batch_completes(queue: vr.Queue) -> None:
    first = await queue.enqueue(Step(key="a", n=0))
    second = await queue.enqueue(Step(key="a", n=1), priority="low")
    other = await queue.enqueue(Step(n=2))
    got = await _claim(queue)
    assert sorted(j[0] for j in got) == sorted([first, other])
    r = queue.client.redis
    await r.set(queue.keys.pending(vr.Priority.LOW), "x")
    c = queue.client
    call = calls.complete(
        queue.keys, c._now_arg(), [calls.completion(j, t, "", b"", b"", b"") for j, t in got]
    )
    assert list(await c.sender.call(call)) == [1, 1]  # both complete; the key stays held
    assert (await _state(queue, second)).order_waiting
    await r.delete(queue.keys.pending(vr.Priority.LOW))
    assert await queue.resume_key("a") is False
    assert [j[0] for j in await _claim(queue)] == [second]


async def test_the_sync_face_pauses_and_resumes_a_key(url: str, queue_name: str) -> None:
    with vr.SyncClient(url) as client:
        queue = client.queue(queue_name)
        queue.enqueue(Step(key="a"))
        assert queue.pause_key("a") is True
        assert queue.counts()["ordered"] == 1
        assert queue.resume_key("a") is True
        assert queue.counts()["ordered"] == 0


async def test_a_sharded_queue_keeps_each_key_in_one_partition(client: vr.Client, queue_name: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=3)
    ids = await sharded.enqueue_many([Step(key=f"k{i % 5}", n=i) for i in range(30)])
    for k in range(5):
        homes = {(await sharded.get(j)).queue for j in ids[k::5]}  # type: ignore[union-attr]
        assert len(homes) == 1
    assert (await sharded.counts())["ordered"] == 25
    assert await sharded.pause_key("k0") is True
    assert (await sharded.counts())["ordered"] == 26
    assert await sharded.resume_key("k0") is True
    state: dict[str, Any] = {}
    await drain(sharded.partitions, StepJob, state=state, concurrency=8)
    for k in range(5):
        assert [n for key, n, _ in state["ran"] if key == f"k{k}"] == list(range(k, 30, 5))


async def test_job_show_and_the_dashboard_name_the_order_key(queue: vr.Queue, backend: str) -> None:
    from venturi_redis.dashboard._data import Redaction, job_dict

    first = await queue.enqueue(Step(key="acct-42"))
    second = await queue.enqueue(Step(key="acct-42"))
    third = await queue.enqueue(Step(key="acct-42"))
    other = await queue.enqueue(Step(key="acct-7"))
    doc = job_dict(await _state(queue, second), Redaction())
    assert (doc["order_key"], doc["order_waiting"], doc["order_position"]) == ("acct-42", True, 1)
    doc = job_dict(await _state(queue, first), Redaction())
    assert (doc["order_key"], doc["order_waiting"], doc["order_position"]) == ("acct-42", False, 0)
    assert [(await _state(queue, j)).order_position for j in (third, other)] == [2, 0]
    httpx = pytest.importorskip("httpx")
    from venturi_redis.dashboard import create_app

    transport = httpx.ASGITransport(app=create_app(queue.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
        page = await h.get(f"/queues/{queue.name}/jobs/{second}")
        assert page.status_code == 200, page.text[-2000:]
        assert "position 1 in its key's line: 1 job of its key ahead" in page.text
        page = await h.get(f"/queues/{queue.name}/jobs/{third}")
        assert "position 2 in its key's line: 2 jobs of its key ahead" in page.text
        page = await h.get(f"/queues/{queue.name}/jobs/{first}")
        assert "acct-42 (holds its key" in page.text
    if backend == "redis":
        from typer.testing import CliRunner

        from venturi_redis.cli.commands import app

        args = ["job", "show", second, "--redis", _redis_url(queue), "-q", queue.name]
        show = await anyio.to_thread.run_sync(CliRunner().invoke, app, args)  # the CLI runs its own loop
        assert show.exit_code == 0, show.output
        assert "acct-42 (position 1 in its key's line)" in show.output
    # The holder finishes: each moves up one place.
    (job,) = await _claim(queue, 1)
    assert job[0] == first
    await _complete(queue, job)
    assert (await _state(queue, first)).order_position is None  # finished: in no line
    assert [(await _state(queue, j)).order_position for j in (second, third)] == [0, 1]


def _redis_url(queue: vr.Queue) -> str:
    kw = queue.client.redis.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


async def test_update_keeps_a_waiting_job_in_its_keys_line(queue: vr.Queue) -> None:
    first = await queue.enqueue(Step(key="a", n=0))
    second = await queue.enqueue(Step(key="a", n=1))
    assert await queue.update(second, priority="critical", delay=0)
    info = await _state(queue, second)
    assert info.order_waiting and info.priority is vr.Priority.CRITICAL
    assert [j[0] for j in await _claim(queue)] == [first]  # not the critical one: it waits its turn
    with pytest.raises(vr.ConfigurationError, match="order key"):
        await queue.update(second, task=Step(n=3, dedup="d"))
    got = await queue.update(second, task=Step(key="a", n=4))
    assert got and (await _state(queue, second)).order_waiting


async def test_a_batch_handler_gets_one_job_of_a_key_at_a_time_in_order(queue: vr.Queue) -> None:
    await queue.enqueue_many([Posting(key=f"k{i % 3}", n=i) for i in range(12)])
    state: dict[str, Any] = {}
    await drain(queue, PostingBatch, state=state)
    for k in range(3):
        assert [n for key, n in state["ran"] if key == f"k{k}"] == list(range(k, 12, 3))
    assert (await queue.counts())["completed"] == 12


async def test_a_key_a_claim_ended_keeps_the_queue_undrained_until_it_is_let_go(
    timed: tuple[vr.Queue, Clock],
) -> None:
    # The claim ends an expired holder; its key is let go by the reclaim's
    # next sweep: until then the key's next job is runnable, not drained.
    queue, clock = timed
    await queue.enqueue(Step(key="b", n=0), expires=1)
    nxt = await queue.enqueue(Step(key="b", n=1))
    clock.advance(2)
    assert await _claim(queue) == []  # it reached the expired holder
    assert (await queue.counts())["ordered"] == 1
    assert await queue.is_drained() is False
    await queue.store.reclaim(batch=100, max_failures="25")
    assert await queue.is_drained() is False  # the next job is pending now
    assert [j[0] for j in await _claim(queue)] == [nxt]


async def test_until_idle_waits_for_a_key_a_claim_ended_and_runs_its_next_job(
    timed: tuple[vr.Queue, Clock],
) -> None:
    queue, clock = timed
    held = await queue.enqueue(Step(key="b", n=0), expires=1)
    nxt = await queue.enqueue(Step(key="b", n=1))
    paused = await queue.enqueue(Step(key="p", n=0))
    await queue.pause_key("p")
    clock.advance(2)
    state: dict[str, Any] = {}
    # The reclaim (every 0.05 s here) lets "b" go; "p" stays paused, and
    # the run still ends: its jobs cannot run until the key is resumed.
    await drain(queue, StepJob, state=state, reclaim_interval=0.05)
    assert state["ran"] == [("b", 1, 1)]
    assert (await _state(queue, held)).state is vr.JobState.DEAD
    assert (await _state(queue, nxt)).state is vr.JobState.COMPLETED
    assert (await _state(queue, paused)).state is vr.JobState.PENDING
    assert await queue.is_drained() is True


async def test_the_testing_drain_lets_an_ended_holders_key_go_and_leaves_a_paused_key(
    timed: tuple[vr.Queue, Clock],
) -> None:
    from venturi_redis.testing import drain as test_drain

    queue, clock = timed
    held = await queue.enqueue(Step(key="b", n=0), expires=1)
    nxt = await queue.enqueue(Step(key="b", n=1))
    await queue.enqueue(Step(key="p", n=0))
    await queue.pause_key("p")
    waiting = await queue.enqueue(Step(key="p", n=1))
    clock.advance(2)
    state: dict[str, Any] = {}
    with anyio.fail_after(20):
        report = await test_drain(queue, StepJob, state=state)
    assert [i.id for i in report.completed] == [nxt]
    assert [i.id for i in report.dead] == [held]
    assert (await _state(queue, waiting)).state is vr.JobState.PENDING
    assert (await queue.counts())["ordered"] == 2
    await queue.resume_key("p")
    with anyio.fail_after(20):
        report = await test_drain(queue, StepJob, state=state)
    assert [i.id for i in report.completed][-1] == waiting
