"""The reading commands: ``stats``, ``jobs``, ``job show``."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from redis.exceptions import ResponseError
from rich import box
from rich.table import Table
from rich.text import Text

from .._model.enums import JobState
from .._model.redact import redact
from .._model.sealing import Encrypted
from .._producer import discovery as _discovery
from .._producer import many as _many
from .._producer.client import Client
from .._producer.reads import LISTINGS, QueueStats
from .._producer.sharded import group_partitions, merge_stats
from .app import (
    Fail,
    JobQueueOpt,
    JsonOpt,
    QueueOpt,
    RedisOpt,
    ShowPayloadOpt,
    app,
    job_app,
    job_queue,
    known_queue,
    run_with_client,
)
from .history import show_history
from .output import (
    DOCUMENTS,
    MILLIS_DETAILS,
    clean,
    console,
    entry_dict,
    job_dict,
    json_default,
    lines_text,
    millis_when,
    print_json,
    print_table,
    safe_text,
    shown,
    when,
)

QueuesOpt = Annotated[
    list[str] | None,
    typer.Option("--queue", "-q", metavar="NAME", help="Queue (repeatable); default: every queue found."),
]


async def chosen_queues(client: Client, queue: list[str] | None) -> list[str]:
    """The queues named with ``-q`` (each must exist), else every queue found on the server."""
    for name in queue or []:
        await known_queue(client, name, change=False)
    return list(queue or []) or await _discovery.discover_queues(client)


@app.command()
def stats(
    queue: QueuesOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    history: Annotated[
        str | None,
        typer.Option(
            "--history",
            metavar="SPAN",
            help="The metrics history of the last SPAN instead (1h, 30m, 2d; at most 30d), step by step.",
        ),
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help="With --history: jobs of this KIND only.")
    ] = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step", metavar="SPAN", help="With --history: the step (default: 1m up to 48h, else 1h)."
        ),
    ] = None,
) -> None:
    """Per queue: jobs per state (eligible by priority, delayed, retrying, limited, ordered...), lag,
    throughput."""

    async def go(client: Client) -> int:
        names = await chosen_queues(client, queue)
        if history is not None:  # cli/history.py
            return await show_history(client, names, history, kind, step, json_out)
        # A sharded queue's partitions show as one row (docs/cluster.md). A
        # queue whose keys cannot be read (a key of the wrong type, written by
        # hand) is named on stderr; the others are still shown.
        # Every queue's reads go out many queues to a round trip (_producer/many.py).
        members = group_partitions(names)
        got, errors = await _many.stats_of(client, names)
        alive = await _many.workers_of(client, names)
        rows: list[QueueStats] = []
        broken: dict[str, str] = {}
        # Workers registered now, per logical queue (a sharded queue's partitions share them).
        workers: dict[str, int] = {}
        for group, parts in members.items():
            failed = next((errors[p] for p in parts if p in errors), None)
            if failed is not None:
                broken[group] = clean(str(failed))
                continue
            part_stats = [got[p] for p in parts]
            rows.append(part_stats[0] if parts == [group] else merge_stats(group, part_stats))
            workers[group] = len(set().union(*(alive[p] for p in parts)))
        for group, error in broken.items():
            typer.echo(f"venturi: queue {group!r}: cannot read its stats: {error}", err=True)
        status = 1 if broken else 0
        if json_out:
            print_json([{**r.to_dict(), "workers": workers[r.queue]} for r in rows])
            return status
        if not rows:
            if not broken:
                console().print("no queues found")
            return status
        title = f"venturi queues at {when(rows[0].at)}"
        if len(rows) > TABLE_ROWS:
            # A queue per tenant: a table of thousands of rows takes rich a minute to
            # draw and nobody reads it. The busiest, and the way to all of them.
            typer.echo(
                f"venturi: {len(rows):,} queues: the table shows the {TABLE_ROWS} busiest (the oldest "
                "eligible job, then the most jobs eligible, running, dead); --json lists them all, "
                "-q NAME picks queues",
                err=True,
            )
            rows = sorted(rows, key=_busiest)[:TABLE_ROWS]
            title += f", the {TABLE_ROWS} busiest of {len(members):,}"
        table = Table(title=title, box=box.SIMPLE_HEAD)
        # Short headers and no wrapping: a queue name or a count is never cut.
        table.add_column("queue", no_wrap=True)
        for col in (
            "paused",
            "crit",
            "high",
            "normal",
            "low",
            "delayed",
            "retry",
            "wait",
            "limited",
            "ordered",
            "running",
            "susp",
        ):
            table.add_column(col, justify="right", no_wrap=True)
        for col in ("dead", "compl", "cancel", "lag", "trim lag", "done/1m", "workers"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in rows:
            table.add_row(
                safe_text(r.queue),
                "yes" if r.paused else "",
                *(str(r.pending[p]) for p in ("critical", "high", "normal", "low")),
                str(r.delayed),
                str(r.retrying),
                str(r.waiting),
                str(r.limited),
                str(r.ordered),
                str(r.running),
                str(r.suspended),
                str(r.dead),
                str(r.completed),
                str(r.cancelled),
                f"{r.lag_seconds:.1f}s",
                _trim_lag(r),
                str(r.completed_last_minute),
                str(workers[r.queue]),
            )
        print_table(table)
        return status

    run_with_client(redis, go)


# Rows of the stats table at most (--json lists every queue).
TABLE_ROWS = 200


def _busiest(r: QueueStats) -> tuple[float, int, int, int, str]:
    """The busiest queue first: the oldest eligible job, then the most jobs eligible, running, dead."""
    return (-r.lag_seconds, -r.eligible, -r.running, -r.dead, r.queue)


def _more(n: int) -> str:
    """The tail of a list cut short: `` (+N more)``."""
    return f" (+{n:,} more)" if n > 0 else ""


def _trim_lag(r: QueueStats) -> str:
    """How far trimming is behind: the oldest finished job's time past its period, and the
    jobs past a count bound (``+N``); "0s" while it keeps up."""
    lag = f"{r.trim_lag_seconds:.0f}s"
    return f"{lag} +{r.over_retention:,}" if r.over_retention else lag


@app.command("workers")
def workers_cmd(
    queue: QueuesOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The workers running now: name, host, pid, queues, concurrency, jobs running, loop blocks, heartbeat."""

    async def go(client: Client) -> int:
        names = await chosen_queues(client, queue)
        # One worker on many queues is listed once, its record read once (_producer/many.py).
        listed = await _many.registered_workers(client, names)
        if json_out:
            print_json([dataclasses.asdict(w) for w in listed])
            return 0
        if not listed:
            where = ", ".join(names) if queue else "any queue"
            console().print(Text(f"no workers running on {where}"))
            return 0
        table = Table(title=f"{len(listed)} worker(s)", box=box.SIMPLE_HEAD)
        cols = ("name", "host", "pid", "queues", "conc", "running", "loop blocked", "started", "heartbeat")
        for col in (*cols, "version"):
            table.add_column(col, no_wrap=col != "queues")
        for w in listed:
            table.add_row(
                safe_text(w.name),
                safe_text(w.host),
                str(w.pid),
                safe_text(", ".join(w.queues) + _more(w.queue_count - len(w.queues))),
                str(w.concurrency),
                str(w.running),
                f"{w.loop_blocked}x, longest {w.longest_block:.1f} s" if w.loop_blocked else "-",
                when(w.started_at),
                when(w.heartbeat_at),
                safe_text(w.version),
            )
        print_table(table)
        return 0

    run_with_client(redis, go)


# -- jobs -------------------------------------------------------------------------------------


def _state(value: str | None) -> str | None:
    """``--state``: a job state, or a view of the pending jobs (retrying, delayed, limited)."""
    if value is None:
        return None
    if value.lower() not in LISTINGS:
        raise Fail(f"unknown state {value!r}: use one of {', '.join(LISTINGS)}", 2)
    return value.lower()


@app.command()
def jobs(
    queue: QueueOpt,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            "-s",
            help="pending, waiting, running, suspended, completed, dead, cancelled; or a part of "
            "pending: retrying (its last run failed), delayed (eligible later), limited (on a limit).",
        ),
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Only jobs of this KIND.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many jobs.")] = 50,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    show_payload: ShowPayloadOpt = False,
) -> None:
    """List jobs of a queue (pending by priority, finished newest first)."""

    async def go(client: Client) -> int:
        # One more than asked: whether the limit cut the list, at the cost of one job read.
        q = await known_queue(client, queue, change=False)
        found = await q.list_jobs(state=_state(state), kind=kind, limit=limit + 1)
        cut = len(found) > limit
        found = found[:limit]
        more = f"the first {limit} shown, more exist (--limit N shows more)"
        if json_out:
            print_json([job_dict(j, show_payload) for j in found])
            if cut:
                typer.echo(f"venturi: queue {clean(queue)}: {more}", err=True)
            return 0
        title = f"queue {clean(queue)}: {more}" if cut else f"queue {clean(queue)}: {len(found)} job(s)"
        table = Table(title=title, box=box.SIMPLE_HEAD)
        # Ids and times are copied by operators: never truncated; the note wraps.
        for col in ("id", "state", "kind", "priority", "runs", "failures", "updated", "eligible"):
            table.add_column(col, no_wrap=True)
        table.add_column("note", overflow="fold")
        for j in found:
            # When a pending job may be claimed (its delay or backoff); "-" for the other states.
            eligible = when(j.eligible_at) if j.state is JobState.PENDING else "-"
            table.add_row(
                j.id,
                safe_text(shown(j, "state", j.state.value)),
                safe_text(j.kind),
                safe_text(shown(j, "priority", j.priority.label)),
                safe_text(shown(j, "run_count", j.run_count)),
                safe_text(shown(j, "failures", j.failures)),
                safe_text(shown(j, "updated_at", when(j.updated_at))),
                safe_text(shown(j, "eligible_at", eligible)),
                lines_text(j.note or ""),
            )
        print_table(table)
        damaged = [j for j in found if j.corrupt]
        if damaged:
            typer.echo(
                f"{len(damaged)} job(s) with corrupt fields (marked corrupt:'stored value'): "
                + ", ".join(f"{j.id} ({', '.join(sorted(j.corrupt))})" for j in damaged)
                + "; see venturi job show ID",
                err=True,
            )
        return 0

    run_with_client(redis, go)


# Most ids of a job's dependencies (or dependents) `job show` lists in its table.
_IDS_SHOWN = 10


@job_app.command("show")
def job_show(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job id.")],
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    show_payload: ShowPayloadOpt = False,
) -> None:
    """A job's metadata, payload and carry (values masked unless --show-payload), and its journal."""

    async def go(client: Client) -> int:
        q = await job_queue(client, job_id, queue)
        try:
            info = await q.get(job_id)
            journal = await q.journal(job_id)
        except ResponseError as exc:  # a wrong-type job or journal key
            raise Fail(f"job {job_id} in queue {q.name} cannot be read: {exc}") from None
        if info is None:
            raise Fail(f"job {job_id} not found in queue {q.name}")
        if json_out:
            print_json({"job": job_dict(info, show_payload), "journal": [entry_dict(e) for e in journal]})
            return 0
        meta = Table.grid(padding=(0, 2))
        meta.add_column(style="bold")
        meta.add_column()
        rows: list[tuple[str, str, object]] = [
            ("id", "", info.id),
            ("queue", "", info.queue),
            ("kind", "", info.kind),
            ("state", "state", info.state.value),
            ("priority", "priority", info.priority.label),
            ("runs", "run_count", info.run_count),
            ("failures", "failures", info.failures),
            ("created", "created_at", when(info.created_at)),
            ("updated", "updated_at", when(info.updated_at)),
            ("eligible", "eligible_at", when(info.eligible_at)),
            ("finished", "finished_at", when(info.finished_at)),
            ("lease owner", "", info.lease_owner or "-"),
            ("lease expires", "lease_expires", when(info.lease_expires_at)),
            ("dedup", "", info.dedup or "-"),
        ]
        if info.dedup_until is not None:  # throttle (docs/dedup.md): the key held by this job until
            rows.append(("dedup held until", "dedup_until", when(info.dedup_until)))
        for label, name, value in rows:
            meta.add_row(label, safe_text(shown(info, name, value)))
        if info.order_key is not None:  # docs/semantics.md, "Ordered keys"
            pos = info.order_position
            if pos == 0:
                waits = " (holds its key)"
            elif pos:
                waits = f" (position {pos} in its key's line)"
            else:
                waits = " (waiting behind an earlier job of its key)" if info.order_waiting else ""
            meta.add_row("order key", safe_text(info.order_key + waits))
        # Workflows: both ways (docs/workflows.md), a long list cut short.
        for label, ids in (("waiting on", info.waiting_on), ("dependents", info.dependents)):
            if ids:
                more = f" (+{len(ids) - _IDS_SHOWN} more)" if len(ids) > _IDS_SHOWN else ""
                meta.add_row(label, safe_text(" ".join(ids[:_IDS_SHOWN]) + more))
        meta.add_row("note", lines_text(info.note or "-"))
        masked = False
        for name, blob in (
            ("payload", info.payload),
            ("carry", info.carry),
            ("attachment", info.attachment),
            ("result", info.result),
            ("output", info.output),
        ):
            if name in info.corrupt:
                meta.add_row(name, safe_text(f"corrupt: not msgpack: {info.corrupt[name]!r}"))
            elif blob is not None:
                if name in DOCUMENTS and not show_payload and not isinstance(blob, Encrypted):
                    blob = redact(blob)
                    masked = True
                meta.add_row(name, safe_text(json.dumps(blob, default=json_default, ensure_ascii=False)))
        if info.corrupt:
            meta.add_row("corrupt", safe_text(", ".join(sorted(info.corrupt))))
        if masked:
            meta.add_row("", Text("values masked as ***; --show-payload shows them"))
        print_table(meta)
        table = Table(title=f"journal ({len(journal)} entries)", box=box.SIMPLE_HEAD)
        for col in ("at", "event", "run"):
            table.add_column(col, no_wrap=True)
        table.add_column("note", overflow="fold")
        table.add_column("details", overflow="fold")
        for e in journal:
            details = " ".join(
                f"{k}={millis_when(v) if k in MILLIS_DETAILS else v}"
                for k, v in e.details.items()
                if k != "traceback"  # printed whole below the table
            )
            if e.attachment is not None:
                details += " attachment=" + json.dumps(e.attachment, default=json_default, ensure_ascii=False)
            table.add_row(
                safe_text(shown(e, "at", when(e.at))),
                safe_text(e.event),
                safe_text(shown(e, "run", e.run)),
                lines_text(e.note or ""),
                safe_text(details.strip()),
            )
        print_table(table)
        failed = [e for e in journal if "traceback" in e.details]
        if failed:
            # The latest failure's traceback tail (--json gives every entry's).
            last = failed[-1]
            title = f"traceback of the last failure (run {last.run}, {last.details.get('error_type', '?')})"
            console().print(Text(title, style="bold"))
            console().print(lines_text(last.details["traceback"]))
        return 0

    run_with_client(redis, go)
