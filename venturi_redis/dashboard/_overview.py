"""The overview: a row per registered queue, cheap to refresh while a page stays open.

An open overview polls every 5 s (htmx). A refresh reads each queue in one
pipelined round trip: the ``COUNT_COMMANDS`` (23) reads of ``queue.stats()``
without its trim lag (``venturi stats`` and the metrics say that) and the
open minutes of the last-hour chart (two ``ZCOUNT``; four in a minute's first
seconds): 24 commands per queue, 4.8 a second. Redis's clock (``TIME``, the scripts'
clock, which the counts are read at) is read once per ``discovery_interval``
and followed by the local clock between. What cannot change since the last
refresh is not read again:

- The chart's past minutes. A finished job's score is when it finished, by
  Redis's clock, so once that clock is past a minute (and ``_SETTLE_MS``
  more) no job lands in it any more: its two counts are read once and kept.
  A purge or a retention trim later leaves the bar as it was: those jobs did
  finish then.
- "Workers seen": the lease owner of a finished job never changes, so it is
  read once per job and finish time. The newest finished jobs themselves are
  read again only when a count shows that one finished or left (the open
  minutes' bars, the completed and dead counts). A running job's owner is
  read once while it stays running (a job reclaimed and claimed again by
  another worker between two refreshes keeps showing its first owner until
  it leaves running).

A queue whose metrics history is on (``queue.set_history``, docs/observability.md)
draws its chart from the history instead: enqueued, completed, failed and
dead per minute, read from the minutes' hashes (``HGETALL``, one a minute)
in place of the two ``ZCOUNT``: the open minute once per refresh (two in a
minute's first seconds), the past ones once and kept, as above. Whether it
is on is read (one ``HGET``) once per ``discovery_interval`` per queue.

The queue names come from the registry of queues (``Discovery``), kept for
``discovery_interval`` seconds: one ``ZRANGE`` and one ``EXISTS`` per queue.

A page shows at most ``PAGE_QUEUES`` queues (by name; ``?page=``, and ``?q=``
keeps the names that contain a text), and only those are read: with a queue
per tenant, 5,000 rows read every 5 s cost Redis 120,000 commands a refresh
and the browser a page it could not draw in time (benchmarks/many_queues.py).
The rows of a page are read ``READS_AT_ONCE`` queues at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
from redis.exceptions import ResponseError
from starlette.exceptions import HTTPException

from .._model.history import COUNTERS, HistoryPoint
from .._model.records import ms_to_dt
from .._producer.base import server_now_ms
from .._producer.discovery import discover_queues
from .._producer.reads import COUNT_COMMANDS, QueueStats, stats_commands, stats_from

if TYPE_CHECKING:
    from .._producer.client import Client, Queue

log = logging.getLogger("venturi_redis.dashboard")

# The throughput chart: one bar per minute over the last hour.
CHART_MINUTES = 60
_MINUTE = 60_000
# A minute is read once more this long after its end before its counts are
# kept: room for a script's clock read a moment before the bar's edge.
_SETTLE_MS = 5_000
# Workers are seen through the jobs they hold or held: the lease owner of
# every running job (up to this many) and of the most recently finished ones.
_WORKER_SAMPLE = 100
# Queues on one page of the overview, and read at once while it is refreshed.
PAGE_QUEUES = 100
READS_AT_ONCE = 8


# A minute of the chart: completed, dead, and (from the metrics history only) enqueued, failed.
Bar = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Throughput:
    """Completions and deaths per minute, oldest minute first; with the metrics history
    on, jobs enqueued and failed runs too (``history`` True, else those are None)."""

    completed: list[int]
    dead: list[int]
    since: datetime
    enqueued: list[int] | None = None
    failed: list[int] | None = None

    @property
    def history(self) -> bool:
        return self.enqueued is not None

    def points(self) -> list[HistoryPoint]:
        """The minutes as history points (what the chart draws)."""
        enqueued, failed = self.enqueued or [], self.failed or []
        return [
            HistoryPoint(
                at=ms_to_dt(self.since.timestamp() * 1000 + i * _MINUTE),
                enqueued=enqueued[i] if enqueued else 0,
                completed=c,
                failed=failed[i] if failed else 0,
                dead=d,
            )
            for i, (c, d) in enumerate(zip(self.completed, self.dead, strict=True))
        ]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "since": self.since.isoformat(),
            "completed": self.completed,
            "dead": self.dead,
        }
        if self.history:
            out.update(enqueued=self.enqueued, failed=self.failed, source="history")
        return out


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One row of the overview: the queue's stats, its last hour, its workers."""

    stats: QueueStats
    throughput: Throughput
    workers: dict[str, datetime] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.stats.to_dict(),
            "throughput_per_minute": self.throughput.to_dict(),
            "workers": {w: at.isoformat() for w, at in sorted(self.workers.items())},
        }


@dataclass(frozen=True, slots=True)
class Page:
    """Where a page of the overview stands: its number, of how many, over how many queues."""

    number: int
    pages: int
    total: int  # queues found (containing ``match`` when it is given)
    match: str = ""

    @classmethod
    def of(cls, page: int, total: int, match: str) -> Page:
        pages = max(1, -(-total // PAGE_QUEUES))
        return cls(number=min(max(1, page), pages), pages=pages, total=total, match=match)

    @property
    def first(self) -> int:
        """The position (from 1) of the page's first queue among them all."""
        return min(self.total, (self.number - 1) * PAGE_QUEUES + 1)

    @property
    def last(self) -> int:
        return min(self.total, self.number * PAGE_QUEUES)

    @property
    def size(self) -> int:
        return PAGE_QUEUES

    def query(self, number: int) -> str:
        """The query string of page ``number`` of the same queues (the filter kept)."""
        return "?" + urlencode({"page": number, **({"q": self.match} if self.match else {})})

    def to_dict(self) -> dict[str, Any]:
        return {
            "page": self.number,
            "pages": self.pages,
            "page_size": PAGE_QUEUES,
            "total": self.total,
            "match": self.match,
        }


def page_asked(params: Mapping[str, str]) -> tuple[int, str]:
    """The page (``?page=``, from 1) and the filter (``?q=``, a text the names contain) asked for.

    Raises:
        HTTPException: 400, a page that is no number from 1.
    """
    number = params.get("page", "1")
    if not number.isdigit() or not 1 <= int(number) <= 1_000_000:
        raise HTTPException(400, f"page must be a number from 1, got {number[:40]!r}")
    return int(number), params.get("q", "").strip()[:128]


@dataclass(slots=True)
class _Kept:
    """What the overview keeps of one queue between refreshes."""

    # settled minute -> (completed, dead, enqueued, failed): the last two from the history only
    minutes: dict[int, Bar] = field(default_factory=dict)
    running: dict[str, str] = field(default_factory=dict)  # running job id -> its lease owner
    finished: dict[tuple[str, float], str] = field(default_factory=dict)  # (id, finish ms) -> owner
    newest: list[tuple[float, str]] = field(default_factory=list)  # the newest finished (ms, id)
    counts: tuple[int, int] | None = None  # completed and dead when the newest were read
    open_bars: dict[int, Bar] = field(default_factory=dict)  # and the open minutes'
    history: bool = False  # the queue's metrics history is on (its chart reads the history)
    history_at: float | None = None  # when that was read (time.monotonic)

    def finished_since(self, counts: tuple[int, int], open_bars: dict[int, Bar]) -> bool:
        """Whether a job may have finished, or left the finished indexes, since the newest
        were read: a count moved, or an open minute's bar (one that opened since counts 0
        before it). A minute that closed meanwhile was read open until its end and after."""
        if counts != self.counts:
            return True
        return any(bar[:2] != self.open_bars.get(lo, (0, 0))[:2] for lo, bar in open_bars.items())


class Discovery:
    """The queue names, from the registry (as ``venturi stats`` lists them), kept ``interval`` seconds.

    Reading them costs one ``ZRANGE`` and one ``EXISTS`` per registered
    queue: cheap, but not worth repeating on every 5-second refresh. Once
    ``interval`` has passed they are read again in the background (the
    refresh that notices shows the names it has); ``interval <= 0`` reads
    them on every refresh.
    """

    def __init__(self, client: Client, interval: float) -> None:
        self.client = client
        self.interval = interval
        self._names: list[str] = []
        self._at: float | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def names(self) -> list[str]:
        """The names read last; the first call waits for them, later ones never do."""
        if self._at is None or self.interval <= 0:
            await self._read()
        elif time.monotonic() - self._at >= self.interval and self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._read_in_background())
        return self._names

    async def _read(self) -> None:
        self._at = time.monotonic()
        self._names = await discover_queues(self.client)

    async def _read_in_background(self) -> None:
        try:
            await self._read()
        except Exception as exc:  # noqa: BLE001 - logged; the next refresh tries again
            log.warning("dashboard: reading the registry of queues failed: %s", exc)
        finally:
            self._refresh = None


class Overview:
    """Every queue's row (``rows``), and what is kept between two refreshes."""

    def __init__(self, client: Client, discovery_interval: float) -> None:
        self.client = client
        self.discovery = Discovery(client, discovery_interval)
        self._kept: dict[str, _Kept] = {}
        # Redis's clock as an offset from ours, read (TIME) once per discovery_interval:
        # the scripts' clock, without a command per refresh.
        self._offset_ms = 0.0
        self._offset_at: float | None = None

    async def _now(self) -> int:
        """Redis's clock now (ms): TIME when the last reading is older than the discovery interval."""
        at = time.monotonic()
        if self._offset_at is None or at - self._offset_at >= self.discovery.interval:
            self._offset_ms = await server_now_ms(self.client) - time.time() * 1000
            self._offset_at = at
        return int(time.time() * 1000 + self._offset_ms)

    async def rows(self, page: int = 1, match: str = "") -> tuple[list[QueueOverview], dict[str, str], Page]:
        """The queues of page ``page`` (of those whose name contains ``match``), with their rows,
        the queues of the page that cannot be read, and where the page stands.

        A queue with a key of the wrong type (written by hand) answers
        WRONGTYPE; it is returned by name with Redis's error, and the other
        queues are still shown (as ``venturi stats`` does).
        """
        every = await self.discovery.names()
        names = [n for n in every if match in n] if match else every
        at = Page.of(page, len(names), match)
        shown = names[(at.number - 1) * PAGE_QUEUES : at.number * PAGE_QUEUES]
        read: list[QueueOverview | None] = [None] * len(shown)
        broken: dict[str, str] = {}
        if shown:
            now = await self._now()
            limiter = anyio.CapacityLimiter(READS_AT_ONCE)

            async def one(i: int, name: str) -> None:
                kept = self._kept.setdefault(name, _Kept())
                async with limiter:
                    try:
                        queue = self.client.queue(name)
                        await self._history_switch(queue, kept)
                        read[i] = await overview(queue, kept, now)
                    except ResponseError as exc:
                        broken[name] = str(exc)[:300]

            async with anyio.create_task_group() as tg:
                for i, name in enumerate(shown):
                    tg.start_soon(one, i, name)
        # What is kept between refreshes: never for a queue that is gone, and for the
        # shown page's only once it would hold more than a few pages' worth.
        for gone in set(self._kept) - set(every):
            del self._kept[gone]
        if len(self._kept) > 4 * PAGE_QUEUES:
            for name in set(self._kept) - set(shown):
                del self._kept[name]
        return [r for r in read if r is not None], broken, at

    async def _history_switch(self, queue: Queue, kept: _Kept) -> None:
        """Whether the queue's metrics history is on: read once per discovery interval.
        A switch changes where the chart's minutes come from: those kept are read again."""
        at = time.monotonic()
        if kept.history_at is not None and at - kept.history_at < self.discovery.interval:
            return
        on = await queue.client.redis.hget(queue.keys.meta, "history") in (b"1", "1")
        kept.history_at = at
        if on != kept.history:
            kept.history, kept.minutes = on, {}


async def overview(queue: Queue, kept: _Kept, now: int) -> QueueOverview:
    """One queue's row at ``now`` (Redis's clock, ms): its stats, its last hour, its workers seen."""
    k = queue.keys
    end = now - now % _MINUTE + _MINUTE  # the current minute's end: bar i covers [t_i, t_i + 60 s)
    begin = end - CHART_MINUTES * _MINUTE
    known = {lo: c for lo, c in kept.minutes.items() if lo >= begin}
    unread = [lo for lo in range(begin, end, _MINUTE) if lo not in known]
    history = kept.history
    pipe = queue.client.redis.pipeline(transaction=False)
    stats_commands(pipe, queue, now, trim_lag=False)
    for lo in unread:
        if history:  # the minute's hash of the metrics history (lua/include/history.lua)
            pipe.hgetall(k.history_minute(lo // 1000))
        else:
            for key in (k.completed, k.dead):
                pipe.zcount(key, lo, f"({lo + _MINUTE}")
    res = await pipe.execute(raise_on_error=False)
    for reply in res[:COUNT_COMMANDS]:
        if isinstance(reply, Exception):
            raise reply  # a queue key of the wrong type: the row says so (Overview.rows)
    stats = stats_from(queue, now, res, trim_lag=False)
    tail = res[COUNT_COMMANDS:]
    if history:
        read = {lo: _history_minute(tail[i]) for i, lo in enumerate(unread)}
    else:
        read = {lo: (int(tail[2 * i]), int(tail[2 * i + 1]), 0, 0) for i, lo in enumerate(unread)}
    known.update({lo: c for lo, c in read.items() if lo + _MINUTE + _SETTLE_MS <= now})
    kept.minutes = known
    bars = [read[lo] if lo in read else known[lo] for lo in range(begin, end, _MINUTE)]
    open_bars = {lo: c for lo, c in read.items() if lo not in known}
    workers = await _lease_owners_seen(queue, kept, stats, open_bars)
    return QueueOverview(
        stats=stats,
        throughput=Throughput(
            completed=[b[0] for b in bars],
            dead=[b[1] for b in bars],
            since=ms_to_dt(begin),
            enqueued=[b[2] for b in bars] if history else None,
            failed=[b[3] for b in bars] if history else None,
        ),
        workers=workers,
    )


def _history_minute(reply: Any) -> Bar:
    """A minute's hash as (completed, dead, enqueued, failed), every kind summed (a damaged
    key or field counts nothing: the history never stops the overview)."""
    got = dict.fromkeys(COUNTERS, 0)
    if isinstance(reply, dict):
        for name, value in reply.items():
            counter = _text(name).rpartition("\t")[2]
            if counter in got:
                with contextlib.suppress(ValueError):
                    got[counter] += int(value)
    return got["completed"], got["dead"], got["enqueued"], got["failed"]


async def _lease_owners_seen(
    queue: Queue, kept: _Kept, stats: QueueStats, open_bars: dict[int, Bar]
) -> dict[str, datetime]:
    """The lease owners of the running jobs (seen now) and of the newest finished ones (seen then)."""
    k = queue.keys
    redis = queue.client.redis
    counts = (stats.completed, stats.dead)
    reread = kept.finished_since(counts, open_bars)
    pipe = redis.pipeline(transaction=False)
    if stats.running:
        pipe.zrange(k.running, 0, _WORKER_SAMPLE - 1)
    if reread:
        pipe.zrevrange(k.completed, 0, _WORKER_SAMPLE - 1, withscores=True)
        pipe.zrevrange(k.dead, 0, _WORKER_SAMPLE - 1, withscores=True)
    res = list(await pipe.execute()) if stats.running or reread else []
    running = [_text(j) for j in res.pop(0)] if stats.running else []
    if reread:
        completed, dead = res
        both = [(float(s), _text(j)) for j, s in [*completed, *dead]]
        kept.newest = sorted(both, reverse=True)[:_WORKER_SAMPLE]
        kept.counts, kept.open_bars = counts, open_bars
    kept.running = {j: kept.running[j] for j in running if j in kept.running}
    kept.finished = {(j, s): kept.finished[(j, s)] for s, j in kept.newest if (j, s) in kept.finished}
    unknown_running = [j for j in running if j not in kept.running]
    unknown_finished = [(j, s) for s, j in kept.newest if (j, s) not in kept.finished]
    if unknown_running or unknown_finished:
        pipe = redis.pipeline(transaction=False)
        for job_id in [*unknown_running, *(j for j, _ in unknown_finished)]:
            pipe.hget(k.job(job_id), "lease_owner")
        replies = await pipe.execute(raise_on_error=False)
        owners = ["" if not o or isinstance(o, Exception) else _text(o) for o in replies]
        split = len(unknown_running)
        kept.running.update(zip(unknown_running, owners[:split], strict=True))
        kept.finished.update(zip(unknown_finished, owners[split:], strict=True))
    seen: dict[str, datetime] = {}
    # .get: a refresh of the same queue running alongside (another tab) may have replaced
    # what is kept while this one awaited its reads; an owner it lacks is shown next time.
    sightings = [(kept.running.get(j, ""), stats.at) for j in running]
    sightings += [(kept.finished.get((j, s), ""), ms_to_dt(s)) for s, j in kept.newest]
    for name, at in sightings:
        if name and (name not in seen or seen[name] < at):
            seen[name] = at
    return seen


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
