"""A worker's scheduler for one queue: fires the queue's due schedules (docs/schedules.md).

Every worker runs one per queue, and every one may fire: there is no leader
to elect or lose. Two workers that fire the same fire time make one job
(``lua/schedule_fire.lua`` compares and advances in one step), so a fleet
of identical pods needs no singleton.

It knows the earliest next fire time of its queue and sleeps until then (by
the scripts' clock, as its last fire round read it), then fires what is due.
A fire round is one read-only script (one ``ZRANGEBYSCORE ... LIMIT``: the
schedules not due cost nothing), a read of the due schedules, one script per
schedule fired and one ``ZRANGE`` for the next earliest fire time.

How it learns of a schedule a producer created, changed or resumed: the
script that did it leaves one token on the queue's schedules wake list, and
the idle claim's ``BLPOP`` waits on that list too (one more key, no more
commands); the worker that pops it looks at once (``hint``). The others, and
a worker too busy to block, see it at their next periodic look: one ``ZRANGE
... 0 0 WITHSCORES`` every four reclaim intervals (60 s by default,
jittered), an idle worker's whole cost (about 0.017 commands/s). Whatever is
learnt late is fired late, never lost (docs/schedules.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio

from .._model.errors import ConfigurationError
from .._model.task import Task
from .._producer.client import Queue
from .._producer.firing import DUE_BATCH, fire_due
from .runner import _SURVIVABLE

if TYPE_CHECKING:
    from .._model.schedule import Schedule

log = logging.getLogger("venturi_redis.worker")

# A round that fired nothing while something is due (another worker is firing
# it right now, or a schedule was changed under us) waits this long before the
# next, so a worker never spins on a schedule it cannot fire.
_RETRY_PAUSE = 0.05
# Woken this much after the fire time, so the script's clock has reached it.
_MARGIN = 0.002


def declared_schedules(schedules: Sequence[Schedule], qs: Sequence[Queue]) -> list[tuple[Queue, Schedule]]:
    """Each declared schedule with the worker queue it belongs to (checked now)."""
    if not schedules and isinstance(schedules, Sequence):
        return []  # the usual worker declares none: vr.Schedule's module stays unimported (issue 42)
    from .._model.schedule import Schedule

    if isinstance(schedules, Schedule) or not all(isinstance(s, Schedule) for s in schedules):
        raise ConfigurationError(f"schedules must be a list of vr.Schedule, got {schedules!r}")
    by_name = {q.name: q for q in qs}
    out: list[tuple[Queue, Schedule]] = []
    seen: set[tuple[str, str]] = set()
    for s in schedules:
        queue = qs[0] if s.queue is None else by_name.get(s.queue)
        if queue is None:
            raise ConfigurationError(
                f"schedule {s.id!r} names queue {s.queue!r}, not one of this worker's: {', '.join(by_name)}"
            )
        if (queue.name, s.id) in seen:
            raise ConfigurationError(f"schedule {s.id!r} is declared twice for queue {queue.name!r}")
        seen.add((queue.name, s.id))
        out.append((queue, s))
    return out


async def declare(schedules: Sequence[tuple[Queue, Schedule]]) -> None:
    """Upsert the declared schedules (a worker's start): unchanged ones are left as stored."""
    for queue, s in schedules:
        await queue.schedule(
            s.id,
            s.task,
            cron=s.cron,
            every=s.every,
            tz=s.tz,
            start_at=s.start_at,
            end_at=s.end_at,
            priority=s.priority,
        )


class Scheduler:
    """Fires the due schedules of ``queue``; ``run`` until cancelled."""

    def __init__(
        self, queue: Queue, tasks: Callable[[], Mapping[str, type[Task[Any]]]], peek_interval: float
    ) -> None:
        self.queue = queue
        self.tasks = tasks
        self.peek_interval = peek_interval
        # The scripts' clock (ms) at a monotonic instant, from the last fire round.
        self._clock: tuple[int, float] | None = None
        self.rounds = 0  # fire rounds run (tests read it)
        # The worker's bound on its side calls (runner.py ``side_calls``), set by each run().
        self.side_calls: AbstractAsyncContextManager[Any] = contextlib.nullcontext()
        self._hinted = anyio.Event()

    def hint(self) -> None:
        """Look at the due index now (a producer changed a schedule): the runner calls this."""
        self._hinted.set()

    def _mono_of(self, server_ms: int) -> float:
        """The monotonic instant the scripts' clock reaches ``server_ms``."""
        if self._clock is None:
            return time.monotonic()
        at_ms, at_mono = self._clock
        return at_mono + (server_ms - at_ms) / 1000 + _MARGIN

    async def fire_round(self) -> float | None:
        """Fire what is due; the monotonic time of the next round (None: nothing scheduled)."""
        result = await fire_due(self.queue, tasks=self.tasks(), limit=DUE_BATCH)
        self.rounds += 1
        mono = time.monotonic()
        self._clock = (result.now, mono)
        if len(result.fired) >= DUE_BATCH:
            return mono  # more are due
        if result.earliest is None:
            return None
        if result.earliest <= result.now:
            # Still due after the round: another worker holds it, or it changed.
            if not any(f.status != "refused" for _, f in result.fired):
                return mono + _RETRY_PAUSE * random.uniform(0.5, 1.5)
            return mono
        return self._mono_of(result.earliest)

    async def peek(self) -> float | None:
        """The earliest next fire time (one ZRANGE), as a monotonic instant; None: none."""
        first = await self.queue.client.redis.zrange(self.queue.keys.schedules_due, 0, 0, withscores=True)
        if not first:
            return None
        return self._mono_of(int(first[0][1]))

    async def run(self) -> None:
        due: float | None = time.monotonic()  # a first round at start: it reads the clock
        next_peek = math.inf
        failures = 0
        while True:
            now = time.monotonic()
            if due is not None and due <= now:
                try:
                    async with self.side_calls:
                        due = await self.fire_round()
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - a schedule's trouble must not stop the jobs
                    # Redis errors (a failover, OOM), and anything a schedule's data
                    # could raise that was not foreseen: logged, retried with a backoff.
                    failures += 1
                    log.warning(
                        "queue %s: firing schedules failed (%s)",
                        self.queue.name,
                        exc if isinstance(exc, _SURVIVABLE) else repr(exc),
                    )
                    due = time.monotonic() + min(0.1 * 2**failures, self.peek_interval)
                next_peek = time.monotonic() + self.peek_interval * random.uniform(0.8, 1.2)
                continue
            wake = min(next_peek, due if due is not None else math.inf)
            with anyio.move_on_after(max(0.0, wake - now)):
                await self._hinted.wait()
            hinted = self._hinted.is_set()
            if hinted:
                self._hinted = anyio.Event()
            if hinted or time.monotonic() >= next_peek:
                next_peek = time.monotonic() + self.peek_interval * random.uniform(0.8, 1.2)
                try:
                    async with self.side_calls:
                        seen = await self.peek()
                except _SURVIVABLE as exc:
                    log.warning("queue %s: reading schedules failed (%s)", self.queue.name, exc)
                    continue
                if seen is not None and (due is None or seen < due):
                    due = seen
