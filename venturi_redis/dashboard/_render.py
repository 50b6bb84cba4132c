"""Jinja2 filters: times, documents and the throughput chart, as text the templates escape."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._chart import chart


def when(value: Any) -> str:
    """An ISO time (or datetime) as ``2026-12-06 01:02:03Z``; ``-`` when absent."""
    if not value:
        return "-"
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def in_zone(value: Any, tz: str) -> str:
    """A time as the wall clock of zone ``tz`` reads it (``2026-12-06 02:30 CET``); ``""``
    for UTC, an absent time or an unknown zone (the UTC time beside it says it all)."""
    if not value or not tz or tz == "UTC":
        return ""
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return ""
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z") + f" ({tz})"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def progress_bar(value: Any) -> dict[str, Any] | None:
    """How far a reported progress is, for a bar: ``{"value", "max", "percent"}``, or None.

    A number from 0 to 1 is a fraction, from 1 to 100 a percentage; a document
    with ``of`` (the total) and ``done`` (or one other number: ``{"page": 3,
    "of": 10}``) is that count. Anything else is shown as it was reported.
    """
    n = _number(value)
    if n is not None:
        if 0 <= n <= 1:
            return {"value": n, "max": 1.0, "percent": round(n * 100)}
        if 1 < n <= 100:
            return {"value": n, "max": 100.0, "percent": round(n)}
        return None
    if not isinstance(value, dict):
        return None
    total = _number(value.get("of"))
    done = _number(value.get("done"))
    if done is None:
        others = [_number(v) for k, v in value.items() if k != "of"]
        numbers = [x for x in others if x is not None]
        done = numbers[0] if len(others) == 1 and numbers else None
    if total is None or done is None or total <= 0 or not 0 <= done <= total:
        return None
    return {"value": done, "max": total, "percent": round(done / total * 100)}


def pretty(value: Any) -> str:
    """A decoded document as indented JSON (escaped by the template, never trusted)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def seconds(value: float) -> str:
    """A duration in seconds, short: ``0.4 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.0f} min"
    if value < 86400:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def interval(value: float) -> str:
    """A schedule's period, exact: ``90 s``, ``5 min``, ``2 h``, ``1 d`` (``seconds`` rounds)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if value >= size and value % size == 0:
            return f"{value / size:g} {unit}"
    return f"{value:g} s"


def bars(counts: list[int], height: int = 28, width: int = 3) -> list[dict[str, int]]:
    """SVG bar geometry for ``counts`` (one bar per minute), scaled to ``height``."""
    top = max(counts) if counts and max(counts) > 0 else 1
    out = []
    for i, n in enumerate(counts):
        h = 0 if n == 0 else max(1, round(n / top * height))
        out.append({"x": i * (width + 1), "y": height - h, "h": h, "w": width, "n": n})
    return out


def detail(name: str, value: str) -> str:
    """A journal detail as a person reads it: stored times (ms) as UTC, ``delay_ms`` in seconds."""
    if value.isdigit() and (name.endswith("_at") or name == "lease_expires"):
        return when(datetime.fromtimestamp(int(value) / 1000, tz=UTC))
    if value.isdigit() and name.endswith("_ms"):
        return seconds(int(value) / 1000)
    return value


# A job's fields as the job page names them (``JobInfo``'s attribute names are for code).
FIELD_LABELS = (
    ("kind", "kind"),
    ("priority", "priority"),
    ("run_count", "runs"),
    ("failures", "failed runs"),
    ("created_at", "created"),
    ("updated_at", "last change"),
    ("eligible_at", "eligible from"),
    ("finished_at", "finished"),
    ("lease_owner", "worker"),
    ("lease_expires_at", "lease expires"),
    ("dedup", "dedup key"),
    ("note", "note"),
)

# The queue page's heading over its job list, per ``?state=`` (a state or a view).
_HEADINGS = {
    "": "Jobs",
    "retrying": "Retrying jobs (their last run failed)",
    "delayed": "Delayed jobs (eligible later)",
    "limited": "Limited jobs (waiting on a limit)",
}


def jobs_heading(state: str, kind: str) -> str:
    """``Dead jobs of kind send_email``, ``Jobs``..."""
    head = _HEADINGS.get(state) or f"{state.capitalize()} jobs"
    return f"{head}, kind {kind}" if kind else head


FILTERS = {
    "in_zone": in_zone,
    "progress_bar": progress_bar,
    "detail": detail,
    "when": when,
    "pretty": pretty,
    "seconds": seconds,
    "interval": interval,
    "bars": bars,
    "chart": chart,  # the metrics history's chart (_chart.py)
}
