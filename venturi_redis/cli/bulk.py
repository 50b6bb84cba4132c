"""Bulk actions by filter: ``venturi dead retry``, ``venturi cancel`` and ``venturi purge``.

Each takes the filters of ``vr.BulkFilters`` (docs/operations.md, "Bulk
actions by filter"): ``--kind``, ``--error-type``, ``--since`` / ``--until``
(a duration back from now or an ISO time), ``--note-contains``, ``--limit``.
Each counts the matching jobs first (``--dry-run`` stops there), then acts in
short batches behind a progress bar on stderr, and says what it did; a job
whose own data is corrupt is refused, named on stderr, and the exit status
is 1. Running one again after an interruption does what is left.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress

from .._model.backoff import to_ms
from .._producer import bulk as _bulk
from .._producer import ops as _ops
from .._producer.base import server_now_ms
from .._producer.bulk import BulkFilters, BulkProgress, make_filter
from .._producer.client import Client, Queue
from .._store.store import Retried
from .app import CreateOpt, JsonOpt, QueueOpt, RedisOpt, app, dead_app, die, known_queue, run_with_client
from .output import clean, print_json

T = TypeVar("T")

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

KindOpt = Annotated[str | None, typer.Option("--kind", "-k", help="Only jobs of this KIND.")]
ErrorTypeOpt = Annotated[
    str | None,
    typer.Option("--error-type", "-e", help="Only jobs whose last failure raised this (ValueError)."),
]
NoteOpt = Annotated[
    str | None, typer.Option("--note-contains", help="Only jobs whose note (the error) holds this text.")
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help="Only jobs up to this time (same forms as --since).")
]
LimitOpt = Annotated[int | None, typer.Option("--limit", "-n", min=1, help="At most N, oldest first.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Only count the matching jobs; change nothing.")]


def when(text: str | None, flag: str) -> datetime | timedelta | None:
    """``--since`` / ``--until``: a duration back from now (``90s``, ``15m``, ``1h``, ``2d``,
    ``1w``) or an ISO 8601 time with its timezone (``2026-12-06T10:00Z``)."""
    if text is None:
        return None
    m = _DURATION_RE.fullmatch(text.strip())
    if m:
        return timedelta(seconds=float(m[1]) * _UNITS[m[2]])
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        die(f"{flag} {text!r}: give a duration back from now (90s, 15m, 1h, 2d, 1w) or an ISO time", 2)
    if at.tzinfo is None:
        die(f"{flag} {text!r} has no timezone: add one (2026-12-06T10:00Z, ...+01:00)", 2)
    return at


def _filters(
    kind: str | None,
    error_type: str | None,
    since: str | None,
    until: str | None,
    note_contains: str | None,
    limit: int | None,
) -> BulkFilters:
    return {
        "kind": kind,
        "error_type": error_type,
        "since": when(since, "--since"),
        "until": when(until, "--until"),
        "note_contains": note_contains,
        "limit": limit,
    }


async def _counted_then_done(
    q: Queue,
    state: str,
    filters: BulkFilters,
    *,
    noun: str,
    doing: str,
    dry_run: bool,
    json_out: bool,
    act: Callable[[BulkFilters], Awaitable[T]],
    older_than_ms: int = 0,
) -> tuple[int, T] | None:
    """Count the matching jobs (said first), then ``act`` behind a progress bar: how many
    matched and what ``act`` returned, None on --dry-run. ``older_than_ms`` narrows the
    count as ``purge --older-than`` narrows the action."""
    now = await server_now_ms(q.client)
    flt = make_filter(filters, now)
    if older_than_ms:
        end = now - older_than_ms if flt.until_ms is None else min(flt.until_ms, now - older_than_ms)
        flt = dataclasses.replace(flt, until_ms=end)
    matched = await _bulk.count_matching(q, state, flt, now)
    what = f" of kind {clean(filters['kind'] or '')}" if filters.get("kind") else ""
    if dry_run:
        if json_out:
            print_json(
                {
                    "queue": q.name,
                    "state": state,
                    "kind": filters.get("kind"),
                    "matched": matched,
                    "dry_run": True,
                }
            )
        else:
            typer.echo(f"queue {q.name}: {matched} {noun}(s){what} match; nothing done (--dry-run)")
        return None
    if not json_out:
        typer.echo(f"queue {q.name}: {matched} {noun}(s){what} match; {doing}")
    with Progress(
        *Progress.get_default_columns(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=json_out or matched == 0,
    ) as bar:
        task = bar.add_task(doing, total=matched)

        def show(p: BulkProgress) -> None:
            bar.update(task, completed=p.done + p.skipped)

        run = filters.copy()
        run["on_progress"] = show
        return matched, await act(run)


def _say_refused(refused: dict[str, str], what: str) -> int:
    """A corrupt job is left as it is (docs/guarantees.md): each named on stderr; exit 1."""
    for job_id, why in refused.items():
        typer.echo(f"venturi: job {job_id} not {what}: {clean(why)}; repair it, then try again", err=True)
    return 1 if refused else 0


def _how_many(all_: bool, limit: int | None, dry_run: bool, verb: str, flag_help: str) -> None:
    if not all_ and limit is None and not dry_run:
        die(f"say how many: --all {verb} every {flag_help}, --limit N at most N", 2)


@dead_app.command("retry")
def dead_retry(
    queue: QueueOpt,
    kind: KindOpt = None,
    error_type: ErrorTypeOpt = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only jobs dead since this: a duration back (1h, 2d) or an ISO time."),
    ] = None,
    until: UntilOpt = None,
    note_contains: NoteOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Retry every (matching) dead job.")] = False,
    limit: LimitOpt = None,
    dry_run: DryRunOpt = False,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Move dead jobs back to pending: `--all`, or `--limit N` (oldest deaths first), of those
    matching the filters; counts them first, then shows a progress bar. In short batches: safe
    to interrupt and run again."""
    _how_many(all_, limit, dry_run, "retries", "dead job (of --kind K if given)")
    filters = _filters(kind, error_type, since, until, note_contains, limit)

    async def go(client: Client) -> int:
        q = await known_queue(client, queue, create=create)

        async def act(run: BulkFilters) -> Retried:
            return await _ops.retry_dead_report(q, **run)

        done = await _counted_then_done(
            q, "dead", filters, noun="dead job", doing="retrying", dry_run=dry_run, json_out=json_out, act=act
        )
        if done is None:
            return 0
        matched, (moved, refused) = done
        what = f" of kind {clean(kind)}" if kind else ""
        if json_out:
            print_json(
                {"queue": q.name, "kind": kind, "matched": matched, "retried": moved, "refused": refused}
            )
        else:
            typer.echo(f"queue {q.name}: {len(moved)} dead job(s){what} moved back to pending")
        return _say_refused(refused, "retried")

    run_with_client(redis, go)


@app.command("cancel")
def cancel(
    queue: QueueOpt,
    state: Annotated[
        str, typer.Option("--state", "-s", help="pending, suspended, waiting or running.")
    ] = "pending",
    kind: KindOpt = None,
    error_type: ErrorTypeOpt = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only jobs enqueued since this: a duration back (1h, 2d) or an ISO time."
        ),
    ] = None,
    until: UntilOpt = None,
    note_contains: NoteOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Cancel every (matching) job of --state.")] = False,
    limit: LimitOpt = None,
    dry_run: DryRunOpt = False,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Cancel the jobs of one state that match the filters (`--since` / `--until` on when each was
    enqueued): `--all`, or `--limit N`, oldest first; counts them first. A running job is asked to
    stop, as `venturi job cancel`. In short batches: safe to interrupt and run again."""
    if state not in _bulk.CANCELLABLE:
        die(f"--state must be one of {', '.join(_bulk.CANCELLABLE)}, got {state!r}", 2)
    _how_many(all_, limit, dry_run, "cancels", f"{state} job (of --kind K if given)")
    filters = _filters(kind, error_type, since, until, note_contains, limit)

    async def go(client: Client) -> int:
        q = await known_queue(client, queue, create=create)

        async def act(run: BulkFilters) -> Retried:
            return await _ops.cancel_jobs(q, state, **run)

        noun = f"{state} job"
        done = await _counted_then_done(
            q, state, filters, noun=noun, doing="cancelling", dry_run=dry_run, json_out=json_out, act=act
        )
        if done is None:
            return 0
        matched, (cancelled, refused) = done
        what = f" of kind {clean(kind)}" if kind else ""
        if json_out:
            doc = {"queue": q.name, "state": state, "kind": kind, "matched": matched}
            print_json({**doc, "cancelled": cancelled, "refused": refused})
        elif state == "running":
            typer.echo(f"queue {q.name}: {len(cancelled)} running job(s){what} asked to stop")
        else:
            typer.echo(f"queue {q.name}: {len(cancelled)} {state} job(s){what} cancelled")
        return _say_refused(refused, "cancelled")

    run_with_client(redis, go)


@app.command()
def purge(
    queue: QueueOpt,
    state: Annotated[str, typer.Option("--state", "-s", help="completed, dead or cancelled.")],
    older_than: Annotated[
        float,
        typer.Option("--older-than", min=0, metavar="SECONDS", help="Only jobs finished this long ago."),
    ] = 0.0,
    kind: KindOpt = None,
    error_type: ErrorTypeOpt = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only jobs finished since this: a duration back (1h, 2d) or an ISO time."
        ),
    ] = None,
    until: UntilOpt = None,
    note_contains: NoteOpt = None,
    limit: LimitOpt = None,
    dry_run: DryRunOpt = False,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    create: CreateOpt = False,
) -> None:
    """Remove finished jobs of one state, with their journals, in short batches; with a filter
    (`--kind`, `--since`...) or `--dry-run`, counts the matching ones first."""
    if state not in ("completed", "dead", "cancelled"):
        die(f"--state must be completed, dead or cancelled (finished jobs only), got {state!r}", 2)
    filters = _filters(kind, error_type, since, until, note_contains, limit)
    filtered = any(v is not None for v in filters.values())

    async def go(client: Client) -> int:
        q = await known_queue(client, queue, create=create)
        if not filtered and not dry_run:  # the whole state: the purge script, batch after batch
            removed = await q.purge(state, older_than=older_than)
        else:

            async def act(run: BulkFilters) -> int:
                return await q.purge(state, older_than=older_than, **run)

            done = await _counted_then_done(
                q,
                state,
                filters,
                noun=f"{state} job",
                doing="removing",
                dry_run=dry_run,
                json_out=json_out,
                act=act,
                older_than_ms=to_ms(older_than, "older_than"),
            )
            if done is None:
                return 0
            removed = done[1]
        if json_out:
            print_json({"queue": q.name, "state": state, "removed": removed})
        else:
            typer.echo(f"queue {q.name}: removed {removed} {state} job(s)")
        return 0

    run_with_client(redis, go)
