"""A run's progress reports (``ctx.report_progress``): written at once, rate-limited, fenced.

A report is written to the job's hash (``progress.lua``), fenced by the run's
lease token like every write of a run, and published on the queue's event
stream when it is on. A handler may report in a tight loop: at most one
write per ``INTERVAL`` goes out; a report that comes sooner is kept, and the
newest kept value is written when the interval has passed, or when the run
ends (before its transition), so the last value always lands. Reports kept
back still yield to the event loop, at least every ``YIELD_EVERY``: a loop of
nothing but ``await ctx.report_progress(i)`` would otherwise never let the
loop run (before, a million reports held it for 5 s), and with it the
held-back write, the lease renewals and every other job.

A report that cannot be written (the connection is down, the lease is gone)
is logged and dropped: progress is for watching a run, never a reason to fail it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

if TYPE_CHECKING:
    from .._producer.base import QueueLike


class _Job(Protocol):
    """What a progress writer needs of the claimed job (``runner._Job`` is one)."""

    @property
    def queue(self) -> QueueLike: ...
    @property
    def id(self) -> str: ...
    @property
    def token(self) -> str: ...


log = logging.getLogger("venturi_redis.worker")

# Seconds between two writes of one run's progress.
INTERVAL = 0.2
# Most seconds reports kept back go without yielding to the event loop (a
# yield on every one made a loop of reports three times slower).
YIELD_EVERY = 0.005


class Progress:
    """One run's progress writer (made by the run's first report)."""

    __slots__ = ("_inflight", "_job", "_last", "_pending", "_timer", "_yielded")

    def __init__(self, job: _Job) -> None:
        self._job = job
        self._last = -INTERVAL  # monotonic time of the last write
        self._pending: bytes | None = None
        self._inflight: bytes | None = None
        self._timer: asyncio.Task[None] | None = None
        self._yielded = 0.0  # monotonic time a kept-back report last yielded to the loop

    async def report(self, raw: bytes) -> None:
        now = time.monotonic()
        if self._timer is None and now - self._last >= INTERVAL:
            self._last = now
            await self._write(raw)
            return
        self._pending = raw  # the newest wins
        if self._timer is None:
            self._timer = asyncio.ensure_future(self._later(self._last + INTERVAL - now))
        if now - self._yielded >= YIELD_EVERY:
            self._yielded = now
            await asyncio.sleep(0)

    async def _later(self, delay: float) -> None:
        # Writes the held-back value once the interval has passed, and again
        # while reports keep coming sooner than that.
        while True:
            await asyncio.sleep(max(0.0, delay))
            raw, self._pending = self._pending, None
            if raw is None:
                break
            self._last = time.monotonic()
            self._inflight = raw
            await self._write(raw)
            self._inflight = None
            if self._pending is None:
                break
            delay = INTERVAL
        self._timer = None

    async def end(self) -> None:
        """The run is ending: the report still held back is written now (before the transition)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        # A write the cancel cut short may not have landed: it is written again.
        raw = self._pending if self._pending is not None else self._inflight
        self._pending = self._inflight = None
        if raw is not None:
            await self._write(raw)

    async def _write(self, raw: bytes) -> None:
        job = self._job
        crypt = job.queue.client.encryption  # encryption at rest: the hash and the event both sealed
        if crypt is not None:
            raw = crypt.seal(raw)
        try:
            written = await job.queue.store.progress(job.id, job.token, raw)
        except (RedisError, OSError) as exc:
            log.warning("job %s: progress not written: %s", job.id, exc)
            return
        if not written:
            log.info("job %s: progress refused: the run no longer holds the job's lease", job.id)
