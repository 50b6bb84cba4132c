"""Read-side records: a job's journal entries and a snapshot of the job."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .codec import unpack
from .enums import JobState, Priority
from .errors import PayloadError

_JOURNAL_CORE = {"event", "at", "run", "note", "attachment"}


def ms_to_dt(ms: int | float) -> datetime:
    """Milliseconds since the epoch (the unit of every stored time) to a UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _blob(value: bytes | None) -> Any:
    """Decode an optional msgpack field; undecodable bytes are shown, not raised."""
    if not value:
        return None
    try:
        return unpack(value)
    except PayloadError:
        return value


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One event in a job's journal (a Redis stream entry).

    ``event`` is one of: enqueued, merged, claimed, completed, paused, failed,
    dead, lease_expired, released, refused, suspended, resumed, cancelled,
    retried. ``run`` is the run it belongs to (0 before the first claim).
    ``details`` holds the event's other fields as text (``delay_ms`` of a
    failure, ``worker`` of a claim, ``reason`` of a death, …).
    """

    id: str
    at: datetime
    event: str
    run: int = 0
    note: str | None = None
    attachment: Any = None
    details: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_stream(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> JournalEntry:
        f = {_text(k): v for k, v in fields.items()}
        note = _text(f.get("note")) or None
        return cls(
            id=_text(entry_id),
            at=ms_to_dt(int(_text(f.get("at")) or 0)),
            event=_text(f.get("event")),
            run=int(_text(f.get("run")) or 0),
            note=note,
            attachment=_blob(f.get("attachment")),
            details={k: _text(v) for k, v in f.items() if k not in _JOURNAL_CORE},
        )

    @classmethod
    def from_xrange(cls, raw: list[Any]) -> list[JournalEntry]:
        """Entries from an XRANGE reply as a script returns it (flat field lists)."""
        out: list[JournalEntry] = []
        for entry_id, flat in raw:
            fields = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(cls.from_stream(entry_id, fields))
        return out


# The hash fields an `enqueued` entry is made from, in this order.
ENQUEUED_FIELDS = ("created_at", "priority", "eligible_at")


def enqueued_entry(created_at: Any, priority: Any, eligible_at: Any) -> tuple[str, dict[bytes, bytes]]:
    """The `enqueued` stream entry of a job whose journal stream does not exist yet.

    Enqueue writes no stream (a one-entry stream costs ~4.7 KB on Redis 7.0);
    the job's first journaled event writes this entry first (``materialize`` in
    lua/include/common.lua), with the same id and fields, from the same hash
    fields. A reader of a job with no stream returns it as if it were there.
    Returns ``(entry_id, fields)`` as XRANGE gives them.
    """
    created = _text(created_at) or "0"
    entry_id = "0-1" if int(created) == 0 else f"{created}-0"
    fields = {
        b"event": b"enqueued",
        b"at": created.encode(),
        b"run": b"0",
        b"priority": _text(priority).encode(),
        b"eligible_at": _text(eligible_at).encode(),
    }
    return entry_id, fields


def claim_history(raw: list[Any]) -> list[Any]:
    """The history a claim returns for one job, as XRANGE gives it.

    A first claim's journal is only the `enqueued` entry the claim has just
    written, and claim.lua sends that entry's values (created_at, priority,
    eligible_at) instead of the entry: a nested reply costs Redis more to
    build. Any other claim sends the XRANGE reply, returned as it is.
    """
    if raw and isinstance(raw[0], (bytes, str)):
        return [enqueued_entry(*raw)]
    return raw


def journal_from(raw: list[Any], job_fields: Sequence[Any] | None) -> list[Any]:
    """An XRANGE reply, or the synthesized `enqueued` entry when it is empty.

    ``job_fields`` are the job's ``ENQUEUED_FIELDS`` (HMGET order), or ``None``
    / all-``None`` when the job does not exist: then the journal is empty.
    """
    if raw or not job_fields or job_fields[0] is None:
        return raw
    return [enqueued_entry(*job_fields)]


class LazyJournal(Sequence[JournalEntry]):
    """Journal entries parsed on first use.

    A dedup merge hands the pending job's journal to ``Task.merge``; most merges
    never look at it, and a busy job's journal can hold hundreds of entries, so
    parsing waits until someone reads it. So does a claimed job's history,
    which most handlers never read. ``raw`` is an XRANGE reply or a claim's
    history (``claim_history``).
    """

    __slots__ = ("_entries", "_raw")

    def __init__(self, raw: list[Any]) -> None:
        self._raw = raw
        self._entries: list[JournalEntry] | None = None

    def _parsed(self) -> list[JournalEntry]:
        if self._entries is None:
            self._entries = JournalEntry.from_xrange(claim_history(self._raw))
            self._raw = []
        return self._entries

    def __getitem__(self, index: Any) -> Any:
        return self._parsed()[index]

    def __len__(self) -> int:
        return len(self._parsed())

    def __iter__(self) -> Iterator[JournalEntry]:
        return iter(self._parsed())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._parsed())


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of one job as stored in its hash.

    ``payload`` and ``carry`` are the decoded msgpack documents (dicts); use
    ``YourTask.model_validate(info.payload)`` for the typed task.
    """

    id: str
    queue: str
    kind: str
    state: JobState
    priority: Priority
    payload: Any
    carry: Any
    run_count: int
    failures: int
    eligible_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    note: str | None
    attachment: Any
    result: Any
    output: Any
    lease_owner: str | None
    lease_expires_at: datetime | None
    dedup: str | None

    @classmethod
    def from_hash(cls, queue: str, job_id: str, raw: dict[bytes, bytes]) -> JobInfo:
        """Parse ``HGETALL`` of a job hash. The id is the key's, not a field;
        fields no script has written yet take their defaults (``run_count``
        and ``failures`` 0, ``updated_at`` the creation time)."""
        f = {_text(k): v for k, v in raw.items()}

        def num(name: str) -> int:
            return int(_text(f.get(name)) or 0)

        def when(name: str) -> datetime | None:
            v = _text(f.get(name))
            return ms_to_dt(int(v)) if v else None

        created = when("created_at") or ms_to_dt(0)
        return cls(
            id=job_id,
            queue=queue,
            kind=_text(f.get("kind")),
            state=JobState(_text(f.get("state"))),
            priority=Priority.parse(_text(f.get("priority")) or "normal"),
            payload=_blob(f.get("payload")),
            carry=_blob(f.get("carry")),
            run_count=num("run_count"),
            failures=num("failures"),
            eligible_at=when("eligible_at"),
            created_at=created,
            updated_at=when("updated_at") or created,
            finished_at=when("finished_at"),
            note=_text(f.get("note")) or None,
            attachment=_blob(f.get("attachment")),
            result=_blob(f.get("result")),
            output=_blob(f.get("output")),
            lease_owner=_text(f.get("lease_owner")) or None,
            lease_expires_at=when("lease_expires"),
            dedup=_text(f.get("dedup")) or None,
        )
