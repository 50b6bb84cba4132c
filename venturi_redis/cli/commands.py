"""The ``venturi`` commands (typer + rich). Every command only calls the Python API.

Conventions every command follows:

- ``--redis URL`` (default: ``REDIS_URL``, then ``redis://127.0.0.1:6379/0``);
- ``--json`` prints one JSON document on stdout instead of tables;
- exit status 0 on success, 1 when the operation could not be done (unknown
  job, wrong state, Redis unreachable, a worker refused to start), 2 for a
  usage error;
- strings that come from users or from Redis (kinds, notes, payloads, ids)
  are printed with control characters escaped, never interpreted, so a job
  cannot rewrite the operator's terminal.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import importlib
import inspect
import json
import logging
import os
import re
import sys
import unicodedata
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, NoReturn

import anyio
import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .._model.enums import JobState
from .._model.errors import ConfigurationError, VenturiError
from .._model.records import JobInfo, JournalEntry
from .._model.redact import redact
from .._producer import ops as _ops
from .._producer.client import Client, Queue
from .._producer.sharded import grouped_stats

DEFAULT_URL = "redis://127.0.0.1:6379/0"

app = typer.Typer(
    name="venturi",
    help="Operate venturi_redis queues: workers, stats, jobs, dead letters, pause, purge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
job_app = typer.Typer(help="One job: show, retry, cancel.", no_args_is_help=True)
dead_app = typer.Typer(help="Dead jobs.", no_args_is_help=True)
queue_app = typer.Typer(help="Queue-wide switches: pause, resume.", no_args_is_help=True)
app.add_typer(job_app, name="job")
app.add_typer(dead_app, name="dead")
app.add_typer(queue_app, name="queue")

RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis",
        metavar="URL",
        help=f"Redis URL (default: $REDIS_URL, then {DEFAULT_URL}).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
QueueOpt = Annotated[str, typer.Option("--queue", "-q", metavar="NAME", help="Queue name.")]
ShowPayloadOpt = Annotated[
    bool,
    typer.Option(
        "--show-payload",
        help="Show the values of payload, carry, result and output (masked as *** by default).",
    ),
]
JobQueueOpt = Annotated[
    str | None,
    typer.Option("--queue", "-q", metavar="NAME", help="Queue of the job (found by SCAN when omitted)."),
]


class _Fail(Exception):
    """A one-line error for the operator, and the exit status to leave with."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- output helpers ------------------------------------------------------------------------

_CONTROL_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def clean(value: object) -> str:
    """``value`` as text with every control / format character escaped (``\\x1b``, ``\\u202e``).

    Escapes, bidi overrides and zero-width characters in a job's kind, note or
    payload are shown, not obeyed. Newlines are escaped too: one value, one line.
    """
    text = value if isinstance(value, str) else str(value)
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in _CONTROL_CATEGORIES:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def _t(value: object) -> Text:
    """A rich Text of a cleaned value: never parsed as rich markup."""
    return Text("" if value is None else clean(value))


def _console() -> Console:
    # Wide when not a terminal (pipes, CI logs), so tables are not wrapped into noise.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=200 if wide else None)


def _print(renderable: Any) -> None:
    """Print a table; if it cannot fit without cutting ids or counts, print it wider.

    Columns that must never be cut (ids, names, numbers, times) are ``no_wrap``;
    when they do not fit the terminal, the lines run long (the terminal wraps
    them) instead of showing ``01M8VY…`` or ``1…``.
    """
    con = _console()
    unbounded = con.options.update(width=100_000)  # measure without the terminal's cap
    if isinstance(renderable, Table):
        for col in renderable.columns:
            if col.no_wrap:
                cells = [col.header, *col.cells]
                col.min_width = max(Measurement.get(con, unbounded, c).maximum for c in cells)
    need = Measurement.get(con, unbounded, renderable).minimum
    if need > con.width:
        con = Console(highlight=False, soft_wrap=False, width=need)
    con.print(renderable)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, default=_json_default, indent=2, sort_keys=False))


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z") if value else "-"


def _shown(info: JobInfo | JournalEntry, name: str, value: object) -> object:
    """``value``, or the field's stored text marked as corrupt when it did not parse."""
    if name in info.corrupt:
        return f"corrupt:{info.corrupt[name]!r}"
    return value


# The job's own data: masked unless --show-payload (docs/operations.md, "What the CLI shows").
# Notes and attachments are what a run reports to operators: always shown.
_DOCUMENTS = ("payload", "carry", "result", "output")


def _job_dict(info: JobInfo, show_payload: bool = False) -> dict[str, Any]:
    d = dataclasses.asdict(info)
    d["state"] = info.state.value
    d["priority"] = info.priority.label
    if not show_payload:
        for name in _DOCUMENTS:
            d[name] = redact(d[name])
    return d


def _entry_dict(e: JournalEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": e.at,
        "event": e.event,
        "run": e.run,
        "note": e.note,
        "attachment": e.attachment,
        "details": e.details,
        "corrupt": e.corrupt,
    }


def _redact(url: str) -> str:
    """A URL fit for an error message: the password replaced by ***."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


# -- running a command ---------------------------------------------------------------------


def _url(redis: str | None) -> str:
    return redis or os.environ.get("REDIS_URL") or DEFAULT_URL


def _run(redis: str | None, fn: Callable[[Client], Awaitable[int | None]]) -> None:
    """Open a client on the URL, run ``fn``, close, and exit with its status.

    Every expected failure becomes one line on stderr and a non-zero status.
    """
    url = _url(redis)

    async def main() -> int | None:
        client = Client.from_url(url)
        try:
            return await fn(client)
        finally:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    try:
        code = anyio.run(main)
    except _Fail as exc:
        _die(str(exc), exc.code)
    except ConfigurationError as exc:
        _die(str(exc), 2)
    except VenturiError as exc:
        _die(str(exc), 1)
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        _die(f"cannot reach Redis at {_redact(url)}: {exc}", 1)
    except RedisError as exc:
        _die(f"Redis at {_redact(url)} refused: {exc}", 1)
    raise typer.Exit(code or 0)


def _die(message: str, code: int) -> NoReturn:
    typer.echo(f"venturi: {clean(message)}", err=True)
    raise typer.Exit(code)


async def _job_queue(client: Client, job_id: str, queue: str | None) -> Queue:
    if queue is not None:
        return client.queue(queue)
    name = await _ops.find_job_queue(client, job_id)
    if name is None:
        raise _Fail(f"job {job_id} not found in any queue (namespace {client.namespace!r})")
    return client.queue(name)


# -- stats ------------------------------------------------------------------------------------


@app.command()
def stats(
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", metavar="NAME", help="Queue (repeatable); default: every queue found."),
    ] = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Per queue: eligible per priority, delayed, running, suspended, dead, completed, lag, throughput."""

    async def go(client: Client) -> int:
        names = list(queue or []) or await _ops.discover_queues(client)
        # A sharded queue's partitions show as one row (docs/cluster.md).
        rows = await grouped_stats(client, names)
        if json_out:
            _print_json([r.to_dict() for r in rows])
            return 0
        if not rows:
            _console().print("no queues found")
            return 0
        table = Table(title=f"venturi queues at {_when(rows[0].at)}", box=box.SIMPLE_HEAD)
        # Short headers and no wrapping: a queue name or a count is never cut.
        table.add_column("queue", no_wrap=True)
        for col in ("paused", "crit", "high", "normal", "low", "delayed", "running", "susp"):
            table.add_column(col, justify="right", no_wrap=True)
        for col in ("dead", "compl", "cancel", "lag", "done/1m"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in rows:
            table.add_row(
                _t(r.queue),
                "yes" if r.paused else "",
                *(str(r.pending[p]) for p in ("critical", "high", "normal", "low")),
                str(r.delayed),
                str(r.running),
                str(r.suspended),
                str(r.dead),
                str(r.completed),
                str(r.cancelled),
                f"{r.lag_seconds:.1f}s",
                str(r.completed_last_minute),
            )
        _print(table)
        return 0

    _run(redis, go)


# -- jobs -------------------------------------------------------------------------------------


def _state(value: str | None) -> JobState | None:
    if value is None:
        return None
    try:
        return JobState(value.lower())
    except ValueError:
        raise _Fail(
            f"unknown state {value!r}: use one of {', '.join(s.value for s in JobState)}", 2
        ) from None


@app.command()
def jobs(
    queue: QueueOpt,
    state: Annotated[
        str | None,
        typer.Option("--state", "-s", help="pending, running, suspended, completed, dead, cancelled."),
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Only jobs of this KIND.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many jobs.")] = 50,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
    show_payload: ShowPayloadOpt = False,
) -> None:
    """List jobs of a queue (pending by priority, finished newest first)."""

    async def go(client: Client) -> int:
        found = await client.queue(queue).list_jobs(state=_state(state), kind=kind, limit=limit)
        if json_out:
            _print_json([_job_dict(j, show_payload) for j in found])
            return 0
        table = Table(title=f"queue {clean(queue)}: {len(found)} job(s)", box=box.SIMPLE_HEAD)
        # Ids and times are copied by operators: never truncated; the note wraps.
        for col in ("id", "state", "kind", "priority", "runs", "failures", "updated"):
            table.add_column(col, no_wrap=True)
        table.add_column("note", overflow="fold")
        for j in found:
            table.add_row(
                j.id,
                _t(_shown(j, "state", j.state.value)),
                _t(j.kind),
                _t(_shown(j, "priority", j.priority.label)),
                _t(_shown(j, "run_count", j.run_count)),
                _t(_shown(j, "failures", j.failures)),
                _t(_shown(j, "updated_at", _when(j.updated_at))),
                _t(j.note or ""),
            )
        _print(table)
        damaged = [j for j in found if j.corrupt]
        if damaged:
            typer.echo(
                f"{len(damaged)} job(s) with corrupt fields (marked corrupt:'stored value'): "
                + ", ".join(f"{j.id} ({', '.join(sorted(j.corrupt))})" for j in damaged)
                + "; see venturi job show ID",
                err=True,
            )
        return 0

    _run(redis, go)


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
        q = await _job_queue(client, job_id, queue)
        try:
            info = await q.get(job_id)
            journal = await q.journal(job_id)
        except ResponseError as exc:  # a wrong-type job or journal key
            raise _Fail(f"job {job_id} in queue {q.name} cannot be read: {exc}") from None
        if info is None:
            raise _Fail(f"job {job_id} not found in queue {q.name}")
        if json_out:
            _print_json({"job": _job_dict(info, show_payload), "journal": [_entry_dict(e) for e in journal]})
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
            ("created", "created_at", _when(info.created_at)),
            ("updated", "updated_at", _when(info.updated_at)),
            ("eligible", "eligible_at", _when(info.eligible_at)),
            ("finished", "finished_at", _when(info.finished_at)),
            ("lease owner", "", info.lease_owner or "-"),
            ("lease expires", "lease_expires", _when(info.lease_expires_at)),
            ("dedup", "", info.dedup or "-"),
            ("note", "", info.note or "-"),
        ]
        for label, name, value in rows:
            meta.add_row(label, _t(_shown(info, name, value)))
        masked = False
        for name, blob in (
            ("payload", info.payload),
            ("carry", info.carry),
            ("attachment", info.attachment),
            ("result", info.result),
            ("output", info.output),
        ):
            if name in info.corrupt:
                meta.add_row(name, _t(f"corrupt: not msgpack: {info.corrupt[name]!r}"))
            elif blob is not None:
                if name in _DOCUMENTS and not show_payload:
                    blob = redact(blob)
                    masked = True
                meta.add_row(name, _t(json.dumps(blob, default=_json_default, ensure_ascii=False)))
        if info.corrupt:
            meta.add_row("corrupt", _t(", ".join(sorted(info.corrupt))))
        if masked:
            meta.add_row("", Text("values masked as ***; --show-payload shows them"))
        _print(meta)
        table = Table(title=f"journal ({len(journal)} entries)", box=box.SIMPLE_HEAD)
        for col in ("at", "event", "run"):
            table.add_column(col, no_wrap=True)
        table.add_column("note", overflow="fold")
        table.add_column("details", overflow="fold")
        for e in journal:
            details = " ".join(f"{k}={v}" for k, v in e.details.items())
            if e.attachment is not None:
                details += " attachment=" + json.dumps(
                    e.attachment, default=_json_default, ensure_ascii=False
                )
            table.add_row(
                _t(_shown(e, "at", _when(e.at))),
                _t(e.event),
                _t(_shown(e, "run", e.run)),
                _t(e.note or ""),
                _t(details.strip()),
            )
        _print(table)
        return 0

    _run(redis, go)


@job_app.command("retry")
def job_retry(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A dead job's id.")],
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Move a dead job back to pending (failures reset; journaled as `retried`)."""

    async def go(client: Client) -> int:
        q = await _job_queue(client, job_id, queue)
        moved = await q.retry(job_id)
        info = await q.get(job_id)
        state = info.state.value if info is not None else None
        if json_out:
            _print_json({"id": job_id, "queue": q.name, "retried": moved, "state": state})
        elif moved:
            typer.echo(
                f"job {job_id} ({clean(info.kind if info else '?')}): dead -> pending in queue {q.name}"
            )
        if moved:
            return 0
        if not json_out:
            why = "does not exist" if state is None else f"is {state}, not dead"
            typer.echo(f"venturi: job {job_id} {why} in queue {q.name}; nothing done", err=True)
        return 1

    _run(redis, go)


@job_app.command("cancel")
def job_cancel(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job id.")],
    queue: JobQueueOpt = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel a job: pending or suspended ends cancelled now; a running one is asked to stop."""

    async def go(client: Client) -> int:
        q = await _job_queue(client, job_id, queue)
        result, detail = await _ops.cancel(q, job_id)
        if json_out:
            _print_json({"id": job_id, "queue": q.name, "result": result, "detail": detail})
        elif result == "cancelled":
            typer.echo(f"job {job_id}: cancelled")
        elif result == "requested":
            typer.echo(
                f"job {job_id} is running: its worker will ask it to stop at its next lease "
                "renewal and the run will end cancelled"
            )
        else:
            typer.echo(f"venturi: job {job_id}: {clean(detail)}; nothing done", err=True)
        return 0 if result in ("cancelled", "requested") else 1

    _run(redis, go)


# -- dead letters, purge, pause -------------------------------------------------------------------


@dead_app.command("retry")
def dead_retry(
    queue: QueueOpt,
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Only dead jobs of this KIND.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Retry every (matching) dead job.")] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=1, help="Retry at most N, oldest death first.")
    ] = None,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Move dead jobs back to pending: `--all`, or `--limit N` (oldest deaths first)."""
    if not all_ and limit is None:
        _die("say how many: --all retries every dead job (of --kind K if given), --limit N at most N", 2)

    async def go(client: Client) -> int:
        q = client.queue(queue)
        moved = await q.retry_dead(kind=kind, limit=limit)
        if json_out:
            _print_json({"queue": q.name, "kind": kind, "retried": moved})
        else:
            what = f" of kind {clean(kind)}" if kind else ""
            typer.echo(f"queue {q.name}: {len(moved)} dead job(s){what} moved back to pending")
        return 0

    _run(redis, go)


@app.command()
def purge(
    queue: QueueOpt,
    state: Annotated[str, typer.Option("--state", "-s", help="completed, dead or cancelled.")],
    older_than: Annotated[
        float,
        typer.Option("--older-than", min=0, metavar="SECONDS", help="Only jobs finished this long ago."),
    ] = 0.0,
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Remove finished jobs of one state, with their journals, in short batches."""
    if state not in ("completed", "dead", "cancelled"):
        _die(f"--state must be completed, dead or cancelled (finished jobs only), got {state!r}", 2)

    async def go(client: Client) -> int:
        q = client.queue(queue)
        removed = await q.purge(state, older_than=older_than)
        if json_out:
            _print_json({"queue": q.name, "state": state, "removed": removed})
        else:
            typer.echo(f"queue {q.name}: removed {removed} {state} job(s)")
        return 0

    _run(redis, go)


@queue_app.command("pause")
def queue_pause(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Stop every worker from claiming (atomic). Running jobs finish; enqueues still land."""

    async def go(client: Client) -> int:
        q = client.queue(name)
        await q.pause()
        if json_out:
            _print_json({"queue": q.name, "paused": True})
        else:
            typer.echo(f"queue {q.name}: paused (no new claims; running jobs finish; enqueues still land)")
        return 0

    _run(redis, go)


@queue_app.command("resume")
def queue_resume(
    name: Annotated[str, typer.Argument(metavar="QUEUE")],
    redis: RedisOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Let workers claim from the queue again (and wake them)."""

    async def go(client: Client) -> int:
        q = client.queue(name)
        await q.resume_queue()
        if json_out:
            _print_json({"queue": q.name, "paused": False})
        else:
            typer.echo(f"queue {q.name}: resumed")
        return 0

    _run(redis, go)


# -- worker ---------------------------------------------------------------------------------------


def _load_target(target: str) -> Any:
    """Import ``MODULE:ATTR``; every failure is one line."""
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise _Fail(f"expected MODULE:ATTR (for example myapp.tasks:worker), got {target!r}", 2)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the project directory is importable
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            raise _Fail(
                f"cannot import {mod_name!r}: no module named {exc.name!r} "
                "(run venturi from your project's directory, or install the project)"
            ) from None
        raise _Fail(f"importing {mod_name!r} failed: ModuleNotFoundError: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise _Fail(f"importing {mod_name!r} failed: {type(exc).__name__}: {first}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _Fail(f"module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def _loop_options(loop: str) -> dict[str, Any]:
    """anyio's asyncio backend options for ``--loop`` (a usage error when unusable)."""
    if loop == "asyncio":
        return {}
    if loop != "uvloop":
        _die(f"--loop must be asyncio or uvloop, not {loop!r}", 2)
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        _die(f"--loop uvloop needs the uvloop package ({exc}): pip install 'venturi_redis[uvloop]'", 2)
    return {"loop_factory": uvloop.new_event_loop}


class _JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "at": datetime.fromtimestamp(record.created).astimezone().isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


@app.command()
def worker(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:ATTR", help="A vr.Worker, or a (sync or async) factory returning one."
        ),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="NAME",
            help="Consume only this queue, sharded queue or partition (repeatable).",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", min=1, help="Handlers at once, per queue.")
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis",
            metavar="URL",
            help="Exported as REDIS_URL before MODULE is imported (for Client.from_url()).",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics here.")
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option("--metrics-addr", help="Address for the metrics server.")
    ] = "0.0.0.0",
    no_eviction_check: Annotated[
        bool,
        typer.Option("--no-eviction-check", help="Start even if maxmemory-policy is not noeviction."),
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error.")] = "info",
    json_out: Annotated[bool, typer.Option("--json", help="Log JSON lines instead of text.")] = False,
    loop: Annotated[
        str,
        typer.Option(
            "--loop",
            metavar="asyncio|uvloop",
            help="The event loop. uvloop: pip install 'venturi_redis[uvloop]' (benchmarks/README.md).",
        ),
    ] = "asyncio",
) -> None:
    """Run a worker until SIGTERM / SIGINT (graceful: running jobs get their grace period)."""
    from .._worker.worker import Worker

    backend_options = _loop_options(loop)

    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonLogFormatter()
        if json_out
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(log_level.upper())
    if redis:
        os.environ["REDIS_URL"] = redis

    async def main() -> int:
        obj = _load_target(target)
        w = obj
        if not isinstance(w, Worker):
            if not callable(obj):
                raise _Fail(f"{target} is a {type(obj).__name__}, not a vr.Worker or a factory returning one")
            if isinstance(obj, type) and not issubclass(obj, Worker):
                raise _Fail(
                    f"{target} is the class {obj.__name__}, not a vr.Worker or a factory returning one"
                )
            try:
                w = obj()
                if inspect.isawaitable(w):
                    w = await w
            except Exception as exc:  # noqa: BLE001 - the user's factory: report it in one line
                first = (str(exc).strip().splitlines() or [""])[0]
                raise _Fail(f"calling {target}() failed: {type(exc).__name__}: {first}") from None
            if not isinstance(w, Worker):
                raise _Fail(f"{target}() returned a {type(w).__name__}, not a vr.Worker")
        if queue:
            w.only_queues(queue)
        if concurrency is not None:
            w.concurrency = concurrency  # a default batch_size follows it
        if no_eviction_check:
            w.check_eviction_policy = False
        running = type(asyncio.get_running_loop())
        logging.getLogger("venturi_redis.cli").info(
            "event loop: %s.%s", running.__module__, running.__qualname__
        )
        if metrics_port is None:
            await w.run()
            return 0
        from .._worker.metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
        w.observer = metrics
        server = metrics.serve(metrics_port, metrics_addr)
        logging.getLogger("venturi_redis.metrics").info(
            "serving Prometheus metrics on http://%s:%d/metrics", metrics_addr, server[0].server_port
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(metrics.refresh_forever, w.queues)
                await w.run()
                tg.cancel_scope.cancel()
        finally:
            server[0].shutdown()
            server[0].server_close()
        return 0

    try:
        code = anyio.run(main, backend_options=backend_options)
    except _Fail as exc:
        _die(str(exc), exc.code)
    except VenturiError as exc:
        _die(f"worker {target} cannot start: {exc}", 1)
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        _die(f"worker {target}: cannot reach Redis: {exc}", 1)
    raise typer.Exit(code)
