"""Nothing left behind: whatever features a job used, its keys go once retention says so.

Every feature that writes keys is driven through a real worker on real Redis
with short retention; once the jobs finished and retention ran out (and the
reclaim ticks ran), the queue's keyspace (this test's own queue, SCANned on
the suite's server) must hold only what docs/redis-layout.md says stays, each
within its bound. And the worker's own containers keyed by what jobs carry
(kinds, ids) must not grow with the number of jobs run.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, make_worker
from tests.tasks import Counter

pytestmark = pytest.mark.anyio

SHORT = vr.Retention(completed=0.3, dead=0.3, cancelled=0.3, batch=500)


class Mail(vr.Task):
    KIND: ClassVar[str] = "lo.mail"
    to: str

    def limit_key(self) -> str | None:
        return self.to


class MailJob(Mail, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Plain(vr.Task[Counter]):
    """Completes, fails once, pauses once or dies, by `n`; reports progress."""

    KIND: ClassVar[str] = "lo.plain"
    n: int
    key: str | None = None
    okey: str | None = None

    def dedup_key(self) -> str | None:
        return self.key

    def order_key(self) -> str | None:
        return self.okey

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.001, cap=0.002)


class PlainJob(Plain, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Counter], state: Any) -> vr.Outcome:
        ctx.carry.n += 1
        if self.n % 7 == 0:
            await ctx.report_progress({"n": self.n})
        if self.n % 11 == 0:
            raise vr.TaskError.permanent("doomed")
        if self.n % 5 == 0 and ctx.carry.n == 1:
            raise RuntimeError("once")
        if self.n % 3 == 0 and ctx.carry.n == 1:
            return vr.Outcome.pause_in_with(0, "again")
        return vr.Outcome.completed_with("ok", result={"n": self.n})


class Throttled(vr.Task):
    KIND: ClassVar[str] = "lo.throttled"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    @classmethod
    def dedup_window(cls) -> float:
        return 0.2


class ThrottledJob(Throttled, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Debounced(vr.Task):
    KIND: ClassVar[str] = "lo.debounced"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    @classmethod
    def debounce(cls) -> float:
        return 0.05


class DebouncedJob(Debounced, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Step(vr.Task):
    KIND: ClassVar[str] = "lo.step"
    name: str


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.name == "fails":
            raise vr.TaskError.permanent("child failed")
        return vr.Outcome.completed_with("ok", result={"name": self.name})


class Approve(vr.Task):
    """Suspends until resumed (continuations), then completes."""

    KIND: ClassVar[str] = "lo.approve"
    RESUME: ClassVar[type[int]] = int
    n: int


class ApproveJob(Approve, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if ctx.resume_input is None:
            return vr.Outcome.suspend(output={"waiting": self.n}, note="awaiting")
        return vr.Outcome.completed_with("approved", result=ctx.resume_input)


class Bulk(vr.Task):
    KIND: ClassVar[str] = "lo.bulk"
    n: int


class BulkJob(Bulk, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 10

    @classmethod
    async def handle_batch(cls, items: Any, state: Any) -> Any:
        return [
            vr.TaskError.permanent("odd") if item.task.n % 2 else vr.Outcome.completed() for item in items
        ]


class Sleepy(vr.Task):
    """Runs long enough to be cancelled while it runs."""

    KIND: ClassVar[str] = "lo.sleepy"


class SleepyJob(Sleepy, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(2)
        return vr.Outcome.completed()


async def double(x: int) -> int:
    return 2 * x


HANDLERS = (MailJob, PlainJob, ThrottledJob, DebouncedJob, StepJob, ApproveJob, BulkJob, SleepyJob)


async def keyspace(redis: Any, queue: vr.Queue) -> dict[str, tuple[bytes, int]]:
    """Every key of the queue (this test's own: SCAN of its hash tag), with its type and size."""
    out: dict[str, tuple[bytes, int]] = {}
    size = {b"hash": redis.hlen, b"zset": redis.zcard, b"set": redis.scard, b"list": redis.llen}
    size |= {b"stream": redis.xlen}
    async for raw in redis.scan_iter(match=queue.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*"):
        kind = await redis.type(raw)
        n = await size[kind](raw) if kind in size else 1
        out[raw.decode()[len(queue.keys.prefix) :]] = (kind, n)
    return out


async def settle(
    queue: vr.Queue, *handlers: Any, seconds: float = 1.2, retention: vr.Retention = SHORT, **options: Any
) -> None:
    """Run a worker with short reclaim ticks for `seconds`: retention runs out, sweeps run."""
    options["retention"] = retention
    options.setdefault("lease", 1.5)  # a cancel of a running job is seen at the lease's renewal
    options.setdefault("reclaim_interval", 0.1)
    options.setdefault("poll_interval", 0.05)
    worker = make_worker(queue, *handlers, **options)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(seconds)
        worker.shutdown()


async def settle_until_trimmed(queue: vr.Queue, *handlers: Any) -> None:
    """`settle` until retention has trimmed every finished job (bounded), then one more sweep."""
    worker = make_worker(
        queue, *handlers, retention=SHORT, reclaim_interval=0.1, poll_interval=0.05, lease=1.5
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while (
                not await queue.is_drained() or (st := await queue.stats()).completed + st.dead + st.cancelled
            ):
                await anyio.sleep(0.1)
        await anyio.sleep(0.5)  # the throttle windows and offload snapshots (0.2, 0.3 s) pass; a sweep runs
        worker.shutdown()


async def test_a_per_key_rate_keeps_no_ring_once_its_window_closed(queue: vr.Queue) -> None:
    # 40 limit keys, each its own rate ring: before the fix every ring stayed
    # in limits:state for good (count + 1 fields a key ever limited). The
    # scripts run on this test's clock, so no window closes before it says.
    t = [1_900_000_000_000]
    q = vr.Client(queue.client.redis, clock=lambda: t[0], url=queue.client.url).queue(queue.name)
    redis = queue.client.redis
    await q.set_limit("lo.mail", concurrency=4, rate=vr.Rate(3, 1.0), per_key=True)
    await q.enqueue_many([Mail(to=f"user-{i % 40}") for i in range(80)])
    worker = make_worker(q, MailJob, retention=SHORT, reclaim_interval=3600, poll_interval=0.05)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert await redis.hlen(q.keys.limits_state) == 40 * 3  # two slots used and the next-slot field each
    # Their keys leave the rotation while the window is open: the rings wait
    # in limits:rings, none dropped early, and the rate still holds.
    await settle(q, MailJob, seconds=0.3)
    assert await redis.zcard(q.keys.limits_rings) == 40
    assert await redis.hlen(q.keys.limits_state) == 40 * 3
    await q.enqueue_many([Mail(to="user-1") for _ in range(2)])
    await settle(q, MailJob, seconds=0.3)
    assert (await q.stats()).limited == 1  # three starts in the window: the fourth waits
    t[0] += 1_500  # the windows close: the fourth starts, the reclaim drops the other keys' rings
    await settle(q, MailJob, seconds=0.5)
    assert (await q.stats()).limited == 0
    assert await redis.zrange(q.keys.limits_rings, 0, -1) == [b"lo.mail\t6:user-1\t#3"]
    assert await redis.hlen(q.keys.limits_state) == 4  # user-1's ring, its window open since the fourth start
    t[0] += 1_500
    await settle(q, MailJob, seconds=0.3)
    assert await redis.exists(q.keys.limits_state, q.keys.limits_rings) == 0


async def test_a_finished_job_with_a_start_deadline_leaves_the_index_when_trimmed(queue: vr.Queue) -> None:
    # The `expiring` index kept a finished job's entry until its deadline (an
    # hour here) however soon retention trimmed the job: a queue whose jobs
    # have a day's deadline held an entry for every job of the day.
    redis = queue.client.redis
    await queue.enqueue_many([Plain(n=1) for _ in range(40)], expires=3600)  # completed, trimmed in the call
    for i in (11, 22):  # dead, trimmed by the reclaim tick's purge
        await queue.enqueue(Plain(n=i), expires=3600)
    assert await redis.zcard(queue.keys.expiring) == 42
    await settle_until_trimmed(queue, *HANDLERS)
    assert await redis.exists(queue.keys.expiring) == 0


async def test_every_feature_leaves_only_the_documented_keys(queue: vr.Queue) -> None:
    client, redis = queue.client, queue.client.redis
    await queue.set_history(True)
    await queue.set_limit("lo.mail", concurrency=2, rate=vr.Rate(50, 0.2), per_key=True)
    await queue.schedule("every", Step(name="tick"), every=0.2)
    await queue.schedule("nightly", Step(name="n"), cron="@daily")
    off = vr.offload(queue=queue.name, kind="lo.double", retention=0.3)(double)
    handles = [await off.offload(client, i) for i in range(5)]
    await queue.enqueue_many([Mail(to=f"user-{i % 25}") for i in range(60)])
    ids = [
        await queue.enqueue(
            Plain(n=i, key=None if i % 2 else f"d{i % 40}", okey=f"o{i % 9}" if i % 2 else None)
        )
        for i in range(120)
    ]
    await queue.enqueue_many([Plain(n=1) for _ in range(5)], expires=3600)  # a start deadline
    for i in range(30):
        await queue.enqueue(Throttled(key=f"t{i % 10}"))
        await queue.enqueue(Debounced(key=f"b{i % 10}"))
    for i in range(4):
        await queue.enqueue_flow(
            Step(name=f"parent{i}"), [Step(name=f"c{i}"), Step(name="fails" if i == 1 else "ok")]
        )
    first = await queue.enqueue(Step(name="first"))
    await queue.enqueue(Step(name="after"), after=[first])
    late = await queue.enqueue(Plain(n=1), delay=60)
    assert await queue.update(late, priority="high")
    gone = await queue.enqueue(Plain(n=2), delay=60)
    await queue.cancel(gone)
    await queue.cancel(late)
    await queue.pause()
    await queue.resume_queue()
    assert await queue.pause_key("o1") is True
    assert await queue.resume_key("o1") is True
    approvals = [await queue.enqueue(Approve(n=i)) for i in range(5)]
    await queue.enqueue_many([Bulk(n=i) for i in range(30)])
    sleepy = await queue.enqueue(Sleepy())
    # A worker that dies holding its claims: the lease expires, the reclaim takes them back.
    await queue.enqueue_many([Plain(n=4) for _ in range(3)], priority="critical")
    assert len(claimed_jobs(await claim_raw(queue, 3, worker="gone", lease_ms=100))) == 3
    keep_dead = vr.Retention(completed=0.3, dead=60, cancelled=0.3)
    async with anyio.create_task_group() as tg:
        # The interval schedule fires meanwhile.
        tg.start_soon(functools.partial(settle, queue, *HANDLERS, off, seconds=1.5, retention=keep_dead))
        await anyio.sleep(0.5)
        assert await queue.cancel(sleepy) == "requested"
        for i, a in enumerate(approvals):
            assert await queue.resume(a, i) == 1
    states = [info.state if (info := await queue.get(a)) else None for a in approvals]
    assert set(states) <= {"completed", None}, states  # resumed, completed, maybe trimmed already
    assert await redis.zcard(queue.keys.running) == 0  # the abandoned claims were taken back
    assert await redis.zcard(queue.keys.suspended) == 0
    assert await queue.unschedule("every") is True
    assert await queue.retry_dead(kind="lo.plain")
    with anyio.fail_after(30):
        await make_worker(queue, *HANDLERS, off, retention=SHORT, lease=1.5).run(until_idle=True)
    # The offloads ran, and their snapshots expired after their 0.3 s retention.
    assert [await vr.read_result(client, h) for h in handles] == [None] * 5
    await settle_until_trimmed(queue, *HANDLERS, off)
    assert ids  # every job ran; now none of them may have left anything
    keys = await keyspace(redis, queue)
    # What stays (docs/redis-layout.md): the queue's switches, the event stream
    # (capped), the limits, the history (expiring), order:seq (a counter), the
    # worker index (an hour after its last worker), one schedule's keys.
    per_job = {
        k
        for k in keys
        if k.split(":")[0] in {"job", "journal", "deps", "dependents", "depresults", "offload"}
    }
    assert per_job == set()
    history = {k for k in keys if k.startswith("history:")}
    assert 1 <= len(history) <= 4  # this minute's and hour's (a minute or an hour may turn meanwhile)
    rest = {k: v for k, v in keys.items() if k not in history}
    assert set(rest) <= {
        "meta", "events", "limits", "order:seq", "workers", "schedules", "schedules:due", "schedule:nightly",
    }, rest  # fmt: skip
    assert rest["events"][1] <= 1_100
    assert rest["workers"][1] == 0 if "workers" in rest else True
    assert rest["schedules"][1] == rest["schedules:due"][1] == 1


# -- the worker's own memory -------------------------------------------------------------------------


class Picky(vr.Task):
    """Its backoff() raises, naming the job's own value."""

    KIND: ClassVar[str] = "lo.picky"
    n: int

    def backoff(self) -> vr.Backoff | None:
        raise KeyError(f"customer-{self.n}")


class PickyJob(Picky, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if ctx.run_count == 1:
            raise RuntimeError("once")  # the retry reads backoff()
        return vr.Outcome.completed()


async def test_a_task_method_that_raises_per_job_is_remembered_once(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker's "logged once" set of task slips was keyed by the message:
    # one entry (and one WARNING) per job whose message named its own values.
    from venturi_redis._worker import guarded

    guarded._warned.clear()
    await queue.enqueue_many([Picky(n=i) for i in range(60)])
    with anyio.fail_after(30):
        await make_worker(queue, PickyJob, retention=SHORT).run(until_idle=True)
    assert (await queue.stats()).completed == 60
    assert guarded._warned == {(PickyJob, "backoff", KeyError)}
    slips = [r.getMessage() for r in caplog.records if "(logged once)" in r.getMessage()]
    assert len(slips) == 1 and slips[0].startswith("PickyJob.backoff() raised KeyError: 'customer-"), slips


async def test_a_client_waiting_on_many_queues_keeps_a_bounded_number_of_readers(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A producer that waits on a queue per tenant kept one event-stream
    # reader per queue it ever waited on (Client._tails, for good).
    from venturi_redis._producer import tail

    monkeypatch.setattr(tail, "TAILS_KEPT", 4, raising=False)
    async with vr.Client.from_url(redis_server.url_with(socket_timeout=1.2)) as client:  # reads block 0.2 s

        async def wait_on(name: str) -> None:
            q = client.queue(name)
            job = await q.enqueue(Plain(n=1))
            with pytest.raises(TimeoutError):
                await q.wait(job, timeout=0.05)

        for burst in range(3):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(wait_on, f"lo-tenant-{uuid.uuid4().hex[:8]}-{burst}-{i}")
            await anyio.sleep(0.5)  # the readers stop: nothing waits any more
            assert not any(t.running for t in client._tails.values())
        # The readers of the first bursts went as new ones came: at most one burst's (all reading at once).
        assert len(client._tails) <= 6
