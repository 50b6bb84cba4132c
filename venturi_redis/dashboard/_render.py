"""Jinja2 filters: times, documents and the throughput chart, as text the templates escape."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any


def when(value: Any) -> str:
    """An ISO time (or datetime) as ``2026-12-06 01:02:03Z``; ``-`` when absent."""
    if not value:
        return "-"
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


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


FILTERS = {
    "detail": detail,
    "when": when,
    "pretty": pretty,
    "seconds": seconds,
    "interval": interval,
    "bars": bars,
}
