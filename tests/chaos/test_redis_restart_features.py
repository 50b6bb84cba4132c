"""Scenario 4b: Redis SIGKILLed and restarted (appendonly, fsync always) while a
schedule fires, a limit holds and workflows wait (issue 38, the probe of a
restart with persistence while schedules, limits and flows are live).

Two workers in this process, on one client each, through the restarts:

- a schedule every 200 ms: every fire time from its first to its last is
  stood for by exactly one job (a catch-up job counts its `fires`), none twice;
- a kind limited to 2 runs at once per key, and to 3 at once over its keys:
  the handlers count themselves and the caps are never exceeded; at the end
  no slot is left held and nothing is parked;
- workflows (a parent waiting on three children): every parent completes
  after its children, none is left waiting;
- every acknowledged enqueue completes.
"""

from __future__ import annotations

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
KEYS = ("a.example", "b.example", "c.example")


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


class Step(vr.Task):
    KIND: ClassVar[str] = "chaos-step"
    n: int = 0


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.n)


async def test_schedules_limits_and_flows_survive_redis_restarts(queue_name: str) -> None:
    with RedisServer("--appendonly", "yes", "--appendfsync", "always") as server:
        producer = vr.Client.from_url(server.url)
        q = producer.queue(queue_name)
        await q.schedule("tick", Tick(), every=EVERY)
        await q.set_limit("chaos-send", concurrency=2, per_key=True)
        await q.set_limit("chaos-send", concurrency=3)
        acked: list[str] = []
        parents: list[str] = []
        errors: Counter[str] = Counter()
        stop = anyio.Event()

        async def produce() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    acked.append(await q.enqueue(Send(host=KEYS[n % len(KEYS)])))
                    if n % 10 == 0:
                        flow = await q.enqueue_flow(Step(n=n), [Step(n=n + i) for i in range(1, 4)])
                        parents.append(flow.parent_id)
                        acked.extend([flow.parent_id, *flow.children_ids])
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
            workers.append(w.register(TickJob, SendJob, StepJob))
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
                        infos = [await reconnecting(lambda i=i: q.get(i)) for i in acked]  # type: ignore[misc]
                        if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
                            break
                        await anyio.sleep(0.1)
                await q.pause_schedule("tick")
                for w in workers:
                    w.shutdown()
        finally:
            for c in clients:
                await c.aclose()
        # The schedule: each fire time from the first to the last by one job.
        ticks = [j for j in await q.list_jobs(state="completed", limit=10_000) if j.schedule_id == "tick"]
        fire_times = sorted(int(j.fire_at.timestamp() * 1000) for j in ticks if j.fire_at)  # type: ignore[union-attr]
        assert len(fire_times) == len(set(fire_times)), "a fire time fired twice"
        stood_for = 0
        for j in ticks:
            entries = await q.journal(j.id)
            stood_for += int(entries[0].details.get("fires", "1")) if entries else 1
        span = round((fire_times[-1] - fire_times[0]) / (EVERY * 1000)) + 1
        assert stood_for == span, (stood_for, span)
        # The limits: never over a cap, no slot left held, nothing parked.
        assert Load.worst_key <= 2 and Load.worst_total <= 3, (Load.worst_key, Load.worst_total)
        state = {
            k.decode(): v.decode() for k, v in (await producer.redis.hgetall(q.keys.limits_state)).items()
        }
        held = {k: v for k, v in state.items() if "#" not in k and k != "\tseq" and v not in ("0",)}
        assert held == {}, held
        assert await producer.redis.zcard(q.keys.limits_parked) == 0
        # The workflows: every parent completed after its children.
        for pid in parents:
            parent = await q.get(pid)
            assert parent is not None and parent.state == vr.JobState.COMPLETED
        assert (await q.stats()).waiting == 0
        figures(
            "redis restart with features",
            restarts=RESTARTS,
            jobs=len(acked),
            flows=len(parents),
            ticks=len(ticks),
            fire_times=span,
            worst_per_key=Load.worst_key,
            worst_total=Load.worst_total,
            producer_errors=dict(errors),
            seconds=round(time.monotonic() - t_first, 1),
        )
        await producer.aclose()
