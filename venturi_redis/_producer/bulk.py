"""Bulk actions by filter: retry dead jobs, cancel jobs, purge finished jobs (issue 41).

``queue.retry_dead``, ``queue.cancel_jobs`` and ``queue.purge`` take the same
filters (``kind``, ``error_type``, ``since``, ``until``, ``note_contains``,
``limit``) and run the same way:

1. The candidates are read from the state's index zset in pages of
   ``PAGE`` ids, by score: a finished job's score is when it finished (died),
   so ``since`` / ``until`` bound the read in Redis itself (``ZRANGEBYSCORE``).
   The upper bound is capped at the time the action started, so a job that
   dies again during a redrive is not redriven twice, and the run ends.
2. Only the fields the filters need are read, one pipeline per page: ``HMGET``
   of those of the job's ``kind``, ``note``, ``created_at`` the filters test
   (``_fields``: ``kind`` for ``error_type`` alone); for ``error_type`` the
   journal's last two entries (``XREVRANGE ... COUNT 2``: the ``dead`` entry,
   or the ``failed`` entry a retry backstop writes just before it). No filter
   on a job's fields: no read of the jobs at all.
3. The matching ids are handed, ``BATCH`` at a time, to the scripts that
   do the transition and re-check each job's state before writing
   (``retry_dead.lua``, ``purge.lua`` given ids, ``cancel_pending.lua`` for
   pending jobs and ``cancel.lua`` for the jobs it leaves, ``cancel.lua`` per
   job for the other states): a
   job retried, cancelled or purged meanwhile (by a worker, another operator,
   an earlier run) is skipped. Each script call stays short, so a worker's
   claims interleave with a redrive of a million jobs.

A job acted on leaves the index read, so running the same action again (after
an interruption, or twice by mistake) does what is left and nothing twice.
Progress is reported after every batch to ``on_progress`` (a ``BulkProgress``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError
from .._store.store import Retried
from .base import _text

if TYPE_CHECKING:
    from .base import QueueLike

# Candidates read per page (one round trip of two ZRANGEBYSCORE: _page; then one
# pipeline of reads when a filter reads the jobs' fields).
PAGE = 1000
# Of a page, the members read with their scores (the others without: _page).
TAIL = 50
# Jobs per script call: about a fifth of a millisecond of Redis's time for a
# dead retry (~100k instructions a job, benchmarks/redrive_cost.py), so a live
# worker's enqueue or claim never waits long behind a redrive; a million still
# go in well under a minute (benchmarks/redrive.py measures both).
BATCH = 15

# The states ``cancel_jobs`` takes (cancel.lua: a running job's cancel is a request).
CANCELLABLE = ("pending", "suspended", "waiting", "running")


@dataclass(frozen=True, slots=True)
class BulkProgress:
    """How far a bulk action (``retry_dead``, ``cancel_jobs``, ``purge``) has gone.

    Given to ``on_progress`` after each batch, and once more at the end
    (``finished``).

    Attributes:
        queue: The queue (a sharded queue reports each partition on its own).
        action: ``"retry"``, ``"cancel"`` or ``"purge"``.
        state: The state acted on (``"dead"`` for a retry).
        total: Candidates in the index range when the action started: the
            upper bound of ``scanned`` (jobs whose fields filter them out are
            counted, they are read).
        scanned: Candidates read so far.
        matched: Of them, those matching the filters.
        done: Jobs acted on: moved to pending, cancelled (or, running, asked
            to stop), removed.
        skipped: Matching jobs not acted on: in another state by then
            (retried, cancelled or purged meanwhile), or refused because
            their own data is corrupt.
        finished: Whether this is the last report.
    """

    queue: str
    action: str
    state: str
    total: int
    scanned: int = 0
    matched: int = 0
    done: int = 0
    skipped: int = 0
    finished: bool = False


OnProgress = Callable[[BulkProgress], None]


@dataclass(frozen=True, slots=True)
class Filter:
    """The checked filters of a bulk action (``make_filter``)."""

    kind: str | None = None
    error_type: str | None = None
    note_contains: str | None = None
    since_ms: int | None = None  # inclusive
    until_ms: int | None = None  # inclusive
    limit: int | None = None

    @property
    def reads_fields(self) -> bool:
        """Whether the jobs' own fields must be read (not only their index scores)."""
        return self.kind is not None or self.note_contains is not None or self.error_type is not None


def _instant(value: datetime | timedelta | None, what: str, now_ms: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ConfigurationError(f"{what} must be a timedelta >= 0 (how long ago), got {value!r}")
        return now_ms - to_ms(value, what)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"{what} is a naive datetime ({value.isoformat()}): give one with a timezone "
                "(datetime.now(timezone.utc) - ...) or a timedelta back from now"
            )
        return int(value.timestamp() * 1000)
    raise ConfigurationError(
        f"{what} must be an aware datetime or a timedelta back from now, got {type(value).__name__}"
    )


class BulkFilters(TypedDict, total=False):
    """The filters of ``retry_dead``, ``cancel_jobs`` and ``purge`` (every queue face), all optional.

    Declared once: the faces take them as ``**filters`` and pass them on to
    ``ops.py``, which checks them here (``make_filter``).

    Attributes:
        kind: Only jobs of this KIND.
        error_type: Only jobs whose last failure raised this exception (its
            public name as the journal keeps it, e.g. ``"ValueError"``).
        since: Only jobs at or after this (an aware datetime, or a timedelta
            back from now): when each died (``retry_dead``), finished
            (``purge``) or was enqueued (``cancel_jobs``).
        until: Only jobs at or before this (the same).
        note_contains: Only jobs whose note (the error) holds this text.
        limit: At most this many (``None``: all that match).
        on_progress: Called with a ``vr.BulkProgress`` after each batch.
    """

    kind: str | None
    error_type: str | None
    since: datetime | timedelta | None
    until: datetime | timedelta | None
    note_contains: str | None
    limit: int | None
    on_progress: OnProgress | None


BULK_FILTERS: frozenset[str] = BulkFilters.__optional_keys__


def make_filter(filters: BulkFilters, now_ms: int) -> Filter:
    """The filters checked, ``since`` / ``until`` as ms at ``now_ms``.

    Raises:
        ConfigurationError: A text filter that is not a non-empty string,
            ``since`` / ``until`` not an aware datetime or a timedelta >= 0,
            ``since`` after ``until``, a ``limit`` that is not an int >= 0.
        TypeError: A name that is no filter (a misspelt keyword).
    """
    for name in filters:
        if name not in BULK_FILTERS:
            raise TypeError(f"got an unexpected keyword argument {name!r} (filters: {sorted(BULK_FILTERS)})")
    kind, error_type = filters.get("kind"), filters.get("error_type")
    note_contains, limit = filters.get("note_contains"), filters.get("limit")
    since, until = filters.get("since"), filters.get("until")
    for what, value in (("kind", kind), ("error_type", error_type), ("note_contains", note_contains)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigurationError(f"{what} must be a non-empty string (or None for any), got {value!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigurationError(f"limit must be an int >= 0 (or None for no limit), got {limit!r}")
    since_ms = _instant(since, "since", now_ms)
    until_ms = _instant(until, "until", now_ms)
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise ConfigurationError(
            f"since ({since!r}) is after until ({until!r}): nothing could match; swap them"
        )
    return Filter(kind, error_type, note_contains, since_ms, until_ms, limit)


# -- reading the candidates ------------------------------------------------------------------


def _bound(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


async def _page(redis: Any, key: str, lo: str, hi: str) -> tuple[list[str], float, int]:
    """The first ``PAGE`` members of ``key`` scored in [lo, hi], the last one's score, and how
    many at the page's end have that score (``PAGE`` when it cannot tell: all of them may).

    The members are read without their scores but the last ``TAIL`` (in one
    round trip): a score costs Redis a double formatted in its reply, more
    than the member itself, and the pager needs only where the last score
    starts. A page whose tail is all one score (a burst of deaths within a
    millisecond), or that changed between the two reads, is read again with
    every score.
    """
    k = min(TAIL, PAGE)
    pipe = redis.pipeline(transaction=False)
    pipe.zrangebyscore(key, lo, hi, start=0, num=PAGE)
    pipe.zrangebyscore(key, lo, hi, start=PAGE - k, num=k, withscores=True)
    members, tail = await pipe.execute()
    page = [_text(m) for m in members]
    if len(page) < PAGE:
        return page, 0.0, 0
    last = float(tail[-1][1]) if tail else 0.0
    at_last = sum(1 for _, s in tail if float(s) == last)
    if at_last < k and [_text(m) for m, _ in tail] == page[-k:]:
        return page, last, at_last
    rows = await redis.zrangebyscore(key, lo, hi, start=0, num=PAGE, withscores=True)
    page = [_text(m) for m, _ in rows]
    if len(page) < PAGE:
        return page, 0.0, 0
    last = float(rows[-1][1])
    return page, last, sum(1 for _, s in rows if float(s) == last)


async def _score_pages(redis: Any, key: str, lo: str, hi: str) -> AsyncIterator[list[str]]:
    """The members of ``key`` scored in [lo, hi], ascending, page by page, read afresh each page.

    Each page starts at the last page's last score, so members acted on
    (gone) and members left (filtered out) shift nothing: no offset is kept.
    The members of that last score are left for the next page; a page whose
    members all share one score is read whole (by offset, within that score)
    and the next starts past it.
    """
    while True:
        page, last, at_last = await _page(redis, key, lo, hi)
        if not page:
            return
        if len(page) < PAGE:
            yield page
            return
        if at_last < len(page):
            yield page[: len(page) - at_last]
            lo = _bound(last)
            continue
        same: list[str] = []
        while True:
            got = await redis.zrangebyscore(key, _bound(last), _bound(last), start=len(same), num=PAGE)
            same += [_text(m) for m in got]
            if len(got) < PAGE:
                break
        for i in range(0, len(same), PAGE):
            yield same[i : i + PAGE]
        lo = f"({_bound(last)}"


async def _parked_pages(redis: Any, key: str) -> AsyncIterator[list[str]]:
    """The job ids parked on a limit (``limits:parked``, members ``<kind>\\t<key>\\t<level><id>``,
    lex-ordered), page by page past the last member read."""
    after = "-"
    while True:
        members = [_text(m) for m in await redis.zrangebylex(key, after, "+", start=0, num=PAGE)]
        if not members:
            return
        yield [m.rsplit("\t", 1)[-1][1:] for m in members]
        if len(members) < PAGE:
            return
        after = "(" + members[-1]


def _fields(flt: Filter, by_created: bool) -> tuple[str, ...]:
    """The job fields a page's filter reads: only those it tests (a field read is Redis's work
    and the client's, per candidate), ``kind`` for ``error_type`` alone (a job gone since, or
    whose job key is not a hash, is none of ours)."""
    names = [n for n, on in (("kind", flt.kind), ("note", flt.note_contains)) if on is not None]
    if by_created:
        names.append("created_at")
    return tuple(names) or ("kind",)


def _matches(flt: Filter, names: tuple[str, ...], values: Any, entries: Any, by_created: bool) -> bool:
    if isinstance(values, Exception) or values is None:
        return False  # a job key of another type: its own data is corrupt; none of ours
    got = dict(zip(names, (_text(x) for x in values), strict=True))
    if not any(got.values()):
        return False  # gone (purged or never there)
    if flt.kind is not None and got["kind"] != flt.kind:
        return False
    if flt.note_contains is not None and flt.note_contains not in got["note"]:
        return False
    if by_created:
        created = got["created_at"]
        at = int(created) if created.isdigit() else None
        if at is None or (flt.since_ms is not None and at < flt.since_ms):
            return False
        if flt.until_ms is not None and at > flt.until_ms:
            return False
    if flt.error_type is not None:
        if isinstance(entries, Exception) or not entries:
            return False
        for _entry_id, raw in entries:
            found = raw.get(b"error_type")
            if found is not None:
                return _text(found) == flt.error_type
        return False
    return True


async def _matching(queue: QueueLike, flt: Filter, page: list[str], by_created: bool) -> list[str]:
    """The ids of ``page`` whose fields match ``flt`` (one pipeline; none when no field is filtered)."""
    if not page or (not flt.reads_fields and not by_created):
        return page
    names = _fields(flt, by_created)
    pipe = queue.client.redis.pipeline(transaction=False)
    for job_id in page:
        pipe.hmget(queue.keys.job(job_id), names)
        if flt.error_type is not None:
            pipe.xrevrange(queue.keys.journal(job_id), "+", "-", count=2)
    replies = await pipe.execute(raise_on_error=False)
    step = 2 if flt.error_type is not None else 1
    return [
        job_id
        for i, job_id in enumerate(page)
        if _matches(flt, names, replies[i * step], replies[i * step + 1] if step == 2 else None, by_created)
    ]


@dataclass(frozen=True, slots=True)
class _Range:
    """Where a bulk action reads its candidates."""

    keys: tuple[str, ...]  # zsets read by score, in order
    lo: str
    hi: str
    parked: str | None = None  # limits:parked, read after them (pending)
    by_created: bool = False  # since/until on created_at (read), not on the score


def _finished_range(queue: QueueLike, state: str, flt: Filter, now_ms: int, keep_ms: int = 0) -> _Range:
    key = {"completed": queue.keys.completed, "dead": queue.keys.dead, "cancelled": queue.keys.cancelled}
    hi = now_ms - keep_ms if flt.until_ms is None else min(flt.until_ms, now_ms - keep_ms)
    lo = "-inf" if flt.since_ms is None else str(flt.since_ms)
    return _Range((key[state],), lo, str(hi))


def _cancel_range(queue: QueueLike, state: str) -> _Range:
    k = queue.keys
    keys = {"suspended": (k.suspended,), "waiting": (k.waiting,), "running": (k.running,)}
    if state == "pending":
        return _Range(k.pending_high_first, "-inf", "+inf", parked=k.limits_parked, by_created=True)
    return _Range(keys[state], "-inf", "+inf", by_created=True)


async def _total(queue: QueueLike, rng: _Range) -> int:
    pipe = queue.client.redis.pipeline(transaction=False)
    for key in rng.keys:
        pipe.zcount(key, rng.lo, rng.hi)
    if rng.parked is not None:
        pipe.zcard(rng.parked)
    return sum(int(n) for n in await pipe.execute())


async def _candidates(queue: QueueLike, rng: _Range) -> AsyncIterator[list[str]]:
    redis = queue.client.redis
    for key in rng.keys:
        async for page in _score_pages(redis, key, rng.lo, rng.hi):
            yield page
    if rng.parked is not None:
        async for page in _parked_pages(redis, rng.parked):
            yield page


# -- acting ------------------------------------------------------------------------------------


async def _run(
    queue: QueueLike,
    action: str,
    state: str,
    flt: Filter,
    rng: _Range,
    act: Callable[[list[str]], Awaitable[tuple[list[str], dict[str, str]]]],
    on_progress: OnProgress | None,
) -> Retried:
    """Read ``rng``'s candidates, keep those matching ``flt``, and ``act`` on them by batches."""
    out = Retried([], {})
    report = BulkProgress(queue.name, action, state, total=await _total(queue, rng))
    if flt.limit == 0:
        _tell(on_progress, report, finished=True)
        return out
    scanned = matched = skipped = 0
    async for page in _candidates(queue, rng):
        scanned += len(page)
        found = await _matching(queue, flt, page, rng.by_created)
        matched += len(found)
        for i in range(0, len(found), BATCH):
            chunk = found[i : i + BATCH]
            if flt.limit is not None:
                chunk = chunk[: flt.limit - len(out.moved)]
            acted, refused = await act(chunk)
            out.moved.extend(acted)
            out.refused.update(refused)
            skipped += len(chunk) - len(acted)
            report = replace(report, scanned=scanned, matched=matched, done=len(out.moved), skipped=skipped)
            _tell(on_progress, report)
            if flt.limit is not None and len(out.moved) >= flt.limit:
                _tell(on_progress, report, finished=True)
                return out
        if not found:
            report = replace(report, scanned=scanned, matched=matched)
            _tell(on_progress, report)
    _tell(on_progress, report, finished=True)
    return out


def _tell(on_progress: OnProgress | None, report: BulkProgress, *, finished: bool = False) -> None:
    if on_progress is not None:
        on_progress(replace(report, finished=True) if finished else report)


async def retry_dead(
    queue: QueueLike, flt: Filter, now_ms: int, note: str, on_progress: OnProgress | None = None
) -> Retried:
    """Move the dead jobs matching ``flt`` (oldest death first) back to pending."""

    async def act(ids: list[str]) -> tuple[list[str], dict[str, str]]:
        got = await queue.store.retry_dead(ids, note)
        return got.moved, got.refused

    rng = _finished_range(queue, "dead", flt, now_ms)
    return await _run(queue, "retry", "dead", flt, rng, act, on_progress)


async def cancel_jobs(
    queue: QueueLike, state: str, flt: Filter, now_ms: int, note: str, on_progress: OnProgress | None = None
) -> Retried:
    """Cancel the jobs of ``state`` matching ``flt`` (``since`` / ``until`` on their enqueue time)."""
    # Jobs enqueued after the start are not this action's: the run ends.
    until = now_ms if flt.until_ms is None else min(flt.until_ms, now_ms)
    capped = Filter(flt.kind, flt.error_type, flt.note_contains, flt.since_ms, until, flt.limit)

    async def act(ids: list[str]) -> tuple[list[str], dict[str, str]]:
        done: set[str] = set()
        refused: dict[str, str] = {}
        rest = ids
        if state == "pending":
            # One call for the batch (cancel_pending.lua); cancel.lua, one call each, for the
            # jobs it leaves (in another state by now, ordered, with dependents).
            got = await queue.store.cancel_pending(ids, note)
            done.update(got.cancelled)
            refused.update(got.refused)
            rest = got.others
        if rest:
            for job_id, one in zip(rest, await queue.store.cancel_many(rest, note), strict=True):
                if isinstance(one, Exception):
                    refused[job_id] = str(one)
                elif one.applied:
                    done.add(job_id)
        return [job_id for job_id in dict.fromkeys(ids) if job_id in done], refused

    return await _run(queue, "cancel", state, capped, _cancel_range(queue, state), act, on_progress)


async def purge(
    queue: QueueLike,
    state: str,
    flt: Filter,
    now_ms: int,
    keep_ms: int,
    on_progress: OnProgress | None = None,
) -> int:
    """Remove the finished jobs of ``state`` matching ``flt`` that finished ``keep_ms`` ago or more."""

    async def act(ids: list[str]) -> tuple[list[str], dict[str, str]]:
        removed = await queue.store.purge_ids(state, ids)
        # The script says how many, not which: the first ``removed`` stand for them.
        return ids[:removed], {}

    rng = _finished_range(queue, state, flt, now_ms, keep_ms)
    return len((await _run(queue, "purge", state, flt, rng, act, on_progress)).moved)


async def count_matching(queue: QueueLike, state: str, flt: Filter, now_ms: int) -> int:
    """How many jobs of ``state`` match ``flt`` now (reads only: a bulk action's dry run).

    One ``ZCOUNT`` when no field of the jobs is filtered; else every
    candidate is read, page by page, as the action would.
    """
    rng = (
        _finished_range(queue, state, flt, now_ms)
        if state in ("completed", "dead", "cancelled")
        else _cancel_range(queue, state)
    )
    if not flt.reads_fields and not rng.by_created:
        n = await _total(queue, rng)
        return n if flt.limit is None else min(n, flt.limit)
    if rng.by_created:
        until = now_ms if flt.until_ms is None else min(flt.until_ms, now_ms)
        flt = Filter(flt.kind, flt.error_type, flt.note_contains, flt.since_ms, until, flt.limit)
    n = 0
    async for page in _candidates(queue, rng):
        n += len(await _matching(queue, flt, page, rng.by_created))
        if flt.limit is not None and n >= flt.limit:
            return flt.limit
    return n
