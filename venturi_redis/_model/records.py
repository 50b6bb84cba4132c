"""Read-side records: a job's journal entries and a snapshot of the job."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from .codec import unpack
from .enums import DeadReason, JobState, Priority
from .errors import PayloadError
from .sealing import MAGIC, Encrypted, Encryption, sealed_key_id

_JOURNAL_CORE = {"event", "at", "run", "note", "attachment"}


def ms_to_dt(ms: int | float) -> datetime:
    """Milliseconds since the epoch (the unit of every stored time) to a UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _blob(value: bytes | None, encryption: Encryption | None = None) -> Any:
    """Decode an optional msgpack field; undecodable bytes are shown, not raised.

    An encrypted value (``_model/sealing.py``) is opened with ``encryption``;
    without its key it is shown as ``vr.Encrypted``, never raised.
    """
    if not value:
        return None
    plain = value
    if value[:1] == MAGIC:
        kid = sealed_key_id(value)
        if kid is not None and (encryption is None or not encryption.holds(value)):
            return Encrypted(kid)
        try:
            plain = value if encryption is None else encryption.open(value)
        except PayloadError:
            return value  # does not decrypt: shown as corrupt
    try:
        return unpack(plain)
    except PayloadError:
        return value


# How much of a corrupt field's stored value a record keeps, for display.
_SHOWN = 64


class _Fields:
    """The fields of one hash or stream entry, parsed tolerantly for reading.

    A value that does not parse (``failures=xyz``, ``state=zombie``, a
    payload that is not msgpack) takes a neutral default and is recorded in
    ``corrupt`` (field name -> the stored text, cut to 64 characters), so that
    one hand-edited or damaged field is shown as such and never makes a
    listing fail. Only the read side parses this way; the worker's claim path
    has its own strict checks (a corrupt job is quarantined there).
    """

    __slots__ = ("corrupt", "encryption", "f")

    def __init__(
        self, raw: dict[bytes, bytes] | dict[Any, Any], encryption: Encryption | None = None
    ) -> None:
        self.f = {_text(k): v for k, v in raw.items()}
        self.corrupt: dict[str, str] = {}
        self.encryption = encryption

    def text(self, name: str) -> str:
        return _text(self.f.get(name))

    def bad(self, name: str) -> None:
        self.corrupt[name] = self.text(name)[:_SHOWN]

    def num(self, name: str) -> int:
        v = self.text(name)
        if not v:
            return 0
        try:
            return int(v)
        except ValueError:
            self.bad(name)
            return 0

    def when(self, name: str) -> datetime | None:
        v = self.text(name)
        if not v:
            return None
        try:
            return ms_to_dt(int(v))
        except (ValueError, OverflowError, OSError):
            self.bad(name)
            return None

    def blob(self, name: str) -> Any:
        value = self.f.get(name)
        decoded = _blob(value, self.encryption)
        if value and decoded is value:
            self.bad(name)
            return None
        return decoded


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One event in a job's journal (a Redis stream entry).

    ``event`` is one of: enqueued, merged, claimed, completed, paused, failed,
    dead, lease_expired, released, refused, suspended, resumed, cancelled,
    retried; for a job in a workflow also waiting (``ids``, ``count``),
    dependency_completed and dependency_failed (``dependency``, ``policy``),
    and ready (its last dependency finished: it is pending). ``run`` is the
    run it belongs to (0 before the first claim).
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
    corrupt: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_stream(
        cls, entry_id: bytes | str, fields: dict[bytes, bytes], encryption: Encryption | None = None
    ) -> JournalEntry:
        """Parse one stream entry; a field that does not parse is in ``corrupt``
        (its stored text), and takes its default (``at`` the epoch, ``run`` 0).
        An attachment is opened with ``encryption`` (else ``vr.Encrypted``)."""
        p = _Fields(fields, encryption)
        return cls(
            id=_text(entry_id),
            at=p.when("at") or ms_to_dt(0),
            event=p.text("event"),
            run=p.num("run"),
            note=p.text("note") or None,
            attachment=p.blob("attachment"),
            details={k: _text(v) for k, v in p.f.items() if k not in _JOURNAL_CORE},
            corrupt=p.corrupt,
        )

    @classmethod
    def from_xrange(cls, raw: list[Any], encryption: Encryption | None = None) -> list[JournalEntry]:
        """Entries from an XRANGE reply as a script returns it (flat field lists)."""
        out: list[JournalEntry] = []
        for entry_id, flat in raw:
            fields = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(cls.from_stream(entry_id, fields, encryption))
        return out


# The hash fields a journal's implied entries are made from (HMGET order):
# the `enqueued` entry's (created_at, priority, eligible_at), then the running
# run's claim (state, run_count, lease_owner, claimed_at).
ENQUEUED_FIELDS = ("created_at", "priority", "eligible_at")
JOURNAL_FIELDS = (*ENQUEUED_FIELDS, "state", "run_count", "lease_owner", "claimed_at")


def enqueued_entry(created_at: Any, priority: Any, eligible_at: Any) -> tuple[str, dict[bytes, bytes]]:
    """The `enqueued` entry of a job whose journal does not hold it (yet).

    Enqueue writes no journal; the hash's created_at, priority and
    eligible_at say what that entry says until a script changes one of them,
    and such a script writes it first, with the same id and fields
    (``materialize`` in lua/include/journal.lua). A job that completes on its
    first run never has it written. A reader returns it as if it were there.
    Returns ``(entry_id, fields)`` as XRANGE gives them.
    """
    created = _text(created_at) or "0"
    # A created_at edited by hand (`yesterday`) is no stream id: the entry gets
    # the first one, and its `at` is marked corrupt when parsed (JournalEntry).
    ok = created.isascii() and created.isdigit() and int(created) != 0
    entry_id = f"{created}-0" if ok else "0-1"
    fields = {
        b"event": b"enqueued",
        b"at": created.encode(),
        b"run": b"0",
        b"priority": _text(priority).encode(),
        b"eligible_at": _text(eligible_at).encode(),
    }
    return entry_id, fields


def _claimed_entry(
    after_id: str, claimed_at: bytes, run: bytes, worker: bytes
) -> tuple[str, dict[bytes, bytes]]:
    """A run's `claimed` entry, from the claim the entry ending the run carries (or the hash)."""
    at = _text(claimed_at)
    entry_id = f"{at}-0" if at.isascii() and at.isdigit() else "0-1"
    if entry_id == after_id:  # claimed in the same millisecond as the entry before it
        entry_id = f"{at}-1"
    return entry_id, {b"event": b"claimed", b"at": claimed_at, b"run": run, b"worker": worker}


def _as_dict(fields: Any) -> dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2], strict=True))


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else _text(value).encode()


def journal_from(raw: list[Any], job_fields: Sequence[Any] | None) -> list[Any]:
    """A job's whole journal, as XRANGE gives it, from its stream and its hash.

    ``raw``: the XRANGE reply of its stream (possibly empty). ``job_fields``:
    the job's ``JOURNAL_FIELDS`` (HMGET order; ``ENQUEUED_FIELDS`` alone will
    do), or ``None`` / all-``None`` when the job does not exist: then the
    journal is what the stream holds.

    What the stream does not hold because the hash says it
    (lua/include/journal.lua) is put back where it belongs: the `enqueued`
    entry first, when the stream does not start with it; and each run's
    `claimed` entry, from the claim the entry that ended the run carries
    (``claimed_at``, ``worker``) or, for a running job, from its hash, right
    before the run's first entry (a refusal of a stale worker's late outcome,
    an operator's cancel request, or the entry that ends it). A run whose
    `claimed` entry the stream holds (claimed by a release before 0.2) keeps it.
    """
    if not job_fields or job_fields[0] is None:
        return raw
    entries = [(_text(entry_id), _as_dict(fields)) for entry_id, fields in raw]
    # Each run's claim: from the entry that ended it, or the hash (the run going on).
    claims: dict[bytes, tuple[bytes, bytes]] = {}
    for _, fields in entries:
        if fields.get(b"event") == b"claimed":
            claims[fields.get(b"run", b"0")] = (b"", b"")  # in the stream: nothing to put back
        elif (claimed_at := fields.get(b"claimed_at")) is not None:
            claims.setdefault(fields.get(b"run", b"0"), (claimed_at, fields.get(b"worker", b"")))
    if len(job_fields) >= len(JOURNAL_FIELDS):
        state, run_count, owner, claimed_at = job_fields[3:7]
        if _text(state) == "running" and claimed_at is not None:
            claims.setdefault(_b(run_count or b"0"), (_b(claimed_at), _b(owner or b"")))
    out: list[Any] = []
    if not entries or entries[0][1].get(b"event") != b"enqueued":
        out.append(enqueued_entry(*job_fields[:3]))
    for entry_id, fields in entries:
        run = fields.get(b"run", b"0")
        claim = claims.pop(run, None)
        if claim is not None and claim[0]:
            out.append(_claimed_entry(out[-1][0] if out else "", claim[0], run, claim[1]))
        out.append((entry_id, fields))
    for run, (claimed_at, worker) in claims.items():
        if claimed_at and run != b"0":  # the running run, with no entry of its own yet
            out.append(_claimed_entry(out[-1][0] if out else "", claimed_at, run, worker))
    return out


class LazyJournal(Sequence[JournalEntry]):
    """Journal entries parsed on first use.

    A dedup merge hands the pending job's journal to ``Task.merge``; most merges
    never look at it, and a busy job's journal can hold hundreds of entries, so
    parsing waits until someone reads it. So does a claimed job's history,
    which most handlers never read. ``raw`` is an XRANGE reply, with what the
    hash implies put back (``journal_from``), or, with ``job_fields``, the
    reply and the job's fields to put it back with when first read.
    """

    __slots__ = ("_encryption", "_entries", "_fields", "_raw")

    def __init__(
        self, raw: list[Any], job_fields: Sequence[Any] | None = None, encryption: Encryption | None = None
    ) -> None:
        self._raw = raw
        self._fields = job_fields
        self._encryption = encryption
        self._entries: list[JournalEntry] | None = None

    def _parsed(self) -> list[JournalEntry]:
        if self._entries is None:
            raw = self._raw if self._fields is None else journal_from(self._raw, self._fields)
            self._entries = JournalEntry.from_xrange(raw, self._encryption)
            self._raw = []
            self._fields = None
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
    ``YourTask.model_validate(info.payload)`` for the typed task. A value
    encrypted under a key the reading client does not hold (docs/security.md)
    is a ``vr.Encrypted`` (``<encrypted: key id ab12cd34>``), in every
    payload-like field: ``payload``, ``carry``, ``attachment``, ``result``,
    ``output``, ``progress``.

    ``corrupt`` names the fields whose stored value does not parse (a hash
    edited by hand, or damaged), each with its stored text; those fields hold
    a neutral default here: 0 for counts, ``None`` for times and documents,
    ``NORMAL`` for the priority, and for the state the state of the index the
    job was read from (``list_jobs``), else ``PENDING``. A snapshot is always
    returned, never an exception: reading must show what is wrong.
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
    # The run's last ``ctx.report_progress`` value (decoded msgpack), if any.
    progress: Any = None
    corrupt: dict[str, str] = field(default_factory=dict)
    waiting_on: tuple[str, ...] = ()
    """Workflows: the ids this job still waits on (not yet finished), sorted.

    Read by ``queue.get`` (and ``venturi job show``, the dashboard's job page);
    a listing (``list_jobs``) leaves it and ``dependents`` empty."""
    dependents: tuple[str, ...] = ()
    """Workflows: the ids of the jobs that wait (or waited) on this one, sorted."""
    # A job a schedule made (docs/schedules.md): the schedule's id and the fire
    # time it stands for (the first, when it catches up on missed ones); None else.
    schedule_id: str | None = None
    fire_at: datetime | None = None
    dedup_until: datetime | None = None
    """Throttle (``Task.dedup_window``, docs/dedup.md): when the window after this
    completed job ends, its dedup key held by it until then (Redis's clock); None else."""
    dead_reason: DeadReason | None = None
    """Why the job is dead (None unless it is): ``vr.DeadReason``. A job that died
    under a release before 0.2 has it in its journal's ``dead`` entry only:
    ``queue.get`` reads it from there."""
    expires_at: datetime | None = None
    """The job's start deadline (``enqueue(expires=...)``, ``Task.expires()``), on
    Redis's clock: a job not started by then goes dead, ``DeadReason.EXPIRED``."""
    order_key: str | None = None
    """The job's order key (``Task.order_key()``; docs/semantics.md, "Ordered keys"), or None."""
    order_waiting: bool = False
    """True while the job is pending behind an earlier job of its order key (not
    claimable until that one finishes or the key is resumed)."""
    order_position: int | None = None
    """Read by ``queue.get`` for a job with an order key: 0 while it holds its key
    (it is the one of its key that may run), N while N jobs of its key are ahead
    of it (the holder and the earlier waiting ones); None otherwise (finished, or
    a listing, which leaves it out)."""

    @classmethod
    def from_hash(
        cls,
        queue: str,
        job_id: str,
        raw: dict[bytes, bytes],
        *,
        indexed_as: JobState | None = None,
        encryption: Encryption | None = None,
    ) -> JobInfo:
        """Parse ``HGETALL`` of a job hash. The id is the key's, not a field;
        fields no script has written yet take their defaults (``run_count``
        and ``failures`` 0, ``updated_at`` the creation time). ``indexed_as``
        is the state of the index the id was read from, the state shown when
        the ``state`` field itself is corrupt. ``encryption`` opens encrypted
        values (the reading client's; without the key: ``vr.Encrypted``)."""
        p = _Fields(raw, encryption)
        try:
            state = JobState(p.text("state"))
        except ValueError:
            p.bad("state")
            state = indexed_as or JobState.PENDING
        try:
            priority = Priority.parse(p.text("priority") or "normal")
        except ValueError:
            p.bad("priority")
            priority = Priority.NORMAL
        created = p.when("created_at") or ms_to_dt(0)
        return cls(
            id=job_id,
            queue=queue,
            kind=p.text("kind"),
            state=state,
            priority=priority,
            payload=p.blob("payload"),
            carry=p.blob("carry"),
            run_count=p.num("run_count"),
            failures=p.num("failures"),
            eligible_at=p.when("eligible_at"),
            created_at=created,
            # A running job's claim is its latest change (claim.lua writes
            # claimed_at), a completed job's its end (complete.lua writes
            # finished_at alone).
            updated_at=max(
                p.when("updated_at") or created,
                p.when("claimed_at") or created,
                p.when("finished_at") or created,
            ),
            finished_at=p.when("finished_at"),
            note=p.text("note") or None,
            attachment=p.blob("attachment"),
            result=p.blob("result"),
            output=p.blob("output"),
            lease_owner=p.text("lease_owner") or None,
            lease_expires_at=p.when("lease_expires"),
            dedup=p.text("dedup") or None,
            progress=p.blob("progress"),
            corrupt=p.corrupt,
            schedule_id=p.text("schedule") or None,
            fire_at=p.when("fire_at"),
            dedup_until=p.when("dedup_until"),
            dead_reason=DeadReason.of(p.text("dead_reason")) if state is JobState.DEAD else None,
            expires_at=p.when("expires_at"),
            order_key=p.text("order_key") or None,
            order_waiting=bool(p.text("ordered")),
        )

    @classmethod
    def unreadable(cls, queue: str, job_id: str, state: JobState, why: str) -> JobInfo:
        """A job whose key is listed in an index but cannot be read as a hash
        (a wrong-type key): shown with ``corrupt = {"key": why}``."""
        blank = cls.from_hash(queue, job_id, {}, indexed_as=state)
        return replace(blank, state=state, corrupt={"key": why[:_SHOWN]})


# Queues a worker's record names (WorkerInfo.queues); queue_count counts them all.
WORKER_QUEUES_NAMED = 20


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A running worker as it registers itself on each queue it consumes (``queue.workers()``).

    Renewed on every lease-renewal tick; a worker that stops renewing (killed,
    hung, cut off) disappears when its registration expires. ``loop_blocked``
    counts the times since its start that a handler blocked its event loop
    for ``blocked_loop_warning`` or more (each logged as a WARNING naming the
    job and the line), ``longest_block`` the longest of them in seconds; a
    record written by a release before these fields reads them as 0.

    ``queues`` names at most the first ``WORKER_QUEUES_NAMED`` queues the worker
    consumes; ``queue_count`` says how many it consumes in all. (The record is
    written on every queue of the worker, every tick: a worker on 1,000 queues
    naming them all wrote ~10 KB a queue, 10 MB a tick.)
    """

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    running: int
    version: str
    loop_blocked: int = 0
    longest_block: float = 0.0
    queue_count: int = 0  # 0: len(queues) (a record written before the field existed)

    def __post_init__(self) -> None:
        if self.queue_count < len(self.queues):
            object.__setattr__(self, "queue_count", len(self.queues))

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "host": self.host,
                "pid": self.pid,
                "queues": list(self.queues[:WORKER_QUEUES_NAMED]),
                "queue_count": self.queue_count,
                "concurrency": self.concurrency,
                "started_ms": int(self.started_at.timestamp() * 1000),
                "heartbeat_ms": int(self.heartbeat_at.timestamp() * 1000),
                "expires_ms": int(self.expires_at.timestamp() * 1000),
                "running": self.running,
                "version": self.version,
                "loop_blocked": self.loop_blocked,
                "longest_block": self.longest_block,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkerInfo | None:
        """The record stored by a worker, or None if it does not parse (never raises)."""
        try:
            d = json.loads(raw)
            return cls(
                name=str(d["name"]),
                host=str(d["host"]),
                pid=int(d["pid"]),
                queues=tuple(str(q) for q in d["queues"]),
                concurrency=int(d["concurrency"]),
                started_at=ms_to_dt(int(d["started_ms"])),
                heartbeat_at=ms_to_dt(int(d["heartbeat_ms"])),
                expires_at=ms_to_dt(int(d["expires_ms"])),
                running=int(d["running"]),
                version=str(d["version"]),
                loop_blocked=int(d.get("loop_blocked", 0)),
                longest_block=float(d.get("longest_block", 0.0)),
                queue_count=int(d.get("queue_count", 0)),
            )
        except (ValueError, TypeError, KeyError, OverflowError, AttributeError):
            return None
