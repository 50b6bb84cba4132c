"""A queue's event, as ``queue.events()`` yields it (from a ``venturi:{q}:events`` entry).

An entry says one job's transition, or, written by a script that moved many
jobs at once (an enqueue of many, a claim, a batch of completions, an
operator's retry of many dead jobs), the same transition of each of them
(lua/include/events.lua): ``QueueEvent.all_from_stream`` gives one event per
job either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .records import _blob, _Fields, ms_to_dt
from .sealing import Encryption

# The fields every event has; the rest are its journal entry's own (``details``).
_CORE = {"event", "job", "kind", "at", "run", "note", "value"}
# The many-jobs form's fields (events.lua); the rest are shared by its jobs (``details``).
_MANY = {"event", "at", "n", "jobs", "kind", "kinds", "run", "runs", "note"}


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One transition of one job of a queue, from the queue's event stream.

    Attributes:
        id: Where it is in the stream: pass it as ``since=`` to resume after it
            (the entry id; ``<entry id>/<k>`` for the k-th job of an entry
            that tells many).
        event: The journal's name for it (enqueued, claimed, completed,
            failed, dead, paused, suspended, resumed, cancelled,
            cancel_requested, lease_expired, released, refused, merged,
            retried), ``progress`` (``ctx.report_progress``), or the
            switch's own ``events_on`` / ``events_off`` (no job: ``job_id``
            and ``kind`` are '').
        job_id: The job's id.
        kind: The job's KIND.
        at: When it happened (Redis's clock, or the caller's ``now``).
        run: The run it belongs to (0 before the first claim).
        note: The entry's note (an error message, a reason), if any.
        value: A ``progress`` event's value (decoded msgpack); else ``None``.
        details: The journal entry's other fields as text (``worker`` of a
            claim, ``failures`` and ``delay_ms`` of a failure, ``reason`` of
            a death...).
    """

    id: str
    event: str
    job_id: str
    kind: str
    at: datetime
    run: int = 0
    note: str | None = None
    value: Any = None
    details: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_stream(
        cls, entry_id: bytes | str, fields: dict[Any, Any], encryption: Encryption | None = None
    ) -> QueueEvent:
        p = _Fields(fields, encryption)
        return cls(
            id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
            event=p.text("event"),
            job_id=p.text("job"),
            kind=p.text("kind"),
            at=p.when("at") or ms_to_dt(0),
            run=p.num("run"),
            note=p.text("note") or None,
            value=_blob(p.f.get("value"), encryption),
            details={k: p.text(k) for k in p.f if k not in _CORE},
        )

    @classmethod
    def all_from_stream(
        cls, entry_id: bytes | str, fields: dict[Any, Any], encryption: Encryption | None = None
    ) -> list[QueueEvent]:
        """The events of one stream entry: its job's, or, for an entry that tells many, each job's."""
        jobs = fields.get(b"jobs", fields.get("jobs"))
        if jobs is None:
            return [cls.from_stream(entry_id, fields, encryption)]
        p = _Fields(fields)
        base = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        ids = p.text("jobs").split(" ")
        n = len(ids)
        kinds = p.text("kinds").split("\n") if "kinds" in p.f else [p.text("kind")] * n
        runs_text = p.text("runs").split(" ") if "runs" in p.f else [p.text("run")] * n
        runs = [int(r) if r.isdigit() else 0 for r in runs_text]
        if len(kinds) != n or len(runs) != n:  # an entry written by hand: its jobs only
            kinds, runs = [""] * n, [0] * n
        event, at = p.text("event"), p.when("at") or ms_to_dt(0)
        note = p.text("note") or None  # the note they share (an operator's retry), if any
        details = {k: p.text(k) for k in p.f if k not in _MANY}
        return [
            cls(
                id=f"{base}/{k}",
                event=event,
                job_id=job_id,
                kind=kind,
                at=at,
                run=run,
                note=note,
                details=details,
            )
            for k, (job_id, kind, run) in enumerate(zip(ids, kinds, runs, strict=True))
        ]
