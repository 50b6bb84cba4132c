"""A queue's event, as ``queue.events()`` yields it (a ``venturi:{q}:events`` entry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .records import _blob, _Fields, ms_to_dt

# The fields every event has; the rest are its journal entry's own (``details``).
_CORE = {"event", "job", "kind", "at", "run", "note", "value"}


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One transition of one job of a queue, from the queue's event stream.

    Attributes:
        id: The stream entry id: pass it as ``since=`` to resume after it.
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
    def from_stream(cls, entry_id: bytes | str, fields: dict[Any, Any]) -> QueueEvent:
        p = _Fields(fields)
        return cls(
            id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
            event=p.text("event"),
            job_id=p.text("job"),
            kind=p.text("kind"),
            at=p.when("at") or ms_to_dt(0),
            run=p.num("run"),
            note=p.text("note") or None,
            value=_blob(p.f.get("value")),
            details={k: p.text(k) for k in p.f if k not in _CORE},
        )
