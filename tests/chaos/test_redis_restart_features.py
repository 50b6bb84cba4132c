"""Scenario 4b: Redis SIGKILLed and restarted (appendonly, fsync always) while a
schedule fires, a limit holds and workflows wait (issue 38, the probe of a
restart with persistence while schedules, limits and flows are live).

Two workers in this process, on one client each, through the restarts:

- two schedules, every 200 ms and every second: the fire times from each
  one's first to its last are stood for by exactly one job each, tiled with
  neither gap nor overlap (a job's `fire_at` and `fires`, the next job's
  `fire_at` is where it ends). The fire times that fell while the server was
  down make no gap: the first fire after it is back is one job standing for
  them all, `fires` > 1 (docs/schedules.md, "After downtime"), none twice;
- a kind limited to 2 runs at once per key, and to 3 at once over its keys:
  the handlers count themselves and the caps are never exceeded; another
  kind limited to a rate of 4 starts a second: no window of a second holds
  more than 4 of its claims (by the claim times Redis wrote, each run's); at
  the end no slot is left held, `queue.limits()` says 0 running and 0
  waiting, and nothing is parked;
- workflows (a parent waiting on three children): every parent completes
  after its children, with each child's result (`ctx.dependency_results()`),
  none is left waiting;
- every acknowledged enqueue completes.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from typing import Any, ClassVar

import anyio
import pytest
from redis.exceptions import RedisError

import venturi_redis as vr
from tests.chaos.conftest import LONG, figures, reconnecting
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

RESTARTS = 6 if LONG else 2
EVERY = 0.2
SCHEDULES = {"tick": EVERY, "tick-1s": 1.0}  # schedule id -> its period, s
KEYS = ("a.example", "b.example", "c.example")
RATE = vr.Rate(4, 1)


class Load:
    """What the limited handlers see of themselves (one process: plain counters)."""

    running: ClassVar[Counter[str]] = Counter()
    total = 0
    worst_key = 0
    worst_total = 0


class Tick(vr.Task):
    KIND: ClassVar[str] = "chaos-tick"


class TickJob(Tick, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Send(vr.Task):
    KIND: ClassVar[str] = "chaos-send"
    host: str

    def limit_key(self) -> str | None:
        return self.host


class SendJob(Send, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        Load.running[self.host] += 1
        Load.total += 1
        Load.worst_key = max(Load.worst_key, Load.running[self.host])
        Load.worst_total = max(Load.worst_total, Load.total)
        try:
            await anyio.sleep(0.03)
        finally:
            Load.running[self.host] -= 1
            Load.total -= 1
        return vr.Outcome.completed()


class Rated(vr.Task):
    KIND: ClassVar[str] = "chaos-rated"


class RatedJob(Rated, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Step(vr.Task):
    KIND: ClassVar[str] = "chaos-step"
    n: int = 0


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.n)


class Gather(vr.Task):
    """A flow's parent: completes with its children's results."""

    KIND: ClassVar[str] = "chaos-gather"


class GatherJob(Gather, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=sorted((await ctx.dependency_results()).values()))


async def test_schedules_limits_and_flows_survive_redis_restarts(queue_name: str) -> None:
    with RedisServer("--appendonly", "yes", "--appendfsync", "always") as server:
        producer = vr.Client.from_url(server.url)
        q = producer.queue(queue_name)
        for schedule_id, every in SCHEDULES.items():
            await q.schedule(schedule_id, Tick(), every=every)
        await q.set_limit("chaos-send", concurrency=2, per_key=True)
        await q.set_limit("chaos-send", concurrency=3)
        await q.set_limit("chaos-rated", rate=RATE)
        acked: list[str] = []
        rated: list[str] = []
        parents: dict[str, list[int]] = {}  # parent id -> its children's results
        errors: Counter[str] = Counter()
        stop = anyio.Event()

        async def produce() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    acked.append(await q.enqueue(Send(host=KEYS[n % len(KEYS)])))
                    if n % 10 == 0:
                        flow = await q.enqueue_flow(Gather(), [Step(n=n + i) for i in range(1, 4)])
                        parents[flow.parent_id] = [n + i for i in range(1, 4)]
                        acked.extend([flow.parent_id, *flow.children_ids])
                    if n % 40 == 0:  # 4 at once, faster than the rate lets them start
                        rated.extend([await q.enqueue(Rated()) for _ in range(4)])
                except RedisError as exc:  # the app's own retry: a lost reply may have been applied
                    errors[type(exc).__name__] += 1
                    await anyio.sleep(0.05)
                await anyio.sleep(0.01)

        clients = [vr.Client.from_url(server.url) for _ in range(2)]
        workers = []
        for c in clients:
            w = vr.Worker(
                c.queue(queue_name),
                lease=1.0,
                reclaim_interval=0.25,
                poll_interval=0.5,
                handle_signals=False,
                shutdown_grace=5.0,
            )
            workers.append(w.register(TickJob, SendJob, RatedJob, StepJob, GatherJob))
        t_first = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                for w in workers:
                    tg.start_soon(w.run)
                tg.start_soon(produce)
                for _ in range(RESTARTS):
                    await anyio.sleep(1.5)
                    server.kill()
                    await anyio.sleep(0.5)
                    server.start()
                await anyio.sleep(1.5)
                stop.set()
                # Everything acknowledged ends completed (the workers keep running).
                with anyio.fail_after(60):
                    while True:
                        ids = [*acked, *rated]
                        infos = [await reconnecting(lambda i=i: q.get(i)) for i in ids]  # type: ignore[misc]
                        if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
                            break
                        await anyio.sleep(0.1)
                for schedule_id in SCHEDULES:
                    await q.pause_schedule(schedule_id)
                for w in workers:
                    w.shutdown()
        finally:
            for c in clients:
                await c.aclose()
        # The schedules: each fire time from the first to the last by one job.
        jobs = [j for j in await q.list_jobs(state="completed", limit=10_000) if j.schedule_id in SCHEDULES]
        catch_ups: dict[str, int] = {}
        stood_for: dict[str, int] = {}
        for schedule_id, every in SCHEDULES.items():
            tiles = []
            for j in jobs:
                if j.schedule_id == schedule_id and j.fire_at is not None:
                    entries = await q.journal(j.id)
                    fires = int(entries[0].details.get("fires", "1")) if entries else 1
                    tiles.append((int(j.fire_at.timestamp() * 1000), fires))
            tiles.sort()
            step = round(every * 1000)
            assert len({at for at, _ in tiles}) == len(tiles), f"{schedule_id}: a fire time fired twice"
            for (at, fires), (next_at, _) in itertools.pairwise(tiles):
                assert at + fires * step == next_at, (schedule_id, at, fires, next_at)  # no gap, no overlap
            assert len(tiles) >= 2, (schedule_id, tiles)
            catch_ups[schedule_id] = sum(1 for _, fires in tiles if fires > 1)
            stood_for[schedule_id] = sum(fires for _, fires in tiles)
        # Redis down for longer than two fire times of "tick": the fire times it
        # missed were stood for by a catch-up job, not skipped (the tiling above).
        assert catch_ups["tick"] >= 1, catch_ups
        # The limits: never over a cap, no slot left held, nothing parked.
        assert Load.worst_key <= 2 and Load.worst_total <= 3, (Load.worst_key, Load.worst_total)
        state = {
            k.decode(): v.decode() for k, v in (await producer.redis.hgetall(q.keys.limits_state)).items()
        }
        held = {k: v for k, v in state.items() if "#" not in k and k != "\tseq" and v not in ("0",)}
        assert held == {}, held
        assert await producer.redis.zcard(q.keys.limits_parked) == 0
        loads = {(info.kind, info.per_key): (info.running, info.waiting) for info in await q.limits()}
        assert set(loads.values()) == {(0, 0)}, loads
        # The rate: no window of RATE.per holds more than RATE.count claims (Redis's
        # clock, as the limit counts them: each run's claim, a reclaimed job's too).
        claims: list[int] = []
        for job_id in rated:
            claims += [int(e.at.timestamp() * 1000) for e in await q.journal(job_id) if e.event == "claimed"]
        claims.sort()
        per_ms = RATE.per_ms()
        tight = [claims[i + RATE.count] - claims[i] for i in range(len(claims) - RATE.count)]
        assert all(gap >= per_ms for gap in tight), min(tight)
        # The workflows: every parent completed after its children, with their results.
        for pid, expected in parents.items():
            parent = await q.get(pid)
            assert parent is not None and parent.state == vr.JobState.COMPLETED
            assert parent.result == expected, (pid, parent.result, expected)
        assert (await q.stats()).waiting == 0
        figures(
            "redis restart with features",
            restarts=RESTARTS,
            jobs=len(acked),
            flows=len(parents),
            schedule_jobs=len(jobs),
            fire_times=stood_for,
            catch_up_jobs=catch_ups,
            rated=len(rated),
            rated_claims=len(claims),
            tightest_rate_window_ms=min(tight, default=None),
            worst_per_key=Load.worst_key,
            worst_total=Load.worst_total,
            producer_errors=dict(errors),
            seconds=round(time.monotonic() - t_first, 1),
        )
        await producer.aclose()
