"""The queue page's metrics history (``/queues/{queue}/history``): a chart with axes
(``_chart.py``) of the jobs enqueued, completed, failed and dead, over a span chosen
from ``SPANS``; ``/api/queues/{queue}/history`` gives the points as JSON.

The queue page loads it apart from its 5-second refresh (htmx, on load and then
every ``REFRESH_S`` seconds): one read is one command per period (60 for the last
hour by minutes, 24 for a day by hours, 720 for 30 days by hours), so it runs once
a minute per open page, not on every refresh of the page's counts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from .._producer.history import history_on

if TYPE_CHECKING:
    from .._producer.client import Queue

# The spans a page offers: (since, step).
SPANS: dict[str, tuple[timedelta, timedelta]] = {
    "1h": (timedelta(hours=1), timedelta(minutes=1)),
    "6h": (timedelta(hours=6), timedelta(minutes=5)),
    "24h": (timedelta(hours=24), timedelta(hours=1)),
    "7d": (timedelta(days=7), timedelta(hours=1)),
    "30d": (timedelta(days=30), timedelta(days=1)),
}
REFRESH_S = 60


async def read(queue: Queue, span: str, kind: str | None) -> dict[str, Any]:
    """What the chart and the JSON show: the points, the span, whether the history is on."""
    if span not in SPANS:
        raise HTTPException(400, f"unknown span {span[:20]!r}: use one of {', '.join(SPANS)}")
    since, step = SPANS[span]
    points = await queue.history(since=since, kind=kind or None, step=step)
    done = sum(p.completed for p in points)
    run_ms = sum(p.run_ms_total for p in points)
    return {
        "queue": queue.name,
        "span": span,
        "kind": kind or None,
        "on": await history_on(queue),
        "points": points,
        "run_ms_mean": run_ms / done if done else None,
    }
