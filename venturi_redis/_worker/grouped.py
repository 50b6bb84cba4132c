"""The runner's side of a wait group (waiting.py): a mixin of runner.py's ``_Runner``.

A runner of a worker with many queues joins a wait group for a run
(``join_group``): its idle wait is then a wait on its own event, which the
group's ``BLPOP`` pokes (``_grouped_claim``), its claims say when its queue
is busy (``_claim_noting_busy``), and its slot tasks start as its jobs need
them (``start_slots_lazily``). The two methods it replaces are replaced on
that runner only, for that run: the usual runner's claim path is untouched.
Kept apart from runner.py, the single queue's claim loop and idle wait, so
that each reads in one sitting.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from .job import Job, jobs_of

if TYPE_CHECKING:
    import asyncio

    from anyio.abc import TaskGroup

    from .._producer.client import Queue
    from .._store.store import ClaimReply, Op
    from .inbox import Inbox
    from .interrupt import Interrupt
    from .waiting import WaitGroup


class _Host(Protocol):
    """What a grouped runner reads of its worker (runner.py's ``RunnerHost`` has it)."""

    concurrency: int

    @property
    def stopping(self) -> bool: ...

    @property
    def jobs_group(self) -> TaskGroup | None: ...


class _Settings(Protocol):
    """What a grouped runner reads of its settings (runner.py's ``RunnerSettings`` has it)."""

    @property
    def poll_interval(self) -> float: ...


class GroupedRunner:
    """What a runner does in a wait group (see the module docstring)."""

    # _Runner's, set in its __init__.
    host: _Host
    settings: _Settings
    queue: Queue
    schedules_wake: str
    on_schedules_wake: Callable[[], None] | None
    inbox: Inbox
    busy: int
    done: bool
    poke: asyncio.Event
    interrupt: Interrupt
    side_calls: AbstractAsyncContextManager[Any]
    group: WaitGroup | None
    short: bool
    slots_left: int

    if TYPE_CHECKING:  # _Runner's methods

        def wake(self) -> None: ...

        async def slot(self) -> None: ...

        async def claim(self, count: int) -> tuple[int, int, list[Job]]: ...

        def _dispatch(self, jobs: list[Job], now: int = 0) -> None: ...

        def _claim_op(self, count: int, stop_key: str | None = None) -> Op[ClaimReply]: ...

        async def _wait(self, seconds: float | None) -> None: ...

    def takes_tokens(self) -> bool:
        """Whether a wake-up token is for this runner now (its wait group asks): idle (its
        last claim came back short), with a free slot, claiming."""
        return self.short and not self.done and not self.host.stopping and self.busy < self.host.concurrency

    async def _grouped_claim(self, want: int, seconds: float) -> tuple[int, int, list[Job]] | None:
        """``idle_claim`` in a wait group (waiting.py): wait for a poke, then claim the ordinary way.

        The group's connection blocks for the token; this waits on the runner's
        own event, until the group pokes it, ``seconds`` pass (the next delayed
        job, or ``poll_interval``: not cut to the 5 s block, which is the
        group's own) or an interrupt comes. None when interrupted with nothing claimed.
        """
        assert self.group is not None
        self.short = True  # the last claim came back short: its group blocks for it
        if seconds >= self.settings.poll_interval:
            # The claim poll_interval asks for, spread: the queues of a worker start
            # together and would otherwise claim together, a burst every interval.
            seconds *= random.uniform(0.75, 1.0)
        self.interrupt.on_set(self.poke.set)
        try:
            self.group.join(self)
            await self._wait(seconds)
        finally:
            self.interrupt.on_set(None)
        if self.interrupt.is_set():
            return None
        # Straight to Redis, not through the completer: an idle queue has no endings
        # for it to ride with, and behind a busy queue's pipelines of completions it
        # waited ~10 ms for a job that was there (the 8 side calls bound a burst).
        op = self._claim_op(want)
        async with self.side_calls:
            claimed = await self.queue.store.send(op)
        got = claimed.now, claimed.next, jobs_of(self.queue, claimed)
        # Full or not, the runner stays idle for its group: a wake-up's claim is full
        # whenever it takes the one job it woke for at batch_size 1. The loop's next
        # claim, if full too, says the queue is busy (_claim_noting_busy).
        self._dispatch(got[2], got[0])
        return got

    def join_group(self, group: WaitGroup) -> None:
        """Wait for wake-ups in ``group`` (waiting.py), for one run: a runner of a worker with many queues.

        Its claims then say when the queue is busy: a claim made by the loop
        on its own (after a full one) that comes back full too; the group leaves
        the queue's tokens alone until a claim comes back short. (A method of
        this runner only: the usual claim path is untouched.)
        """
        self.group = group
        self.claim = self._claim_noting_busy  # type: ignore[method-assign]

    def start_slots_lazily(self) -> None:
        """Start slot tasks as claimed jobs need them, not ``2 * concurrency`` up front.

        For a grouped runner (a worker with many queues and no batch handler):
        1,000 queues at ``concurrency=16`` made 32,000 tasks at the start, most
        never used (~150 KB and a few ms of start-up a queue). A slot task once
        started stays until the run ends, as the eager ones do. (A method of
        this runner only: the usual dispatch is untouched.)
        """
        self.slots_left = 2 * self.host.concurrency
        self._dispatch = self._dispatch_starting_slots  # type: ignore[method-assign]

    def leave_group(self) -> None:
        """Back to the usual runner (a run's end: the next run decides again)."""
        self.group = None
        self.short = False
        self.__dict__.pop("_dispatch", None)
        self.__dict__.pop("claim", None)

    async def _claim_noting_busy(self, count: int) -> tuple[int, int, list[Job]]:
        got = await type(self).claim(self, count)
        self.short = len(got[2]) < count
        return got

    def _dispatch_starting_slots(self, jobs: list[Job], now: int = 0) -> None:
        type(self)._dispatch(self, jobs, now)
        missing = min(self.inbox.unattended(), self.slots_left)
        tg = self.host.jobs_group
        if missing > 0 and tg is not None:
            self.slots_left -= missing
            for _ in range(missing):
                tg.start_soon(self.slot)
