"""``venturi stats --history 1h``: a queue's metrics history, step by step (``queue.history``);
``venturi queue history QUEUE on|off``: its switch (``queue.set_history``).

Spans are written as a number and a unit, or several: ``90s``, ``5m``, ``1h``,
``2d``, ``1h30m``. A sharded queue's partitions are summed into one table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from .._model.errors import ConfigurationError
from .._model.history import HistoryPoint, merge, plan
from .._producer.base import server_now_ms
from .._producer.client import Client
from .._producer.history import point_dict, read
from .._producer.sharded import group_partitions
from .app import CreateOpt, JsonOpt, RedisOpt, die, known_queue, queue_app, run_with_client
from .output import console, print_json, print_table, safe_text

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SPAN = re.compile(r"(\d+)([smhd])")


def parse_span(text: str, what: str = "span") -> timedelta:
    """``1h``, ``30m``, ``2d``, ``1h30m`` -> a timedelta; anything else is a ConfigurationError."""
    raw = text.strip().lower()
    parts = _SPAN.findall(raw)
    if not raw or not parts or "".join(n + u for n, u in parts) != raw:
        raise ConfigurationError(f"{what} {text!r} is not a span: write e.g. 90s, 5m, 1h, 2d or 1h30m")
    return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))


def _mean(p: HistoryPoint) -> str:
    return "" if p.run_ms_mean is None else f"{p.run_ms_mean:,.0f}"


async def show_history(
    client: Client, names: Sequence[str], since: str, kind: str | None, step: str | None, json_out: bool
) -> int:
    """Print each queue's history (a sharded queue's partitions summed)."""
    span = parse_span(since, "--history")
    stride = parse_span(step, "--step") if step is not None else None
    plan(0, span, stride)  # checked before anything is read
    the_plan = plan(await server_now_ms(client), span, stride)
    out: dict[str, list[HistoryPoint]] = {}
    for group, parts in group_partitions(list(names)).items():
        out[group] = merge([await read(client.queue(p), the_plan, kind) for p in parts])
    if json_out:
        print_json({name: [point_dict(p) for p in points] for name, points in out.items()})
        return 0
    if not out:
        console().print("no queues found")
    for name, points in out.items():
        total = sum(p.enqueued + p.completed + p.failed + p.dead for p in points)
        by = step or _step_name(the_plan.step_ms)
        title = f"{name}{f' · {kind}' if kind else ''}: the last {since} by {by}"
        table = Table(title=safe_text(title), box=box.SIMPLE_HEAD)
        table.add_column("at (UTC)", no_wrap=True)
        for col in ("enqueued", "completed", "failed", "dead", "run ms (mean)"):
            table.add_column(col, justify="right", no_wrap=True)
        for p in points:
            table.add_row(
                p.at.strftime("%Y-%m-%d %H:%M"),
                str(p.enqueued),
                str(p.completed),
                str(p.failed),
                str(p.dead),
                _mean(p),
            )
        print_table(table)
        if not total:
            console().print(
                f"  nothing counted: is the history on? (venturi queue history {name} on)", highlight=False
            )
    return 0


def _step_name(step_ms: int) -> str:
    return "hour" if step_ms == 3_600_000 else "minute" if step_ms == 60_000 else f"{step_ms // 60_000}m"


@queue_app.command("history")
def queue_history(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    switch: Annotated[str, typer.Argument(metavar="on|off", help="the metrics history on or off")],
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Switch the queue's metrics history (docs/observability.md) on or off: on, every
    transition counts itself per KIND and minute (a few Redis commands per script call)."""
    if switch not in ("on", "off"):
        die(f"expected 'on' or 'off', got {switch!r}", code=2)
    on = switch == "on"

    async def go(client: Client) -> int:
        q = await known_queue(client, name, create=create)
        await q.set_history(on)
        if json_out:
            print_json({"queue": q.name, "history": on})
        else:
            typer.echo(f"queue {q.name}: history {switch}")
        return 0

    run_with_client(redis, go)
