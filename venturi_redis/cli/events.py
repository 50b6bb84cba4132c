"""``venturi events QUEUE``: follow a queue's event stream live (docs/observability.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .._model.events import QueueEvent
from .._producer import events as _events
from .._producer.client import Client
from .app import RedisOpt, app, known_queue, run_with_client
from .output import clean, when


def _line(e: QueueEvent) -> str:
    what = e.note if e.value is None else json.dumps(e.value, default=str)
    tail = f"  {what}" if what else ""
    return clean(f"{when(e.at)} {e.event:<16} {e.job_id} {e.kind} run {e.run}{tail}")


def _doc(e: QueueEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "event": e.event,
        "job_id": e.job_id,
        "kind": e.kind,
        "at": e.at.isoformat(),
        "run": e.run,
        "note": e.note,
        "value": e.value,
        "details": e.details,
    }


@app.command("events")
def events_cmd(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    since: Annotated[
        str, typer.Option("--since", help="'$' = from now, '0' = all the stream holds, or an event id")
    ] = "$",
    kind: Annotated[
        list[str] | None, typer.Option("--kind", "-k", help="Only jobs of this KIND (repeatable).")
    ] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=0, help="Stop after N events (0 = never).")] = 0,
    redis: RedisOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document per event, per line.")] = False,
) -> None:
    """Follow the queue's events as they happen (Ctrl-C to stop); exits 1 when they are off."""

    async def go(client: Client) -> int:
        q = await known_queue(client, name, change=False)
        if await _events.events_cap(q) == 0:
            # Nothing would ever arrive: say how to turn them on, and leave
            # (following an empty stream looked like a hang).
            typer.echo(
                f"venturi: events are off for queue {q.name}: venturi queue events {q.name} on", err=True
            )
            return 1
        seen = 0
        async for e in q.events(since=since, kinds=kind or None):
            typer.echo(json.dumps(_doc(e), default=str) if json_out else _line(e))
            seen += 1
            if count and seen >= count:
                break
        return 0

    run_with_client(redis, go)


__all__ = ["events_cmd"]
