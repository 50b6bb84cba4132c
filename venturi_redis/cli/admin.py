"""Commands that change jobs and queues: retry, cancel, update, dead retry, purge, pause, resume, events."""

from __future__ import annotations

from typing import Annotated

import typer

from .._producer import ops as _ops
from .._producer.client import Client
from .._store.store import EVENTS_MAXLEN
from .app import (
    CreateOpt,
    JobQueueOpt,
    JsonOpt,
    RedisOpt,
    die,
    job_app,
    job_queue,
    known_queue,
    queue_app,
    run_with_client,
)
from .output import clean, print_json
from .output import when as shown_time


@job_app.command("retry")
def job_retry(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A dead job's id.")],
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Move a dead job back to pending (failures reset; journaled as `retried`)."""

    async def go(client: Client) -> int:
        q = await job_queue(client, job_id, queue)
        moved = await q.retry(job_id)
        info = await q.get(job_id)
        state = info.state.value if info is not None else None
        if json_out:
            print_json({"id": job_id, "queue": q.name, "retried": moved, "state": state})
        elif moved:
            typer.echo(
                f"job {job_id} ({clean(info.kind if info else '?')}): dead -> pending in queue {q.name}"
            )
        if moved:
            return 0
        # Why nothing was done goes to stderr with --json too: stdout stays the document.
        why = "does not exist" if state is None else f"is {state}, not dead"
        typer.echo(f"venturi: job {job_id} {why} in queue {q.name}; nothing done", err=True)
        return 1

    run_with_client(redis, go)


@job_app.command("cancel")
def job_cancel(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job id.")],
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel a job: pending or suspended ends cancelled now; a running one is asked to stop."""

    async def go(client: Client) -> int:
        q = await job_queue(client, job_id, queue)
        result, detail = await _ops.cancel(q, job_id)
        done = result in ("cancelled", "requested")
        if json_out:
            print_json({"id": job_id, "queue": q.name, "result": result, "detail": detail})
        elif result == "cancelled":
            typer.echo(f"job {job_id}: cancelled")
        elif result == "requested":
            typer.echo(
                f"job {job_id} is running: its worker will ask it to stop at its next lease "
                "renewal and the run will end cancelled"
            )
        if not done:
            # To stderr with --json too (stdout stays the document). The script's
            # reason names the job itself ("job is completed"): said once.
            why = detail.removeprefix("job ")
            typer.echo(f"venturi: job {job_id} {clean(why)}; nothing done", err=True)
        return 0 if done else 1

    run_with_client(redis, go)


@job_app.command("update")
def job_update(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A pending job's id.")],
    priority: Annotated[
        str | None, typer.Option("--priority", metavar="P", help="critical, high, normal or low.")
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option("--delay", metavar="S", help="Eligible S seconds from now (Redis's clock)."),
    ] = None,
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Change a pending job's priority or eligibility in place (journaled as `updated`)."""
    if priority is None and delay is None:
        die("job update: give --priority or --delay (or both)", 2)

    async def go(client: Client) -> int:
        q = await job_queue(client, job_id, queue)
        # A bad priority or delay: ConfigurationError, one line and status 2 (one_line_errors).
        done = await q.update(job_id, priority=priority, delay=delay)
        info = await q.get(job_id)
        state = info.state.value if info is not None else None
        if json_out:
            print_json({"id": job_id, "queue": q.name, "updated": done, "state": state})
        elif done and info is not None:
            at = shown_time(info.eligible_at)  # as every table shows a time: UTC, milliseconds, Z
            typer.echo(f"job {job_id}: priority {info.priority.label}, eligible at {at}")
        if done:
            return 0
        why = "does not exist" if state is None else f"is {state}, not pending"
        typer.echo(f"venturi: job {job_id} {why} in queue {q.name}; nothing done", err=True)
        return 1

    run_with_client(redis, go)


# -- pause, resume, events ----------------------------------------------------------------------


def _set_paused(name: str, redis: str | None, json_out: bool, create: bool, *, paused: bool) -> None:
    """``queue pause`` and ``queue resume``: one switch, two messages."""

    async def go(client: Client) -> int:
        q = await known_queue(client, name, create=create)
        await (q.pause() if paused else q.resume_queue())
        if json_out:
            print_json({"queue": q.name, "paused": paused})
        elif paused:
            typer.echo(f"queue {q.name}: paused (no new claims; running jobs finish; enqueues still land)")
        else:
            typer.echo(f"queue {q.name}: resumed")
        return 0

    run_with_client(redis, go)


@queue_app.command("pause")
def queue_pause(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Stop every worker from claiming (atomic). Running jobs finish; enqueues still land."""
    _set_paused(name, redis, json_out, create, paused=True)


@queue_app.command("resume")
def queue_resume(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Let workers claim from the queue again (and wake them)."""
    _set_paused(name, redis, json_out, create, paused=False)


@queue_app.command("events")
def queue_events(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    switch: Annotated[str, typer.Argument(metavar="on|off", help="the event stream on or off")],
    maxlen: Annotated[
        int, typer.Option("--maxlen", min=1, help="cap of the stream, in entries (~100 B each)")
    ] = EVENTS_MAXLEN,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Switch the queue's event stream (venturi:{q}:events, docs/observability.md) on or off."""
    if switch not in ("on", "off"):
        die(f"expected 'on' or 'off', got {switch!r}", code=2)
    on = switch == "on"

    async def go(client: Client) -> int:
        q = await known_queue(client, name, create=create)
        await q.set_events(on, maxlen=maxlen)
        if json_out:
            print_json({"queue": q.name, "events": on, "maxlen": maxlen if on else 0})
        elif on:
            typer.echo(f"queue {q.name}: events on, capped near {maxlen} entries ({q.keys.events})")
        else:
            typer.echo(f"queue {q.name}: events off")
        return 0

    run_with_client(redis, go)
