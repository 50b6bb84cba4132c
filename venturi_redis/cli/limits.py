"""Flow control from the shell: ``venturi limits``, ``venturi limit set|clear`` (docs/flow-control.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from .._model.limits import LimitInfo, parse_rate
from .._producer.client import Client
from .app import CreateOpt, JsonOpt, QueueOpt, RedisOpt, app, known_queue, run_with_client
from .output import clean, print_json, print_table, safe_text
from .reading import QueuesOpt, chosen_queues

limit_app = typer.Typer(help="Set or clear a kind's concurrency and rate limits.", no_args_is_help=True)
app.add_typer(limit_app, name="limit")

KindArg = Annotated[str, typer.Argument(metavar="KIND", help="The task kind.")]
PerKeyOpt = Annotated[
    bool, typer.Option("--per-key", help="The caps apply to each limit_key() of the kind separately.")
]


def _row(info: LimitInfo) -> dict[str, object]:
    return {
        "kind": info.kind,
        "per_key": info.per_key,
        "concurrency": info.concurrency,
        "rate": None if info.rate is None else {"count": info.rate.count, "per_seconds": info.rate.seconds},
        "running": info.running,
        "waiting": info.waiting,
        "keys": [{"key": x.key, "running": x.running, "waiting": x.waiting} for x in info.keys],
        "keys_total": info.keys_total,
    }


def _key_label(key: str | None) -> Text:
    return (
        Text("(no key)", style="italic")
        if key is None
        else Text("(empty key)", style="italic")
        if key == ""
        else safe_text(key)
    )


def _more(info: LimitInfo) -> str:
    if info.keys_total is None:
        return f"the {len(info.keys)} busiest of the keys read (too many to count)"
    more = info.keys_total - len(info.keys)
    return f"{more} more busy key{'s' if more != 1 else ''}" if more > 0 else ""


@app.command("limits")
def limits(
    queue: QueuesOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    keys: Annotated[
        int,
        typer.Option("--keys", metavar="N", min=0, help="Per-key limits: show the N busiest keys (0: none)."),
    ] = 10,
) -> None:
    """Per queue: each limit's kind, scope, concurrency, rate, runs holding a slot, jobs waiting.

    Under a per-key limit, its busiest keys with their own running and waiting.
    """

    async def go(client: Client) -> int:
        found = [
            (name, info)
            for name in await chosen_queues(client, queue)
            for info in await client.queue(name).limits(keys=keys)
        ]
        if json_out:
            print_json([{"queue": name, **_row(i)} for name, i in found])
            return 0
        if not found:
            typer.echo("no limits")
            return 0
        table = Table(title="venturi limits", box=box.SIMPLE_HEAD)
        for col in ("queue", "kind", "scope"):
            table.add_column(col, no_wrap=True)
        for col in ("concurrency", "rate", "running", "waiting"):
            table.add_column(col, justify="right", no_wrap=True)
        for name, i in found:
            table.add_row(
                safe_text(name),
                safe_text(i.kind),
                "per key" if i.per_key else "kind",
                "" if i.concurrency is None else str(i.concurrency),
                "" if i.rate is None else str(i.rate),
                str(i.running),
                str(i.waiting),
            )
            for x in i.keys:
                label = Text("  key ") + _key_label(x.key)
                table.add_row("", "", label, "", "", str(x.running), str(x.waiting))
            if i.per_key and keys and _more(i):
                table.add_row("", "", Text("  " + _more(i), style="dim"), "", "", "", "")
        print_table(table)
        return 0

    run_with_client(redis, go)


@limit_app.command("set")
def limit_set(
    kind: KindArg,
    per_key: PerKeyOpt = False,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", metavar="N", help="Most runs at once.")
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", metavar="N/PERIOD", help="Most starts per window: 100/s, 5/1m, 3/500ms."),
    ] = None,
    queue: QueueOpt = "default",
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Set KIND's kind-wide (or --per-key) limit; it replaces the previous one of that scope."""

    async def go(client: Client) -> int:
        parsed = None if rate is None else parse_rate(rate)  # a bad one: a usage error (2)
        q = await known_queue(client, queue, create=create)
        await q.set_limit(kind, concurrency=concurrency, rate=parsed, per_key=per_key)
        scope = "per key" if per_key else "kind-wide"
        if json_out:
            print_json({"queue": q.name, "kind": kind, "per_key": per_key, "set": True})
        else:
            parts = [f"concurrency {concurrency}" if concurrency else "", f"rate {parsed}" if parsed else ""]
            typer.echo(f"queue {q.name}: {clean(kind)} {scope}: " + ", ".join(p for p in parts if p))
        return 0

    run_with_client(redis, go)


@limit_app.command("clear")
def limit_clear(
    kind: KindArg,
    per_key: PerKeyOpt = False,
    queue: QueueOpt = "default",
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Remove KIND's kind-wide (or --per-key) limit; the jobs waiting on it run."""

    async def go(client: Client) -> int:
        q = await known_queue(client, queue, change=False)
        cleared = await q.clear_limit(kind, per_key=per_key)
        scope = "per-key" if per_key else "kind-wide"
        if json_out:
            print_json({"queue": q.name, "kind": kind, "per_key": per_key, "cleared": cleared})
        elif cleared:
            typer.echo(f"queue {q.name}: {clean(kind)}: {scope} limit cleared")
        else:
            typer.echo(f"venturi: queue {q.name}: {clean(kind)} has no {scope} limit; nothing done", err=True)
        return 0 if cleared else 1

    run_with_client(redis, go)
