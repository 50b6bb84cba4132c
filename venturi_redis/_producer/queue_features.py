"""``Queue``'s operations beyond jobs: the event stream, the metrics history, schedules, limits.

A mixin of ``Queue`` (``client.py``), split from it by concept: each method is
a thin delegation to the module that does the work (``events.py``,
``history.py``, ``schedules.py``, ``limits.py``), given the queue as a
``QueueLike``.

Those modules are imported where a method is first called, not with ``Queue``:
a worker that uses no event stream, schedule or limit never imports them, nor
the models they return (issue 42: a worker's start-up).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._model.enums import Priority
from .._model.task import Task
from .._store.keys import QueueKeys
from .._store.store import EVENTS_MAXLEN, QueueStore
from .base import ClientLike

if TYPE_CHECKING:
    from .._model.events import QueueEvent
    from .._model.history import HistoryPoint
    from .._model.limits import LimitInfo, Rate
    from .._model.records import JobInfo
    from .._model.schedule import ScheduleInfo


class QueueFeatures:
    """The event stream, history, schedules and flow control of one queue (``Queue`` has them)."""

    client: ClientLike
    keys: QueueKeys
    store: QueueStore
    name: str

    # -- observability: the event stream (events.py) ----------------------------

    def events(self, *, since: str = "$", kinds: Collection[str] | None = None) -> AsyncIterator[QueueEvent]:
        """The queue's events as they happen (while its event stream is on: the default, ``set_events``).

        Args:
            since: ``"$"`` (from now), ``"0"`` (everything the capped stream
                still holds) or an event's ``id``: to resume after it, missing
                nothing the stream still holds.
            kinds: Only events of jobs of these KINDs.

        Iterate with ``async for``; it never ends by itself (break, or cancel).

        Raises:
            ConfigurationError: ``since`` is none of these (at the call, before any read).
        """
        from . import events as _events

        # Checked here, at the call: a generator's own checks wait for its first iteration.
        return _events.follow(self, since=_events.check_since(since), kinds=kinds)

    async def wait(
        self,
        job_id: str,
        *,
        # Not anyio.fail_after: the caller chooses how long, like resolve().
        timeout: float | timedelta | None = None,  # noqa: ASYNC109
    ) -> JobInfo:
        """Wait until the job has finished (completed, dead or cancelled) and return it.

        Race-free: a job that finishes at any moment, before the call
        included, is returned. Prompt when the queue's event stream is on;
        when it is off, the job is read back every 0.25 s.

        Raises:
            TimeoutError: It has not finished after ``timeout`` seconds.
            JobNotFound: No such job in this queue.
        """
        from . import events as _events

        return await _events.wait(self, job_id, timeout)

    async def set_events(self, enabled: bool, *, maxlen: int = EVENTS_MAXLEN) -> None:
        """Switch this queue's event stream on (capped at about ``maxlen`` entries) or off.

        Takes effect at the next script call of every client and worker.
        """
        from . import events as _events

        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        await _events.set_events(self, enabled, maxlen=maxlen)

    # -- observability: the metrics history (history.py) -------------------------------

    async def history(
        self, *, since: timedelta = timedelta(hours=1), kind: str | None = None, step: timedelta | None = None
    ) -> list[HistoryPoint]:
        """Jobs enqueued, completed, failed, dead and the mean run time, step by step, oldest
        first (all zero while the history is off: ``set_history``; docs/observability.md).

        Args:
            since: How far back: at most 30 days.
            kind: Only jobs of this KIND (None: every kind, summed).
            step: A whole number of minutes (of hours past 48 hours: minutes are kept
                48 hours, hours 30 days); None: a minute up to 48 hours, else an hour.

        Raises:
            ConfigurationError: ``since`` or ``step`` out of those bounds (nothing read).
        """
        from . import history as _history  # not imported at a worker's start (issue 42)

        return await _history.history(self, since=since, kind=kind, step=step)

    async def set_history(self, enabled: bool) -> None:
        """Switch this queue's metrics history on or off (off by default: it costs every
        transition a few Redis commands). Takes effect at every client's next script call."""
        from . import history as _history

        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        await _history.set_history(self, enabled)

    # -- schedules: delegations to schedules.py (docs/schedules.md) ------------------

    async def schedule(
        self,
        schedule_id: str,
        task: Task[Any],
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        priority: Priority | int | str | None = None,
    ) -> ScheduleInfo:
        """Create or replace (upsert) the schedule ``schedule_id``: ``task`` enqueued at each fire time.

        Args:
            schedule_id: Its name in this queue (1 to 128 of A-Z a-z 0-9 _ . -).
            task: The task every fire enqueues (its dedup key, if any, merges as any enqueue's).
            cron: A 5-field cron expression (or ``@hourly``, ``@daily``...), read in ``tz``.
            every: Or a fixed interval: seconds or a ``timedelta``.
            tz: An IANA time zone name; daylight-saving changes are honoured (docs/schedules.md).
            start_at: No fire before it (an interval schedule's first fire time);
                timezone-aware.
            end_at: No fire after it; timezone-aware.
            priority: Overrides ``task.priority()``.

        Re-declaring the same schedule changes nothing (its next fire time is
        kept); a new timing starts from the next fire time after now; a paused
        schedule stays paused. One job is enqueued per fire time, whatever the
        number of workers.

        Raises:
            ConfigurationError: An unparsable cron, both or neither of
                ``cron``/``every``, a non-positive ``every``, an unknown time
                zone, ``end_at`` before ``start_at``, a schedule that never
                fires; nothing is written.
        """
        from . import schedules as _schedules

        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        return await _schedules.schedule(
            self,
            schedule_id,
            task,
            cron=cron,
            every=every,
            tz=tz,
            start_at=start_at,
            end_at=end_at,
            priority=priority,
        )

    async def unschedule(self, schedule_id: str) -> bool:
        """Remove the schedule; True if it existed (jobs it already enqueued stay)."""
        from . import schedules as _schedules

        return await _schedules.unschedule(self, schedule_id)

    async def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """The schedule ``schedule_id`` of this queue, or None."""
        from . import schedules as _schedules

        return await _schedules.get_schedule(self, schedule_id)

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule of this queue (paused and ended ones too), by id."""
        from . import schedules as _schedules

        return await _schedules.list_schedules(self)

    async def pause_schedule(self, schedule_id: str) -> bool:
        """Stop firing the schedule until resumed; False if there is no such schedule."""
        from . import schedules as _schedules

        return await _schedules.pause_schedule(self, schedule_id)

    async def resume_schedule(self, schedule_id: str) -> bool:
        """Fire the schedule again, from its next fire time after now (fire times skipped
        while paused are not caught up); False if there is no such schedule."""
        from . import schedules as _schedules

        return await _schedules.resume_schedule(self, schedule_id)

    async def trigger_schedule(self, schedule_id: str) -> str | None:
        """Enqueue one extra job of the schedule now; its id (None: no such schedule)."""
        from . import schedules as _schedules

        return await _schedules.trigger_schedule(self, schedule_id)

    # -- flow control (docs/flow-control.md) ----------------------------------------

    async def set_limit(
        self,
        kind: str,
        *,
        concurrency: int | None = None,
        rate: Rate | None = None,
        per_key: bool = False,
    ) -> None:
        """Cap the runs of ``kind``: at most ``concurrency`` at once and ``rate`` starts per window.

        ``per_key=True`` applies the caps to each ``Task.limit_key()`` of the
        kind separately (jobs whose key is None are not counted by them); a
        kind may have both a kind-wide and a per-key limit. Setting one
        replaces the previous limit of that scope. Enforced by the claim,
        across every worker, from the moment this returns; jobs waiting on
        a cap that is raised run at once.

        Raises:
            ConfigurationError: a kind that is not a task kind, a
                concurrency that is not a whole number >= 1, a rate that is
                not a ``vr.Rate``, or neither given (nothing is written).
        """
        from . import limits as _limits

        await self.client._recorded.ensure(self.client.redis, self.name)  # registry.py
        await _limits.set_limit(self, kind, concurrency=concurrency, rate=rate, per_key=per_key)

    async def clear_limit(self, kind: str, *, per_key: bool = False) -> bool:
        """Remove the kind-wide (or per-key) limit of ``kind``; False when it had none.

        Jobs waiting on it run as soon as workers take them.
        """
        from . import limits as _limits

        return await _limits.clear_limit(self, kind, per_key=per_key)

    async def limits(self, *, keys: int = 50) -> list[LimitInfo]:
        """The queue's limits, by kind (kind-wide first), with their running and waiting counts.

        A per-key limit's row also holds its ``keys``: the ``keys`` busiest
        limit keys (most running plus waiting first), each with its own
        counts, and ``keys_total``, how many keys are busy (None when there
        are too many to count cheaply). The read is bounded however many
        keys there are; ``keys=0`` skips it.

        Raises:
            ConfigurationError: ``keys`` is not a whole number >= 0.
        """
        from . import limits as _limits

        return await _limits.limits(self, keys)
