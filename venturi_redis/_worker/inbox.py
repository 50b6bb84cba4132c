"""The worker's inbox: claimed jobs waiting for a slot task (runner.py's ``_Runner`` fills it).

Kept apart from runner.py, whose claim loop it serves, so each stays one
job: this module is the hand-off between a claim and the slot tasks, and
nothing else.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .job import Job


class Inbox:
    """Claimed jobs waiting for a slot task: a FIFO whose waiters are woken as the jobs need them.

    A waiter is a bare asyncio future (the worker runs on asyncio, as
    redis.asyncio does). A put into an empty inbox wakes one waiter. A slot
    task that takes a job and leaves others behind schedules a spread for the
    next loop iteration, which wakes a waiter for each job still there. So a
    slot whose handler returns without waiting (a quick job) takes the next
    job itself, in the same task step, and a claim's burst of jobs costs a
    wake-up or two instead of one per job; a handler that waits lets the
    spread hand the rest to other slots one loop iteration later.
    """

    __slots__ = ("_closed", "_items", "_spread_at", "_waiters")

    def __init__(self) -> None:
        self._items: deque[Job] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        # The loop a spread is scheduled on (None: none scheduled).
        self._spread_at: asyncio.AbstractEventLoop | None = None

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _spread(self) -> None:
        """A waiter woken for each job left (more may come than are needed: a woken slot
        that finds the inbox empty waits again)."""
        self._spread_at = None
        for _ in range(len(self._items)):
            if not self._waiters:
                return
            self._wake_one()

    def put(self, job: Job) -> None:
        items = self._items
        items.append(job)
        if len(items) == 1:
            self._wake_one()

    def unattended(self) -> int:
        """Jobs waiting that no waiting slot task will take (runner.py's lazy slots start that many)."""
        return len(self._items) - len(self._waiters)

    def close(self) -> None:
        """No more jobs: every waiter gets None once the queued jobs are taken."""
        self._closed = True
        while self._waiters:
            self._wake_one()

    def take(self) -> Job | None:
        """A job already waiting, or None (``get`` waits for one)."""
        items = self._items
        if not items:
            return None
        job = items.popleft()
        if items and self._spread_at is None and self._waiters:
            loop = self._spread_at = asyncio.get_running_loop()
            loop.call_soon(self._spread)
        return job

    async def get(self) -> Job | None:
        items = self._items
        while not items:
            if self._closed:
                return None
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(woken)
            try:
                await woken
            except BaseException:
                if woken in self._waiters:
                    self._waiters.remove(woken)
                elif items:
                    self._wake_one()  # we were handed a job: pass the wake-up on
                raise
        return self.take()
