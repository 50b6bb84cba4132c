"""The schedule commands: ``venturi schedules`` and ``venturi schedule remove|pause|resume|trigger``."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from .._model.errors import CorruptQueueError
from .._model.schedule import ScheduleInfo
from .._producer import discovery as _discovery
from .._producer.client import Client, Queue
from .app import Fail, JsonOpt, RedisOpt, app, known_queue, run_with_client
from .output import console, print_json, print_table, safe_text, when

schedule_app = typer.Typer(help="One schedule: remove, pause, resume, trigger.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")

SchedulesQueueOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--queue", "-q", metavar="NAME", help="Queue (repeatable); default: every queue with schedules."
    ),
]
ScheduleQueueOpt = Annotated[
    str | None,
    typer.Option(
        "--queue",
        "-q",
        metavar="NAME",
        help="Queue of the schedule (found among the registered queues when omitted).",
    ),
]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The schedule id.")]


def spec(info: ScheduleInfo) -> str:
    """The timing as an operator writes it: ``0 3 * * * Europe/Berlin`` or ``every 30s``."""
    if info.cron is not None:
        return f"{info.cron} {info.tz}"
    if info.every is None:
        return "-"  # a corrupt one: its note says why
    return f"every {info.every:g}s"


def schedule_dict(info: ScheduleInfo) -> dict[str, Any]:
    doc = dataclasses.asdict(info)
    doc["priority"] = info.priority.label
    doc["corrupt"] = info.corrupt
    return doc


def _state(s: ScheduleInfo) -> str:
    if s.corrupt:
        return "corrupt"
    return "paused" if s.paused else (when(s.next_at) if s.next_at else "ended")


@app.command("schedules")
def schedules_cmd(
    queue: SchedulesQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The schedules: id, kind, spec, next fire, last fire, last job (declared in code or not)."""

    async def go(client: Client) -> int:
        for name in queue or []:
            await known_queue(client, name, change=False)
        names = list(queue or []) or await _discovery.discover_schedule_queues(client)
        found: list[ScheduleInfo] = []
        failed = 0
        for name in names:
            try:
                found += await client.queue(name).schedules()
            except CorruptQueueError as exc:  # that queue's set of ids: the others are listed
                typer.echo(f"venturi: queue {name}: {exc}", err=True)
                failed += 1
        if json_out:
            print_json([schedule_dict(s) for s in found])
            return 1 if failed else 0
        if not found:
            where = ", ".join(names) if queue else "any queue"
            console().print(Text(f"no schedules on {where}"))
            return 1 if failed else 0
        table = Table(title=f"{len(found)} schedule(s)", box=box.SIMPLE_HEAD)
        for col in ("queue", "id", "kind", "spec", "task", "next", "last", "last job", "fires"):
            table.add_column(col, no_wrap=col not in ("spec", "task"))
        for s in found:
            table.add_row(
                safe_text(s.queue),
                safe_text(s.id),
                s.kind,
                safe_text(spec(s)),
                safe_text(s.task_kind),
                _state(s),
                when(s.last_at) if s.last_at else "-",
                safe_text(s.last_job_id or "-"),
                str(s.fires),
            )
        print_table(table)
        for s in found:
            if s.corrupt:  # what is wrong, and what to do, under the table
                console().print(Text(f"{s.queue}/{s.id}: {s.note}"))
        if any(s.corrupt for s in found):
            console().print(
                Text(
                    "repair a corrupt schedule's hash and resume it, or declare it again (docs/schedules.md)"
                )
            )
        return 1 if failed else 0

    run_with_client(redis, go)


async def schedule_queue(client: Client, schedule_id: str, queue: str | None) -> Queue:
    """The queue of ``schedule_id``: the one named, else the only registered queue holding it."""
    if queue is not None:
        return await known_queue(client, queue, change=False)
    holders = [
        name
        for name in await _discovery.discover_schedule_queues(client)
        if await client.queue(name).get_schedule(schedule_id) is not None
    ]
    if not holders:
        raise Fail(f"schedule {schedule_id!r} not found in any queue (namespace {client.namespace!r})")
    if len(holders) > 1:
        raise Fail(f"schedule {schedule_id!r} is in several queues ({', '.join(holders)}): name one with -q")
    return client.queue(holders[0])


def _one(schedule_id: str, queue: str | None, redis: str | None, json_out: bool, action: str) -> None:
    async def go(client: Client) -> int:
        q = await schedule_queue(client, schedule_id, queue)
        doc: dict[str, Any] = {"id": schedule_id, "queue": q.name, "action": action}
        if action == "remove":
            done = await q.unschedule(schedule_id)
            line = f"schedule {schedule_id} removed from queue {q.name} (its jobs already enqueued stay)"
        elif action == "pause":
            done = await q.pause_schedule(schedule_id)
            line = f"schedule {schedule_id} paused in queue {q.name}"
        elif action == "resume":
            done = await q.resume_schedule(schedule_id)
            info = await q.get_schedule(schedule_id)
            nxt = info.next_at if info is not None else None
            doc["next_at"] = nxt
            line = (
                f"schedule {schedule_id} resumed in queue {q.name}; next fire {when(nxt) if nxt else 'none'}"
            )
        else:
            job_id = await q.trigger_schedule(schedule_id)
            done = job_id is not None
            doc["job_id"] = job_id
            line = f"schedule {schedule_id}: job {job_id} enqueued now in queue {q.name}"
        doc["done"] = done
        if json_out:
            print_json(doc)
        elif done:
            typer.echo(line)
        if not done:
            typer.echo(
                f"venturi: schedule {schedule_id} does not exist in queue {q.name}; nothing done", err=True
            )
            return 1
        return 0

    run_with_client(redis, go)


@schedule_app.command("remove")
def schedule_remove(
    schedule_id: IdArg, queue: ScheduleQueueOpt = None, redis: RedisOpt = None, json_out: JsonOpt = False
) -> None:
    """Remove a schedule (its jobs already enqueued stay). A worker that still declares it
    in code (vr.Worker(schedules=...)) creates it again when it starts."""
    _one(schedule_id, queue, redis, json_out, "remove")


@schedule_app.command("pause")
def schedule_pause(
    schedule_id: IdArg, queue: ScheduleQueueOpt = None, redis: RedisOpt = None, json_out: JsonOpt = False
) -> None:
    """Stop firing a schedule until resumed (workers declaring it leave it paused)."""
    _one(schedule_id, queue, redis, json_out, "pause")


@schedule_app.command("resume")
def schedule_resume(
    schedule_id: IdArg, queue: ScheduleQueueOpt = None, redis: RedisOpt = None, json_out: JsonOpt = False
) -> None:
    """Fire a paused schedule again, from its next fire time (skipped ones are not caught up)."""
    _one(schedule_id, queue, redis, json_out, "resume")


@schedule_app.command("trigger")
def schedule_trigger(
    schedule_id: IdArg, queue: ScheduleQueueOpt = None, redis: RedisOpt = None, json_out: JsonOpt = False
) -> None:
    """Enqueue one extra job of the schedule now (its next fire time is unchanged)."""
    _one(schedule_id, queue, redis, json_out, "trigger")
