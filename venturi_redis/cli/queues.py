"""``venturi queues rebuild``: refill the registry of queues by one walk of the keyspace.

The one command that SCANs (``_producer/rebuild.py``); docs/operations.md
says when to run it. Progress goes to stderr as a bar (keys examined of the
keys in the database), so ``--json`` keeps stdout to one document.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._producer import discovery as _discovery
from .._producer.client import Client
from .._producer.rebuild import DEFAULT_COUNT, Walk, rebuild
from .app import JsonOpt, RedisOpt, app, run_with_client
from .output import print_json

queues_app = typer.Typer(help="The registry of queues: rebuild it from the keyspace.", no_args_is_help=True)
app.add_typer(queues_app, name="queues")


@queues_app.command("rebuild")
def rebuild_cmd(
    count: Annotated[
        int,
        typer.Option("--count", min=10, max=100_000, help="Keys the server examines per SCAN call."),
    ] = DEFAULT_COUNT,
    max_calls: Annotated[
        int | None,
        typer.Option("--max-calls", min=1, help="Stop after this many SCAN calls; run again to go on."),
    ] = None,
    pause: Annotated[
        float, typer.Option("--pause", min=0.0, help="Seconds to wait between two SCAN calls.")
    ] = 0.0,
    restart: Annotated[
        bool, typer.Option("--restart", help="Forget an interrupted walk and start from the beginning.")
    ] = False,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Record every queue that has keys in the registry of queues, by one SCAN of the keyspace.

    For queues written before the registry existed (or a registry lost): see
    docs/operations.md. An interrupted run resumes where it stopped.
    """

    async def go(client: Client) -> int:
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("keys examined"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=json_out,
        ) as bar:
            task = bar.add_task("walking the keyspace", total=None)

            def step(walk: Walk) -> None:
                shown = walk.total if walk.done else min(walk.examined, walk.total)
                bar.update(task, total=max(walk.total, 1), completed=shown)
                bar.update(task, description=f"{walk.recorded} queue(s) recorded")

            walk = await rebuild(
                client, count=count, max_calls=max_calls, pause=pause, restart=restart, on_step=step
            )
        registered = len(await _discovery.registered(client))
        if json_out:
            print_json(
                {
                    "done": walk.done,
                    "resumed": walk.resumed,
                    "calls": walk.calls,
                    "recorded": walk.recorded,
                    "examined": walk.examined,
                    "keys": walk.total,
                    "registered": registered,
                }
            )
            return 0
        how = "continued an interrupted walk; " if walk.resumed else ""
        if walk.done:
            typer.echo(
                f"registry rebuilt: {how}{walk.recorded} queue name(s) recorded in {walk.calls} "
                f"SCAN call(s); {registered} queue(s) registered"
            )
        else:
            typer.echo(
                f"stopped after {walk.calls} SCAN call(s) (--max-calls): {how}{walk.recorded} queue name(s) "
                "recorded so far; run the command again to go on from there"
            )
        return 0

    run_with_client(redis, go)
