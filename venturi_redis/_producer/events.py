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

Followers and waiters are served by the queue's one reader on their client
(``tail.py``), which follows the stream with ``XREAD BLOCK`` from the last id
it saw, so a reader that reconnects (or a new follower given ``since=`` an
id it kept) misses nothing still in the stream. Each blocking read lasts at
most ``tail.BLOCK_MS``, below the client's socket timeout: an idle reader
sends one ``XREAD`` per slice, however many follow or wait.
"""

from __future__ import annotations

import contextlib
import math
import re
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
from .tail import Waiter, tail_of

if TYPE_CHECKING:
    from .base import QueueLike as Queue

# How finished jobs end; wait() returns on these.
FINISHED = frozenset({JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED})
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


# An event's id: its stream entry's id, "/<k>" after it for the k-th job of a
# many-job entry; an entry id may be given as its ms alone, as Redis takes it.
_SINCE_RE = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20})(?:/[0-9]{1,9})?)?")


def check_since(since: object) -> str:
    """``since`` once it is a form ``events`` takes; refused here, before any read.

    A malformed id used to reach the stream reader and fail at the first
    iteration, as Redis's "Invalid stream ID" or a ``ValueError``.
    """
    if isinstance(since, str):
        found = _SINCE_RE.fullmatch(since)
        if since == "$" or (found and all(int(n or 0) < 2**64 for n in found.groups())):
            return since
    raise ConfigurationError(
        f"since must be '$', '0' or an event id (an event's .id, like '1700000000000-0'), got {since!r}"
    )


def _resume_point(since: str) -> tuple[str, int]:
    """Where a follower given ``since`` (checked) reads from: (a stream id to read after, events to skip).

    An event of an entry that tells many jobs has the id ``<entry id>/<k>``:
    the follower reads that entry again (from the id just before it) and skips
    its first k + 1 events.
    """
    entry, sep, k = since.partition("/")
    if not sep:
        return since, 0
    ms, _, seq = entry.partition("-")
    before = f"{ms}-{int(seq) - 1}" if int(seq) > 0 else f"{int(ms) - 1}-18446744073709551615"
    return before, int(k) + 1


async def follow(
    queue: Queue, *, since: str = "$", kinds: Collection[str] | None = None
) -> AsyncIterator[QueueEvent]:
    """``Queue.events``: the queue's events after ``since``, as they happen.

    Read by the queue's one reader on this client (``tail.py``), shared with
    every other follower and waiter: a follower holds no connection of its
    own while it waits. ``since`` is checked already (``check_since``, at
    ``Queue.events``: a generator's own check would wait for its first iteration).
    """
    wanted = None if kinds is None else {str(k) for k in kinds}
    skip = 0
    if since == "$":
        after = await _last_id(queue)
    elif since == "0":
        after = "0-0"
    else:
        after, skip = _resume_point(since)
    encryption = queue.client.encryption
    async with contextlib.aclosing(tail_of(queue).follow(after)) as batches:
        async for batch in batches:
            for entry_id, fields in batch:
                events = QueueEvent.all_from_stream(entry_id, fields, encryption)
                if skip:
                    events, skip = events[skip:], 0
                for event in events:
                    if wanted is None or event.kind in wanted:
                        yield event


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
    waiter registers with the queue's reader (the "subscription": from then
    on, every finish event of the job reaches it; ``tail.py``), then the job
    is read back (returning when it has finished), then the waiter waits.
    A finish at any moment is seen by the read or reaches the waiter. Each
    quiet slice of the reader, and each finish event of the job, reads the
    job back (the job's hash is the authority; the stream may be off or
    trimmed). Waiters share the reader: a waiting call holds no connection.
    """
    seconds = math.inf if timeout is None else to_ms(timeout, "timeout") / 1000
    deadline = time.monotonic() + seconds
    if await events_cap(queue) == 0:
        await hook("subscribed")
        return await _read_back_until_finished(queue, job_id, deadline, seconds, None, hook)
    tail = tail_of(queue)
    # Where a reader this call starts begins: the newest entry now (one that
    # is running reads on from where it is).
    position = tail.position if tail.running else await _last_id(queue)
    with tail.waiting(job_id, position) as waiter:
        await hook("subscribed")
        return await _read_back_until_finished(queue, job_id, deadline, seconds, waiter, hook)


async def _read_back_until_finished(
    queue: Queue,
    job_id: str,
    deadline: float,
    seconds: float,
    waiter: Waiter | None,
    hook: Callable[[str], Awaitable[None]],
) -> JobInfo:
    """Read the job back until it has finished: after each wake-up of ``waiter``, or every
    ``_POLL_OFF`` seconds without one (the queue's events off)."""
    failures = 0
    while True:
        try:
            raw = await queue.client.redis.hgetall(queue.keys.job(job_id))
        except TRANSIENT:
            failures += 1
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} did not finish within {seconds:g} s") from None
            await anyio.sleep(min(0.05 * 2**failures, 2.0, max(0.0, deadline - time.monotonic())))
            continue
        failures = 0
        info = JobInfo.from_hash(queue.name, job_id, raw, encryption=queue.client.encryption) if raw else None
        if info is None:
            raise JobNotFound(f"no job {job_id!r} in queue {queue.name!r} (never enqueued, or purged)")
        if info.state in FINISHED:
            return info
        await hook("read")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {job_id} did not finish within {seconds:g} s (it is {info.state})")
        if waiter is None:
            await anyio.sleep(min(_POLL_OFF, left))
        else:
            with anyio.move_on_after(left):
                await waiter.next()
