"""A queue's event stream: following it (``queue.events``), waiting on a job
(``queue.wait``), and the operator's switch (``queue.set_events``).

The stream, ``venturi:{q}:events``, is appended to by the transition scripts
themselves (``lua/include/events.lua``), in the same atomic step as the job's
journal entry, so what it says never disagrees with the journals. It is
capped (XADD ``MAXLEN ~ N``) and switched per queue by the meta hash's
``events`` field: absent = on with the cap ``EVENTS_DEFAULT``, ``0`` = off,
``N`` = on with a cap of about N entries. The first event makes the stream.
An entry tells one job, or every job one script call moved alike
(``QueueEvent.all_from_stream`` reads both). docs/observability.md is the
user's manual.

A reader follows it with ``XREAD BLOCK`` from the last id it saw, so a reader
that reconnects (or a new one given ``since=`` an id it kept) misses nothing
still in the stream. Each blocking read lasts at most ``_BLOCK_MS``, below
the client's socket timeout: an idle follower sends one ``XREAD`` per slice.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio

from .._model.backoff import to_ms
from .._model.enums import JobState
from .._model.errors import ConfigurationError, JobNotFound
from .._model.events import QueueEvent
from .._model.limits import MAX_COUNT, whole_count
from .._model.records import JobInfo
from .._store.store import EVENTS_DEFAULT, EVENTS_MAXLEN
from .._transport.errors import TRANSIENT

if TYPE_CHECKING:
    from .base import QueueLike as Queue

# One blocking read: under the 5 s socket timeout of Client.from_url's default.
_BLOCK_MS = 4000
# Entries per read: a follower that fell behind catches up in steps this big.
_COUNT = 500
# How finished jobs end; wait() returns on these.
FINISHED = frozenset({JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED})
_FINISH_EVENTS = frozenset({b"completed", b"dead", b"cancelled"})
# When a queue's events are off, wait() reads the job back this often.
_POLL_OFF = 0.25


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def set_events(queue: Queue, enabled: bool, *, maxlen: int = EVENTS_MAXLEN) -> None:
    """Switch the queue's event stream on (capped at about ``maxlen`` entries) or off.

    Each switch is an entry of the stream itself (``events_on``, ``events_off``;
    no job), so a follower sees where the stream went quiet, and why.
    """
    if enabled and not whole_count(maxlen):
        raise ConfigurationError(
            f"events maxlen must be a whole number from 1 to {MAX_COUNT:,}, got {maxlen!r}"
        )
    k = queue.keys
    # A marker entry says where the stream went quiet or started again:
    # switching on writes an `events_on` entry (making the stream); switching
    # off writes `events_off` (to a stream that exists only), then the switch.
    marker = {"event": "events_on" if enabled else "events_off", "job": "", "kind": "", "run": "0"}
    marker["at"] = str(int(time.time() * 1000))  # this client's clock: a marker, not a transition
    pipe = queue.client.redis.pipeline(transaction=False)
    if enabled:
        pipe.hset(k.meta, "events", str(maxlen))
        pipe.xadd(k.events, marker, maxlen=maxlen, approximate=True)
    else:
        pipe.xadd(k.events, marker, nomkstream=True)
        pipe.hset(k.meta, "events", "0")
    await pipe.execute()


async def events_cap(queue: Queue) -> int:
    """The queue's event stream cap now: 0 when off."""
    raw = await queue.client.redis.hget(queue.keys.meta, "events")
    value = _text(raw) if raw is not None else EVENTS_DEFAULT
    return int(value) if value.isdigit() else int(EVENTS_DEFAULT)


async def _last_id(queue: Queue) -> str:
    """The id of the stream's newest entry ("0-0" when it has none): "$" made concrete,
    so that reads after it, however many, start from the same point."""
    newest = await queue.client.redis.xrevrange(queue.keys.events, count=1)
    return _text(newest[0][0]) if newest else "0-0"


async def _read(queue: Queue, after: str, block_ms: int) -> list[tuple[Any, dict[Any, Any]]]:
    reply = await queue.client.redis.xread({queue.keys.events: after}, count=_COUNT, block=block_ms)
    if not reply:
        return []
    # RESP2 gives [[key, entries]]; RESP3 {key: [entries]}.
    if isinstance(reply, dict):
        return list(next(iter(reply.values()))[0] if reply else [])
    return list(reply[0][1])


def _resume_point(since: str) -> tuple[str, int]:
    """Where a follower given ``since`` reads from: (a stream id to read after, events to skip).

    An event of an entry that tells many jobs has the id ``<entry id>/<k>``:
    the follower reads that entry again (from the id just before it) and skips
    its first k + 1 events.
    """
    entry, sep, k = since.partition("/")
    if not sep:
        return since, 0
    ms, _, seq = entry.partition("-")
    if not (ms.isdigit() and seq.isdigit() and k.isdigit()):
        raise ConfigurationError(f"since must be '$', '0' or an event id, got {since!r}")
    before = f"{ms}-{int(seq) - 1}" if int(seq) > 0 else f"{int(ms) - 1}-18446744073709551615"
    return before, int(k) + 1


async def follow(
    queue: Queue, *, since: str = "$", kinds: Collection[str] | None = None
) -> AsyncIterator[QueueEvent]:
    """``Queue.events``: the queue's events after ``since``, as they happen."""
    if not isinstance(since, str) or not since:
        raise ConfigurationError(f"since must be '$', '0' or an event id, got {since!r}")
    wanted = None if kinds is None else {str(k) for k in kinds}
    skip = 0
    if since == "$":
        after = await _last_id(queue)
    elif since == "0":
        after = "0-0"
    else:
        after, skip = _resume_point(since)
    failures = 0
    while True:
        try:
            entries = await _read(queue, after, _BLOCK_MS)
        except TRANSIENT:
            # Reconnect and read on from the last id seen: nothing is lost
            # that the stream still holds.
            failures += 1
            await anyio.sleep(min(0.05 * 2**failures, 2.0))
            continue
        failures = 0
        for entry_id, fields in entries:
            after = _text(entry_id)
            events = QueueEvent.all_from_stream(after, fields, queue.client.encryption)
            if skip:
                events, skip = events[skip:], 0
            for event in events:
                if wanted is None or event.kind in wanted:
                    yield event


def _finished(fields: dict[Any, Any], target: bytes) -> bool:
    """Whether a stream entry says the job ``target`` finished (one job's entry, or many's)."""
    if fields.get(b"event") not in _FINISH_EVENTS:
        return False
    job = fields.get(b"job")
    if job is not None:
        return bool(job == target)
    return target in fields.get(b"jobs", b"").split(b" ")


async def _nothing(stage: str) -> None:
    return None


async def wait(
    queue: Queue,
    job_id: str,
    timeout: float | timedelta | None,  # noqa: ASYNC109
    hook: Callable[[str], Awaitable[None]] = _nothing,
) -> JobInfo:
    """``Queue.wait``: the job once finished. ``hook`` lets tests inject races.

    The order is what makes it race-free, as in ``resolve``: first the
    stream's position is taken (the "subscription"), then the job is read
    back (returning when it has finished), then the events after that
    position are awaited: a finish at any moment is seen by the read or
    is in the stream after the position. Each quiet slice, and each finish
    event of the job, reads the job back (the job's hash is the authority;
    the stream may be off or trimmed past the position).
    """
    seconds = math.inf if timeout is None else to_ms(timeout, "timeout") / 1000
    deadline = time.monotonic() + seconds
    on = await events_cap(queue) > 0
    after = await _last_id(queue)
    await hook("subscribed")
    failures = 0
    target = job_id.encode()
    while True:
        try:
            raw = await queue.client.redis.hgetall(queue.keys.job(job_id))
            info = (
                JobInfo.from_hash(queue.name, job_id, raw, encryption=queue.client.encryption)
                if raw
                else None
            )
            if info is None:
                raise JobNotFound(f"no job {job_id!r} in queue {queue.name!r} (never enqueued, or purged)")
            if info.state in FINISHED:
                return info
            await hook("read")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"job {job_id} did not finish within {seconds:g} s (it is {info.state})"
                    )
                if not on:
                    await anyio.sleep(min(_POLL_OFF, left))
                    break
                entries = await _read(queue, after, max(1, int(min(_BLOCK_MS / 1000, left) * 1000)))
                if not entries:
                    break  # a quiet slice: read back
                after = _text(entries[-1][0])
                if any(_finished(f, target) for _, f in entries):
                    break
            failures = 0
        except TRANSIENT:
            failures += 1
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} did not finish within {seconds:g} s") from None
            await anyio.sleep(min(0.05 * 2**failures, 2.0, max(0.0, deadline - time.monotonic())))
