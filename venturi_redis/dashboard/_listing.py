"""A queue's jobs, page by page, with a cursor instead of an offset.

``Queue.list_jobs`` answers "the first N"; a dashboard also needs "the next N
after the last one I showed", in a queue of a million pending jobs. A cursor
names the index zset it stopped in and the last job's ``(score, id)``; the
next page starts right after it, found in O(log N) by ``ZRANK`` (or, when that
job has left the index meanwhile, by ``ZCOUNT`` of the scores before it). So
page 5,000 costs what page 1 costs, and a job claimed between two pages does
not shift the next page by one, as an offset would.

Reads only: plain commands anyone can repeat with ``redis-cli``
(docs/redis-layout.md); no Lua.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._model.enums import JobState
from .._model.records import JobInfo
from .._producer.base import server_now_ms
from .._producer.reads import index_of

if TYPE_CHECKING:
    from .._producer.client import Queue

# Ids read per round trip, and the most a page reads before it answers with
# fewer jobs than asked (a rare KIND in a huge state): the answer then carries
# a cursor, and the next page goes on from there.
_BATCH = 200
MAX_SCAN = 5_000

_CURSOR_RE = re.compile(r"(\d{1,2})~(-?\d+(?:\.\d+)?)~([0-9A-Za-z]{1,64})")
# In limits:parked every score is 0 and the members are ordered by their text,
# `<kind>\t<key field>\t<level><id>`: its cursor names the member itself
# (URL-safe base64), found again by ZRANK, or by ZLEXCOUNT once it has left.
_LEX_CURSOR_RE = re.compile(r"(\d{1,2})~L~([0-9A-Za-z_=-]{1,4096})")


class BadCursor(ValueError):
    """A cursor that this module did not write (or for another filter)."""


@dataclass(frozen=True, slots=True)
class Source:
    """One index zset a listing walks: its state, key and direction."""

    state: JobState
    key: str
    newest_first: bool
    # ``delayed``: only the members scored above this (eligible later).
    above: int | None = None
    # limits:parked: members are ``<kind>\t<key field>\t<level><id>``, all scored 0.
    parked: bool = False
    # ``retrying``: an index entry whose job is no longer pending is skipped.
    pending_only: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    """One page of jobs, and the cursor of the next (``None`` at the end)."""

    jobs: list[JobInfo]
    next_cursor: str | None
    scanned: int


def sources(queue: Queue, state: JobState | str | None, now: int = 0) -> list[Source]:
    """The index zsets of ``state`` (every state when ``None``), in listing order:
    pending by priority then eligibility, running by lease expiry, suspended by
    suspension time, finished states newest first (as ``Queue.list_jobs``).

    ``state`` may be a view of the pending jobs (``reads.VIEWS``): ``retrying``
    (its index, next retry first), ``delayed`` (the pending sets above ``now``)
    or ``limited`` (parked on a limit).
    """
    k = queue.keys
    pending = JobState.PENDING
    if state == "retrying":
        return [Source(pending, k.retrying, False, pending_only=True)]
    if state == "delayed":
        return [Source(pending, key, False, above=now) for key in k.pending_high_first]
    if state == "limited":
        return [Source(pending, k.limits_parked, False, parked=True)]
    out: list[Source] = []
    for st in [JobState(state)] if state is not None else list(JobState):
        if st is JobState.PENDING:
            out += [Source(st, key, False) for key in k.pending_high_first]
        else:
            key, newest = index_of(k, st)
            out.append(Source(st, key, newest))
    return out


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _score_text(score: float) -> str:
    return str(int(score)) if score == int(score) else repr(score)


def encode_cursor(index: int, score: float, job_id: str, parked: bool = False) -> str:
    if parked:  # job_id is the parked member (see _LEX_CURSOR_RE)
        return f"{index}~L~{base64.urlsafe_b64encode(job_id.encode()).decode()}"
    return f"{index}~{_score_text(score)}~{job_id}"


def decode_cursor(cursor: str, n_sources: int) -> tuple[int, float, str]:
    m = _CURSOR_RE.fullmatch(cursor)
    if m is None:
        lex = _LEX_CURSOR_RE.fullmatch(cursor)
        if lex is not None and int(lex.group(1)) < n_sources:
            try:
                return int(lex.group(1)), 0.0, base64.urlsafe_b64decode(lex.group(2)).decode()
            except (binascii.Error, UnicodeDecodeError):
                pass
    if m is None or int(m.group(1)) >= n_sources:
        raise BadCursor(f"not a cursor of this listing: {cursor[:80]!r}")
    return int(m.group(1)), float(m.group(2)), m.group(3)


async def _first_rank(queue: Queue, src: Source) -> int:
    """Where a listing of ``src`` starts: 0, or past the members eligible now (``delayed``)."""
    if src.above is None:
        return 0
    return int(await queue.client.redis.zcount(src.key, "-inf", src.above))


async def _start_after(queue: Queue, src: Source, score: float, job_id: str) -> tuple[int, bool]:
    """The rank to read from after ``(score, job_id)``, and whether ties of
    ``score`` must still be skipped up to ``job_id`` (it left the index)."""
    redis = queue.client.redis
    pipe = redis.pipeline(transaction=False)
    if src.parked:  # job_id is the member; the members sort by their text
        pipe.zrank(src.key, job_id)
        pipe.zlexcount(src.key, "-", f"({job_id}")
        rank, before = await pipe.execute()
        return (int(rank) + 1 if rank is not None else int(before)), False
    if src.newest_first:
        pipe.zrevrank(src.key, job_id)
        pipe.zcount(src.key, f"({_score_text(score)}", "+inf")
    else:
        pipe.zrank(src.key, job_id)
        pipe.zcount(src.key, "-inf", f"({_score_text(score)}")
    rank, before = await pipe.execute()
    if rank is not None:
        return int(rank) + 1, False
    return int(before), True


async def page_jobs(
    queue: Queue,
    *,
    state: JobState | str | None = None,
    kind: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    max_scan: int = MAX_SCAN,
) -> Page:
    """The next ``limit`` jobs of ``queue`` (of ``state`` and ``kind`` when given) after ``cursor``.

    Raises ``BadCursor`` for a cursor this listing did not hand out. A page may
    hold fewer than ``limit`` jobs and still have a next cursor when ``kind``
    is rare: it stops after reading ``max_scan`` ids, so no request walks a
    whole index.
    """
    now = await server_now_ms(queue.client) if state == "delayed" else 0
    srcs = sources(queue, state, now)
    redis = queue.client.redis
    index, after_score, after_id = 0, 0.0, ""
    if cursor:
        index, after_score, after_id = decode_cursor(cursor, len(srcs))
    out: list[JobInfo] = []
    scanned = 0
    last: tuple[int, float, str] | None = None
    while index < len(srcs):
        src = srcs[index]
        skip_ties = False
        if after_id:
            start, skip_ties = await _start_after(queue, src, after_score, after_id)
        else:
            start = await _first_rank(queue, src)
        while True:
            # Without a KIND filter every id read is shown: read only what the
            # page still needs (50 hashes, not 200, for a first page).
            size = _BATCH if kind is not None or skip_ties else min(_BATCH, limit - len(out))
            read = redis.zrevrange if src.newest_first else redis.zrange
            got = await read(src.key, start, start + size - 1, withscores=True)
            batch = [(_text(m), float(s)) for m, s in got]
            if not batch:
                break
            start += len(batch)
            full = len(batch) == size
            if skip_ties:
                # The job we stopped after is gone: skip the ids that sorted
                # before it among equal scores (a zset orders ties by member).
                batch = [
                    item for item in batch if not _tie_before(item, after_score, after_id, src.newest_first)
                ]
                skip_ties = not batch
                if not batch:
                    if full:
                        continue
                    break
            pipe = redis.pipeline(transaction=False)
            for member, _ in batch:
                pipe.hgetall(queue.keys.job(_job_id(src, member)))
            hashes = await pipe.execute(raise_on_error=False)
            for (member, score), raw in zip(batch, hashes, strict=True):
                scanned += 1
                last = (index, score, member)
                info = _info(queue, src, _job_id(src, member), raw, kind)
                if info is not None:
                    out.append(info)
                if len(out) >= limit or scanned >= max_scan:
                    return Page(out, encode_cursor(*last, src.parked), scanned)
            if not full:
                break
        index += 1
        after_id = ""
    return Page(out, None, scanned)


def _tie_before(item: tuple[str, float], score: float, job_id: str, newest_first: bool) -> bool:
    """Whether ``item`` sorts at or before ``(score, job_id)`` among equal scores."""
    if item[1] != score:
        return False
    return item[0] >= job_id if newest_first else item[0] <= job_id


def _job_id(src: Source, member: str) -> str:
    return member.rsplit("\t", 1)[-1][1:] if src.parked else member


def _info(queue: Queue, src: Source, job_id: str, raw: Any, kind: str | None) -> JobInfo | None:
    """The snapshot to list for one index entry, or ``None`` to skip it."""
    if isinstance(raw, Exception):
        # A key of the wrong type where a job hash should be: an error row.
        if kind is not None:
            return None
        return JobInfo.unreadable(queue.name, job_id, src.state, str(raw))
    if not raw:
        return None  # purged between the two reads
    if kind is not None and _text(raw.get(b"kind", b"")) != kind:
        return None
    if src.pending_only and raw.get(b"state") != b"pending":
        return None  # left in the retrying index by a claim that cancelled it (until purged)
    return JobInfo.from_hash(
        queue.name, job_id, raw, indexed_as=src.state, encryption=queue.client.encryption
    )
