"""An autoscaling signal: how much work a queue has now and soon, and who serves it (issue 41).

The dashboard serves it at ``GET /api/queues/{queue}/scale`` for KEDA's
metrics-api scaler (docs/deployment.md). Every number is an O(log n) read of
an index (``ZCOUNT`` of the pending sets by score, ``ZCARD``), plus one
``EXISTS`` over the names in the queue's registry of workers: a million
pending jobs cost the same as ten. Two round trips.

``scale_total`` sums the same signal over many queues (``GET /api/scale``,
``Client.scale_total``: a Deployment serving a queue per tenant has one
replica count). One clock read, then ``_PER_TRIP`` queues a round trip (a
MULTI each on a single Redis, so each queue's counts agree as they do in
``scale_signal``), then one ``EXISTS`` per distinct worker name: a worker
registered on 1,000 of the queues has a record on each, and one found is
enough to count it once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .._model.enums import PRIORITIES_HIGH_FIRST
from .._model.errors import ConfigurationError
from .._store.keys import NAME_RULE, QueueKeys, is_queue_name
from .base import _text, server_now_ms
from .discovery import registered
from .reads import _atomic_pipeline

if TYPE_CHECKING:
    from .base import ClientLike, QueueLike

log = logging.getLogger("venturi_redis.scale")

# ``due_soon`` looks this far ahead.
SOON_MS = 60_000


@dataclass(frozen=True, slots=True)
class ScaleSignal:
    """What an autoscaler reads of one queue.

    Attributes:
        queue: The queue name.
        ready: Jobs eligible now, every priority (not those parked on a limit).
        running: Jobs holding a lease.
        due_soon: Pending jobs that become eligible within the next minute
            (a delay, a retry's backoff), not counted in ``ready``.
        limited: Jobs eligible but parked on a limit (flow control): more
            workers would not run them sooner.
        workers: Workers registered on the queue and alive (their record not
            expired).
        lag_seconds: Age of the oldest eligible job (0 when none waits).
        paused: Whether claims are paused (``queue.pause()``).
        at_ms: The time the numbers were read at (the scripts' clock, ms).
    """

    queue: str
    ready: int
    running: int
    due_soon: int
    limited: int
    workers: int
    lag_seconds: float
    paused: bool
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the dashboard's ``/api/queues/{queue}/scale``)."""
        return asdict(self)


def _scale_commands(pipe: Any, k: QueueKeys, now: int, wall_ms: int) -> None:
    """Queue the ``SCALE_COMMANDS`` reads of one queue's signal on ``pipe``."""
    for key in k.pending_high_first:
        pipe.zcount(key, "-inf", now)
        pipe.zcount(key, f"({now}", now + SOON_MS)
        pipe.zrangebyscore(key, "-inf", now, start=0, num=1, withscores=True)
    pipe.zcard(k.running)
    pipe.zcard(k.limits_parked)
    pipe.hget(k.meta, "paused")
    # Workers renew their registration by their own wall clock (_worker/registry.py): the
    # zset holds the names not yet trimmed, each name's record says whether it is alive.
    pipe.zrangebyscore(k.workers, wall_ms, "+inf")


# Replies of ``_scale_commands``: three per priority, then four.
SCALE_COMMANDS = 3 * len(PRIORITIES_HIGH_FIRST) + 4


@dataclass(frozen=True, slots=True)
class _Read:
    """One queue's replies to ``_scale_commands``, counted (``workers`` still names)."""

    ready: int
    running: int
    due_soon: int
    limited: int
    oldest: float | None
    paused: bool
    names: list[str]


def _scale_from(res: Sequence[Any]) -> _Read:
    ready = soon = 0
    oldest: float | None = None
    n = len(PRIORITIES_HIGH_FIRST)
    for i in range(n):
        eligible, later, head = res[3 * i : 3 * i + 3]
        ready += int(eligible)
        soon += int(later)
        if head:
            score = float(head[0][1])
            oldest = score if oldest is None else min(oldest, score)
    running, limited, paused, names = res[3 * n : 3 * n + 4]
    return _Read(
        ready, int(running), soon, int(limited), oldest, _text(paused) == "1", [_text(w) for w in names]
    )


def _lag(now: int, oldest: float | None) -> float:
    return max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0


async def scale_signal(queue: QueueLike) -> ScaleSignal:
    """The queue's ``ScaleSignal``, read in one MULTI (so the counts agree) and one ``EXISTS``."""
    now = await server_now_ms(queue.client)
    k = queue.keys
    pipe = _atomic_pipeline(queue.client)
    _scale_commands(pipe, k, now, int(time.time() * 1000))
    got = _scale_from(await pipe.execute())
    names = got.names
    workers = int(await queue.client.redis.exists(*[k.worker(n) for n in names])) if names else 0
    return ScaleSignal(
        queue=queue.name,
        ready=got.ready,
        running=got.running,
        due_soon=got.due_soon,
        limited=got.limited,
        workers=workers,
        lag_seconds=_lag(now, got.oldest),
        paused=got.paused,
        at_ms=now,
    )


# -- many queues: one signal for a Deployment that serves them all ----------------------

# The most queues one aggregate sums: 16 commands each, a bounded read (benchmarks/scale_many.py:
# ~0.25 s at 1,000 queues, ~2.5 s at 10,000, on a loaded 2-core machine; the time is redis-py's
# parsing of the replies, Redis's own part is O(log n) per command).
MAX_SCALE_QUEUES = 10_000
# Queues read in one pipeline (one MULTI on a single Redis): 1,600 commands.
_PER_TRIP = 100
# EXISTS of worker records in one pipeline.
_EXISTS_PER_TRIP = 1_000


@dataclass(frozen=True, slots=True)
class ScaleTotal:
    """The scale signal of many queues, summed: what an autoscaler reads of a
    Deployment that serves them all (``GET /api/scale``).

    Attributes:
        queues: How many queues were summed (those that could be read).
        ready: Jobs eligible now, summed over the queues.
        running: Jobs holding a lease, summed.
        due_soon: Jobs eligible within the next minute, summed.
        limited: Jobs parked on a limit, summed.
        workers: Distinct live workers registered on any of the queues: a
            worker serving 1,000 of them counts once, not 1,000 times.
        lag_seconds: The largest lag of the queues (the oldest eligible job
            of them all).
        paused: How many of the queues are paused.
        unreadable: Queues left out because their keys could not be read
            (a key of the wrong type, written by hand); logged.
        at_ms: The time the numbers were read at (the scripts' clock, ms).
    """

    queues: int
    ready: int
    running: int
    due_soon: int
    limited: int
    workers: int
    lag_seconds: float
    paused: int
    unreadable: int
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the dashboard's ``/api/scale``)."""
        return asdict(self)


async def scale_queues(
    client: ClientLike, queues: Sequence[str] = (), prefix: str | None = None
) -> list[str]:
    """The queues an aggregate sums: ``queues`` and the registered queues whose name
    starts with ``prefix`` (``""``: every registered queue), without repeats, sorted.

    Raises:
        ConfigurationError: A name that is no queue name, neither ``queues`` nor
            ``prefix`` given, or more than ``MAX_SCALE_QUEUES`` queues.
    """
    if isinstance(queues, str):
        raise ConfigurationError(f"queues={queues[:130]!r} is one string: give a list of queue names")
    bad = [q for q in queues if not is_queue_name(q)]
    if bad:
        raise ConfigurationError(f"invalid queue name {bad[0][:130]!r} in queues: use {NAME_RULE}")
    if not queues and prefix is None:
        raise ConfigurationError("name the queues to sum: queues=a,b,c and/or prefix=tenant-")
    names = set(queues)
    if prefix is not None:
        names.update(n for n in await registered(client) if n.startswith(prefix))
    if len(names) > MAX_SCALE_QUEUES:
        raise ConfigurationError(
            f"{len(names):,} queues to sum, more than the {MAX_SCALE_QUEUES:,} one call reads: "
            "narrow the prefix, or split the queues between several triggers"
        )
    return sorted(names)


async def scale_total(client: ClientLike, names: Sequence[str]) -> ScaleTotal:
    """The ``ScaleTotal`` of ``names``: one clock read, one MULTI per ``_PER_TRIP`` queues
    (each queue's counts agree; a queue whose keys cannot be read is left out and counted
    in ``unreadable``), then one ``EXISTS`` per distinct live worker name, pipelined."""
    if len(names) > MAX_SCALE_QUEUES:
        raise ConfigurationError(f"{len(names):,} queues to sum, more than {MAX_SCALE_QUEUES:,}")
    now = await server_now_ms(client)
    wall = int(time.time() * 1000)
    reads: dict[str, _Read] = {}
    broken: dict[str, Exception] = {}
    for i in range(0, len(names), _PER_TRIP):
        chunk = names[i : i + _PER_TRIP]
        pipe = _atomic_pipeline(client)
        for name in chunk:
            _scale_commands(pipe, QueueKeys.for_queue(name, client.namespace), now, wall)
        replies = await pipe.execute(raise_on_error=False)
        for j, name in enumerate(chunk):
            mine = replies[j * SCALE_COMMANDS : (j + 1) * SCALE_COMMANDS]
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is not None:
                broken[name] = error
            else:
                reads[name] = _scale_from(mine)
    if broken:
        name, exc = next(iter(broken.items()))
        log.warning("scale: %d queue(s) could not be read, left out (%s: %s)", len(broken), name, exc)
    oldest = [r.oldest for r in reads.values() if r.oldest is not None]
    return ScaleTotal(
        queues=len(reads),
        ready=sum(r.ready for r in reads.values()),
        running=sum(r.running for r in reads.values()),
        due_soon=sum(r.due_soon for r in reads.values()),
        limited=sum(r.limited for r in reads.values()),
        workers=await _live_workers(client, {n: r.names for n, r in reads.items()}),
        lag_seconds=_lag(now, min(oldest)) if oldest else 0.0,
        paused=sum(r.paused for r in reads.values()),
        unreadable=len(broken),
        at_ms=now,
    )


async def _live_workers(client: ClientLike, listed: dict[str, list[str]]) -> int:
    """How many distinct names of ``listed`` (queue: its registered names) have a record on
    one of their queues. A worker's record is per queue: one ``EXISTS`` on the first queue
    that lists it, then, for the names whose record was gone there, on their other queues
    (a worker that stopped between its beats; its name leaves the zsets soon after)."""
    where: dict[str, list[str]] = {}
    for queue, names in listed.items():
        for w in names:
            where.setdefault(w, []).append(queue)
    alive = await _with_record(client, [(w, qs[0]) for w, qs in where.items()])
    alive |= await _with_record(client, [(w, q) for w, qs in where.items() if w not in alive for q in qs[1:]])
    return len(alive)


async def _with_record(client: ClientLike, asked: list[tuple[str, str]]) -> set[str]:
    """The workers of ``asked`` (worker, queue) whose record on that queue exists."""
    alive: set[str] = set()
    for i in range(0, len(asked), _EXISTS_PER_TRIP):
        part = asked[i : i + _EXISTS_PER_TRIP]
        pipe = client.redis.pipeline(transaction=False)
        for w, q in part:
            pipe.exists(QueueKeys.for_queue(q, client.namespace).worker(w))
        for (w, _), hit in zip(part, await pipe.execute(raise_on_error=False), strict=True):
            if hit == 1:
                alive.add(w)
    return alive
