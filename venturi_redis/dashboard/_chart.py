"""The metrics history's chart: SVG geometry with axes and a scale, drawn by the
``history_chart`` macro (templates/_macros.html), no JavaScript.

A chart is one line per series (enqueued, completed, failed, dead: one point
a step) over a plot box with a y axis scaled to a round maximum (1, 2 or 5
times a power of ten, at least the highest point), ticks at 0, half and the
maximum, and an x axis with the first step's time, the middle one's and the
last one's. Everything here is numbers and plain text; the template escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .._model.history import HistoryPoint

# Left room for the y labels, bottom room for the x labels.
_LEFT, _BOTTOM, _TOP, _RIGHT = 34, 14, 4, 4
SERIES = ("enqueued", "completed", "failed", "dead")


def nice_max(value: float) -> int:
    """The round top of a scale: 1, 2 or 5 times a power of ten, at least ``value`` (and 1)."""
    top = 1
    while True:
        for m in (1, 2, 5):
            if top * m >= value:
                return top * m
        top *= 10


def _count(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:g}M"
    if n >= 10_000:
        return f"{n / 1000:g}k"
    return f"{n:g}"


def _label(at: datetime, step: timedelta) -> str:
    return at.strftime("%m-%d %H:%M" if step >= timedelta(hours=1) else "%H:%M")


def chart(
    points: Sequence[HistoryPoint],
    *,
    width: int = 640,
    height: int = 150,
    series: Sequence[str] = SERIES,
    title: str = "",
) -> dict[str, Any]:
    """The geometry of ``points``' chart, ``width`` x ``height`` pixels (see the module docstring)."""
    step = points[1].at - points[0].at if len(points) > 1 else timedelta(minutes=1)
    x0, x1, y0, y1 = _LEFT, width - _RIGHT, _TOP, height - _BOTTOM
    values = {name: [getattr(p, name) for p in points] for name in series}
    top = nice_max(max((max(v) for v in values.values() if v), default=0))
    n = max(len(points), 1)

    def x(i: int) -> float:
        return round(x0 + (x1 - x0) * (i / (n - 1) if n > 1 else 0.5), 1)

    def y(v: float) -> float:
        return round(y1 - (y1 - y0) * v / top, 1)

    lines = [
        {
            "name": name,
            "points": " ".join(f"{x(i):g},{y(v):g}" for i, v in enumerate(vals)),
            "total": sum(vals),
            "peak": max(vals, default=0),
        }
        for name, vals in values.items()
    ]
    ticks = sorted({0, top // 2 if top % 2 == 0 else top / 2, top})
    x_ticks = []
    if points:
        for i in sorted({0, (n - 1) // 2, n - 1}):
            x_ticks.append({"x": x(i), "label": _label(points[i].at, step), "anchor": "middle"})
        x_ticks[0]["anchor"] = "start"
        if len(x_ticks) > 1:
            x_ticks[-1]["anchor"] = "end"
    unit = "minute" if step == timedelta(minutes=1) else "hour" if step == timedelta(hours=1) else str(step)
    totals = ", ".join(f"{line['name']} {line['total']}" for line in lines)
    return {
        "width": width,
        "height": height,
        "box": {"x0": x0, "x1": x1, "y0": y0, "y1": y1},
        "y_ticks": [{"y": y(t), "label": _count(t)} for t in ticks],
        "x_ticks": x_ticks,
        "lines": lines,
        "top": top,
        "unit": unit,
        "title": title,
        "label": f"{title + ': ' if title else ''}per {unit}, scale 0 to {top}: {totals}",
    }
