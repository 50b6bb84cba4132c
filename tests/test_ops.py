"""Operations through the Python API: stats, listing, dead retry, cancel, queue pause, purge, retention."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Steps, StepsJob
from venturi_redis._model.endings import Released
from venturi_redis._producer import ops as _ops
from venturi_redis._producer import server as _server
from venturi_redis._worker import housekeeping

pytestmark = pytest.mark.anyio


class Waits(vr.Task):
    """Runs until its context says stop, then fails (a retryable error)."""

    KIND: ClassVar[str] = "waits"


class WaitsJob(Waits, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["started"].set()
        with anyio.fail_after(20):
            await ctx.cancelled()
        state["reason"] = ctx.cancel_reason
        raise RuntimeError("stopped on request")


class Asks(vr.Task):
    """Suspends, to be cancelled while it waits."""

    KIND: ClassVar[str] = "asks"


class AsksJob(Asks, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.suspend(output={"q": "approve?"})


async def wait_state(queue: vr.Queue, job_id: str, state: vr.JobState, timeout: float = 10) -> vr.JobInfo:
    with anyio.fail_after(timeout):
        while True:
            info = await queue.get(job_id)
            if info is not None and info.state == state:
                return info
            await anyio.sleep(0.02)


# -- stats -------------------------------------------------------------------------


async def test_stats_counts_priorities_delays_lag_and_throughput(client: vr.Client, queue_name: str) -> None:
    base = 1_900_000_000_000
    t = [base]
    c = vr.Client(client.redis, clock=lambda: t[0], url=client.url)
    q = c.queue(queue_name)
    await q.enqueue(Echo(text="a"), priority="high")
    await q.enqueue(Echo(text="b"), priority="high")
    await q.enqueue(Echo(text="c"), priority="low")
    await q.enqueue(Echo(text="later"), delay=60)
    t[0] = base + 5_000
    st = await q.stats()
    assert st.pending == {"critical": 0, "high": 2, "normal": 0, "low": 1}
    assert st.eligible == 3
    assert st.delayed == 1
    assert st.lag_seconds == pytest.approx(5.0)
    assert (st.running, st.suspended, st.completed, st.dead, st.cancelled) == (0, 0, 0, 0, 0)
    assert not st.paused

    worker = make_worker(q, EchoJob, check_eviction_policy=False)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            while (await q.stats()).completed < 3:
                await anyio.sleep(0.02)
            worker.shutdown()
    st = await q.stats()
    assert st.completed == 3
    assert st.completed_last_minute == 3
    assert st.delayed == 1 and st.eligible == 0 and st.lag_seconds == 0.0
    t[0] = base + 5_000 + 61_000  # a minute on, the delayed job is eligible and late
    st = await q.stats()
    assert st.completed_last_minute == 0
    assert st.pending["normal"] == 1 and st.delayed == 0
    assert st.lag_seconds == pytest.approx(6.0)
    assert st.to_dict()["pending"]["normal"] == 1


# -- queue pause -------------------------------------------------------------------------


async def test_pause_stops_claims_enqueues_still_land_resume_wakes(queue: vr.Queue) -> None:
    await queue.pause()
    assert (await queue.stats()).paused
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    worker = make_worker(queue, EchoJob)
    runner = worker._runners[0]
    _, nxt, jobs = await runner.claim(10)
    assert (nxt, jobs) == (-1, [])  # the claim script refuses while paused
    assert (await queue.stats()).eligible == 3  # enqueues landed
    await queue.resume_queue()
    assert not (await queue.stats()).paused
    await drain(queue, EchoJob)
    for jid in ids:
        assert (await queue.get(jid)).state == vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_running_jobs_finish_after_pause(queue: vr.Queue) -> None:
    state: dict[str, Any] = {"started": anyio.Event()}
    jid = await queue.enqueue(Waits())
    worker = make_worker(queue, WaitsJob, EchoJob, state=state, lease=0.3, poll_interval=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await state["started"].wait()
        await queue.pause()
        # Enqueued now, not before the worker started: a slow start would let
        # the first claim take it too. It comes due while the queue is paused.
        other = await queue.enqueue(Echo(text="x"), delay=0.2)
        # The running job keeps its lease; cancel it so it ends, while paused.
        assert await queue.cancel(jid) == "requested"
        await wait_state(queue, jid, vr.JobState.CANCELLED)
        await anyio.sleep(0.5)  # the delayed job is eligible now, but the queue is paused
        assert (await queue.get(other)).state == vr.JobState.PENDING  # type: ignore[union-attr]
        await queue.resume_queue()
        await wait_state(queue, other, vr.JobState.COMPLETED)
        worker.shutdown()


# -- dead letters ---------------------------------------------------------------------------


async def test_retry_dead_job_resets_failures_and_journals(queue: vr.Queue) -> None:
    jid = await queue.enqueue(Doomed())
    await drain(queue, DoomedJob)
    dead = await queue.get(jid)
    assert dead is not None and dead.state == vr.JobState.DEAD and dead.failures == 1
    assert await queue.retry(jid) is True
    info = await queue.get(jid)
    assert info is not None and info.state == vr.JobState.PENDING and info.failures == 0
    assert info.finished_at is None
    journal = await queue.journal(jid)
    assert journal[-1].event == "retried" and journal[-1].details["failures_before"] == "1"
    assert await queue.retry(jid) is False  # pending now: nothing to do
    assert await queue.retry("01J0000000000000000000NONE") is False
    st = await queue.stats()
    assert st.dead == 0 and st.eligible == 1


async def test_retry_dead_by_kind_and_limit(queue: vr.Queue) -> None:
    class Bad(vr.Task):
        KIND: ClassVar[str] = "bad"

    class BadJob(Bad, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
            raise vr.TaskError.permanent("no")

    doomed = await queue.enqueue_many([Doomed() for _ in range(3)])
    bad = await queue.enqueue(Bad())
    await drain(queue, DoomedJob, BadJob)
    assert (await queue.stats()).dead == 4
    first = await queue.retry_dead(kind="doomed", limit=2)
    assert first == doomed[:2]  # oldest death first
    rest = await queue.retry_dead(kind="doomed")
    assert rest == doomed[2:]
    assert (await queue.get(bad)).state == vr.JobState.DEAD  # type: ignore[union-attr]
    assert await queue.retry_dead() == [bad]
    assert await queue.retry_dead() == []


# -- cancel -----------------------------------------------------------------------------------


async def test_cancel_pending_suspended_finished_unknown(queue: vr.Queue) -> None:
    pend = await queue.enqueue(Echo(text="p"))
    assert await queue.cancel(pend) == "cancelled"
    info = await queue.get(pend)
    assert info is not None and info.state == vr.JobState.CANCELLED and info.finished_at is not None
    assert (await events(queue, pend))[-1] == "cancelled"
    assert await queue.cancel(pend) == "finished"
    assert await queue.cancel("01J0000000000000000000NONE") == "not_found"

    sus = await queue.enqueue(Asks())
    await drain(queue, AsksJob)
    assert (await queue.get(sus)).state == vr.JobState.SUSPENDED  # type: ignore[union-attr]
    assert await queue.cancel(sus) == "cancelled"
    assert await queue.resume(sus, "yes") == 0  # a cancelled job cannot be resumed
    st = await queue.stats()
    assert (st.suspended, st.cancelled, st.eligible) == (0, 2, 0)


async def test_cancel_releases_the_dedup_key(queue: vr.Queue) -> None:
    class Keyed(vr.Task):
        KIND: ClassVar[str] = "keyed"
        key: str

        def dedup_key(self) -> str | None:
            return self.key

    a = await queue.enqueue(Keyed(key="k"))
    assert await queue.cancel(a) == "cancelled"
    b = await queue.enqueue(Keyed(key="k"))
    assert b != a  # not merged into the cancelled job


async def test_cancel_running_job_asks_handler_to_stop_and_ends_cancelled(queue: vr.Queue) -> None:
    state: dict[str, Any] = {"started": anyio.Event()}
    jid = await queue.enqueue(Waits())
    worker = make_worker(queue, WaitsJob, state=state, lease=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await state["started"].wait()
        assert await queue.cancel(jid) == "requested"
        assert await queue.cancel(jid) == "requested"  # idempotent, journaled once
        info = await wait_state(queue, jid, vr.JobState.CANCELLED)
        worker.shutdown()
    assert state["reason"] == "cancelled by an operator"
    assert info.failures == 0  # the run's error became the cancel, not a failure
    assert info.note is not None and "stopped on request" in info.note
    evs = await events(queue, jid)
    assert evs.count("cancel_requested") == 1
    assert evs[-1] == "cancelled"
    st = await queue.stats()
    assert (st.running, st.cancelled, st.eligible, st.delayed) == (0, 1, 0, 0)


async def test_cancel_requested_run_that_ended_first_is_cancelled_at_claim(queue: vr.Queue) -> None:
    """The run failed before its worker saw the request: the job must not run again."""
    jid = await queue.enqueue(Echo(text="x"))
    worker = make_worker(queue, EchoJob)
    runner = worker._runners[0]
    _, _, jobs = await runner.claim(1)
    assert [j.id for j in jobs] == [jid]
    assert await queue.cancel(jid) == "requested"
    await worker._completer.finish(jobs[0], Released("shutdown"))  # the worker never renewed
    assert (await queue.get(jid)).state == vr.JobState.PENDING  # type: ignore[union-attr]
    _, _, again = await runner.claim(1)
    assert again == []
    info = await queue.get(jid)
    assert info is not None and info.state == vr.JobState.CANCELLED
    assert (await queue.stats()).cancelled == 1


# -- listing -----------------------------------------------------------------------------------


async def test_list_jobs_by_state_kind_and_limit(queue: vr.Queue) -> None:
    done = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    await drain(queue, EchoJob)
    low = await queue.enqueue(Echo(text="low"), priority="low")
    high = await queue.enqueue(Echo(text="high"), priority="high")
    steps = await queue.enqueue(Steps())
    pend = await queue.list_jobs(state="pending")
    assert [j.id for j in pend] == [high, steps, low]
    assert [j.id for j in await queue.list_jobs(state="pending", kind="steps")] == [steps]
    completed = await queue.list_jobs(state=vr.JobState.COMPLETED)
    assert [j.id for j in completed] == list(reversed(done))  # newest first
    assert len(await queue.list_jobs(limit=4)) == 4
    everything = await queue.list_jobs(limit=100)
    assert {j.id for j in everything} == {*done, low, high, steps}
    assert everything[0].payload == {"text": "high"}
    with pytest.raises(ValueError, match="nonsense"):
        await queue.list_jobs(state="nonsense")
    with pytest.raises(vr.ConfigurationError):
        await queue.list_jobs(limit=0)


# -- purge and retention ------------------------------------------------------------------------


async def test_purge_removes_hash_journal_and_index(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(5)])
    dead = await queue.enqueue(Doomed())
    await drain(queue, EchoJob, DoomedJob)
    redis = queue.client.redis
    assert await redis.exists(queue.keys.job(ids[0]), queue.keys.journal(ids[0])) == 2
    assert await queue.purge("completed") == 5
    for jid in ids:
        assert await redis.exists(queue.keys.job(jid), queue.keys.journal(jid)) == 0
        assert await queue.get(jid) is None
    st = await queue.stats()
    assert st.completed == 0 and st.dead == 1
    assert await queue.purge("dead", older_than=3600) == 0  # died just now
    assert await queue.purge("dead") == 1
    assert await queue.get(dead) is None
    with pytest.raises(vr.ConfigurationError, match="finished"):
        await queue.purge("pending")


async def test_retention_trims_by_age_in_bounded_batches(client: vr.Client, queue_name: str) -> None:
    base = 1_900_000_000_000
    t = [base]
    c = vr.Client(client.redis, clock=lambda: t[0], url=client.url)
    q = c.queue(queue_name)
    done = await q.enqueue_many([Echo(text=str(i)) for i in range(25)])
    dead = await q.enqueue(Doomed())
    await drain(q, EchoJob, DoomedJob)
    retention = vr.Retention(completed=10, dead=100, batch=4)
    t[0] = base + 9_000
    assert await _ops.trim(q, retention) == 0  # nothing old enough yet
    t[0] = base + 11_000
    # At most max_batches * batch per pass: a backlog is spread over passes.
    assert await _ops.trim(q, retention, max_batches=3) == 12
    assert await _ops.trim(q, retention) == 13
    assert (await q.stats()).completed == 0
    assert all([await q.get(j) is None for j in done])
    assert (await q.get(dead)) is not None  # dead jobs are kept longer
    t[0] = base + 101_000
    assert await _ops.trim(q, retention) == 1
    assert await q.client.redis.exists(q.keys.journal(dead)) == 0


async def test_worker_trims_on_its_reclaim_tick(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    worker = make_worker(
        queue, EchoJob, retention=vr.Retention(completed=0, dead=None), reclaim_interval=0.05
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while any([await queue.get(j) is not None for j in ids]):
                await anyio.sleep(0.02)
        worker.shutdown()
    assert (await queue.stats()).completed == 0


async def test_long_retention_is_trimmed_once_a_minute_not_every_tick(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default periods are days: an idle worker trims on its first tick, then after a minute."""
    passes: list[float] = []
    real = _ops.trim

    async def spy(q: vr.Queue, retention: vr.Retention, **kw: Any) -> int:
        passes.append(retention.periods_ms()["completed"])
        return await real(q, retention, **kw)

    monkeypatch.setattr(_ops, "trim", spy)
    reclaims = 0
    worker = make_worker(queue, EchoJob, reclaim_interval=0.02)
    assert worker.trim_interval == 60.0
    short = make_worker(queue, EchoJob, retention=vr.Retention(completed=0.1), reclaim_interval=0.02)
    assert short.trim_interval == pytest.approx(0.1)
    real_reclaim = housekeeping.reclaim

    async def counting(*args: Any) -> int:
        nonlocal reclaims
        reclaims += 1
        return await real_reclaim(*args)

    monkeypatch.setattr(housekeeping, "reclaim", counting)  # the worker's reclaim tick
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while reclaims < 10:
                await anyio.sleep(0.02)
        worker.shutdown()
    assert passes == [86_400_000]  # one trim pass, on the first of 10+ reclaim ticks


def test_retention_defaults_and_validation() -> None:
    r = vr.Retention()
    periods = r.periods_ms()
    assert periods["dead"] > periods["completed"] == 86_400_000
    assert vr.Retention(dead=None).periods_ms().keys() == {"completed", "cancelled"}
    with pytest.raises(vr.ConfigurationError):
        vr.Retention(completed=-1)
    with pytest.raises(vr.ConfigurationError):
        vr.Retention(batch=0)


# -- start-up checks --------------------------------------------------------------------------


async def test_worker_refuses_an_evicting_server_unless_told() -> None:
    with RedisServer("--maxmemory-policy", "allkeys-lru") as server:
        async with vr.Client.from_url(server.url) as c:
            q = c.queue("evict")
            await q.enqueue(Echo(text="x"))
            worker = make_worker(q, EchoJob)
            with pytest.raises(vr.ConfigurationError, match="maxmemory-policy allkeys-lru"):
                await worker.run(until_idle=True)
            assert (await q.stats()).eligible == 1  # nothing was claimed
            worker = make_worker(q, EchoJob, check_eviction_policy=False)
            with anyio.fail_after(10):
                await worker.run(until_idle=True)
            assert (await q.stats()).completed == 1


async def test_worker_refuses_a_server_below_the_minimum_version(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "MIN_REDIS_VERSION", (99, 0, 0))
    async with vr.Client.from_url(redis_server.url) as c:
        worker = make_worker(c.queue("old"), EchoJob)
        with pytest.raises(vr.ConfigurationError, match=r"needs Redis 99\.0\.0 or newer"):
            await worker.run(until_idle=True)


async def test_memory_backend_passes_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server, "MIN_REDIS_VERSION", (99, 0, 0))
    async with vr.Client.from_url("memory://checks") as c:
        await _server.check_server(c)


async def test_a_policy_config_cannot_read_is_read_from_info() -> None:
    """CONFIG renamed away (managed services): INFO memory says the policy (tests/test_managed_redis.py)."""
    with RedisServer("--rename-command", "CONFIG", "", "--maxmemory-policy", "volatile-lru") as server:
        async with vr.Client.from_url(server.url) as c:
            with pytest.raises(vr.ConfigurationError, match="maxmemory-policy volatile-lru"):
                await _server.check_server(c)
            await _server.check_server(c, eviction_policy=False)


# -- observer ---------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.claimed: list[tuple[str, str]] = []
        self.finished: list[tuple[str, str, str]] = []

    def job_claimed(self, queue: str, kind: str) -> None:
        self.claimed.append((queue, kind))

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.finished.append((queue, kind, outcome))


async def test_observer_sees_claims_and_outcomes(queue: vr.Queue) -> None:
    rec = Recorder()
    await queue.enqueue(Echo(text="x"))
    await queue.enqueue(Doomed())
    await queue.enqueue(Steps(steps=2))
    await drain(queue, EchoJob, DoomedJob, StepsJob, observer=rec)
    n = queue.name
    assert sorted(rec.finished) == sorted(
        [(n, "echo", "completed"), (n, "doomed", "dead"), (n, "steps", "paused"), (n, "steps", "completed")]
    )
    assert len(rec.claimed) == 4


async def test_cancelled_offload_settles_its_snapshot_as_failed(client: vr.Client, queue: vr.Queue) -> None:
    async def double(x: int) -> int:
        return 2 * x

    fn = vr.offload(queue=queue.name, kind="ops.double")(double)
    handle = await fn.offload(client, 21)
    assert await queue.cancel(handle.job_id) == "cancelled"
    res = await vr.resolve(client, handle, timeout=5)
    assert res.status == "failed"
    red = await vr.read_result_redacted(client, handle.key)
    assert red.status == "failed" and "cancelled" not in (red.error or "")
