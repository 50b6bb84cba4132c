"""The ``venturi`` typer application, its shared options, and how a command runs.

Every command opens one client, runs, closes, and leaves with an exit status;
every failure an operator can meet is mapped to one line on stderr in one
place (``one_line_errors``), for the admin commands and the worker alike.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from difflib import get_close_matches
from typing import Annotated, Any, NoReturn

import anyio
import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typer import core as _typer_core
from typer.core import TyperGroup

from .._model.errors import ConfigurationError, VenturiError
from .._producer.client import Client, Queue
from .._producer.sharded import group_partitions
from .._store.keys import QueueKeys
from .output import clean, hide_password

DEFAULT_URL = "redis://127.0.0.1:6379/0"


# click's exceptions, or those of typer's own copy of click (newer typer vendors it), as typer raises them.
_clicks = _typer_core._click.exceptions  # type: ignore[attr-defined,unused-ignore]


# ``venturi --help`` lists the commands in the order a newcomer needs them:
# run a worker, look (dashboard, stats, jobs, one job, the dead), follow,
# then the switches and the housekeeping, the destructive purge last. A
# command not named here goes before it, in the order its module registered it.
COMMAND_ORDER = (
    "worker",
    "dashboard",
    "stats",
    "jobs",
    "job",
    "dead",
    "events",
    "workers",
    "queue",
    "limits",
    "limit",
    "schedules",
    "schedule",
    "queues",
    "purge",
)


class OneLineUsage(TyperGroup):
    """The root group: a usage error is one line on stderr, like every other error.

    docs/operations.md promises one line starting ``venturi:`` and exit status 2;
    typer's default is a framed box of usage, hint and message. The line names
    the command's ``--help`` instead of repeating its usage.
    """

    def list_commands(self, ctx: Any) -> list[str]:
        # Typer lists them in the order the modules registered them: import order.
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        before_purge = rank["purge"] - 0.5
        return sorted(names, key=lambda n: rank.get(n, before_purge))

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _clicks.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # the help was printed: not an error line
                sys.exit(exc.exit_code)
            where = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            typer.echo(f"venturi: {clean(exc.format_message())}{where}", err=True)
            sys.exit(exc.exit_code)
        except _clicks.ClickException as exc:
            typer.echo(f"venturi: {clean(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("venturi: aborted", err=True)
            sys.exit(1)
        sys.exit(status if isinstance(status, int) else 0)


app = typer.Typer(
    cls=OneLineUsage,
    name="venturi",
    help="Operate venturi_redis queues: workers, stats, jobs, dead letters, pause, purge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
job_app = typer.Typer(help="One job: show, retry, cancel, update.", no_args_is_help=True)
dead_app = typer.Typer(help="Dead jobs.", no_args_is_help=True)
queue_app = typer.Typer(help="Queue-wide switches: pause, resume, events, history.", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"venturi {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Operate venturi_redis queues: workers, stats, jobs, dead letters, pause, purge."""


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
    typer.Option("--queue", "-q", metavar="NAME", help="Queue of the job (else found in the registry)."),
]


class Fail(Exception):
    """A one-line error for the operator, and the exit status to leave with."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- running a command ---------------------------------------------------------------------


def redis_url(redis: str | None) -> str:
    """The URL a command connects to: ``--redis``, else ``$REDIS_URL``, else the default."""
    return redis or os.environ.get("REDIS_URL") or DEFAULT_URL


def die(message: str, code: int) -> NoReturn:
    """Leave with one line on stderr (control characters escaped) and ``code``."""
    typer.echo(f"venturi: {clean(message)}", err=True)
    raise typer.Exit(code)


# A redis-py client's repr, as redis-py's Sentinel puts each sentinel's in its
# MasterNotFoundError: ~1 KB of connection settings around the host and port.
_CLIENT_REPR = re.compile(r"<redis\.[\w.]*Redis\(<.*?\bhost=([^,>]+),port=(\d+).*?\)>\)>\)>")


def _client_reprs_named(message: str) -> str:
    """``message`` with each redis-py client's repr replaced by its host:port."""
    return _CLIENT_REPR.sub(lambda m: f"sentinel {m[1]}:{m[2]}", message)


@contextmanager
def one_line_errors(*, url: str | None = None, what: str = "", config_status: int = 2) -> Iterator[None]:
    """Turn every failure an operator can meet into one line and an exit status.

    ``what`` names the thing that failed (``worker app:make cannot start``) and
    leads the line of a venturi error; ``url`` (its password hidden) says which
    Redis could not be reached. A ``ConfigurationError`` is a usage error (2)
    unless ``config_status`` says otherwise. Anything else is a bug and keeps
    its traceback.
    """
    lead = f"{what}: " if what else ""
    at = f" at {hide_password(url)}" if url else ""
    try:
        yield
    except Fail as exc:
        die(str(exc), exc.code)
    except ConfigurationError as exc:
        die(f"{lead}{exc}", config_status)
    except VenturiError as exc:
        die(f"{lead}{exc}", 1)
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        die(f"{lead}cannot reach Redis{at}: {_client_reprs_named(str(exc))}", 1)
    except RedisError as exc:
        die(f"{lead}Redis{at} refused: {exc}", 1)


def run_with_client(redis: str | None, fn: Callable[[Client], Awaitable[int | None]]) -> None:
    """Open a client on the URL, run ``fn``, close, and exit with its status."""
    url = redis_url(redis)

    async def main() -> int | None:
        client = Client.from_url(url)
        try:
            return await fn(client)
        finally:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    with one_line_errors(url=url):
        code = anyio.run(main)
    raise typer.Exit(code or 0)


# -- known queues ------------------------------------------------------------------------------

CreateOpt = Annotated[
    bool,
    typer.Option("--create", help="Act even if the queue has no keys yet (a new queue, not a typo)."),
]


async def queue_exists(client: Client, name: str) -> bool:
    """Whether queue ``name`` has any index zset, its meta hash, a registered worker, a
    schedule or a limit (``QueueKeys.presence``): one EXISTS (one slot)."""
    return bool(await client.redis.exists(*QueueKeys.for_queue(name, client.namespace).presence))


async def known_queue(client: Client, name: str, *, create: bool = False, change: bool = True) -> Queue:
    """Queue ``name`` if it exists (or ``create``), else a ``Fail`` that lists the queues there are.

    A mistyped name must not be paused, purged or listed as an empty queue:
    commands that change a queue say how to act anyway (``--create``); reads
    just say the queue is unknown.
    """
    queue = client.queue(name)  # the name is checked first
    if create or await queue_exists(client, name):
        return queue
    from .._producer import discovery as _discovery  # only on this hint's path, not at a worker's start

    known = list(group_partitions(await _discovery.discover_queues(client)))
    close = get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if known:
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        hint += f"queues here: {shown}"
    else:
        hint += f"no queues here (namespace {client.namespace!r})"
    anyway = "; --create acts on it anyway" if change else ""
    raise Fail(f"queue {name!r} is unknown (no jobs, no state, no worker): {hint}{anyway}")


async def job_queue(client: Client, job_id: str, queue: str | None) -> Queue:
    """The queue of ``job_id``: the one named, else the registered queue that holds it
    (one EXISTS per queue of the registry, never a walk of the keyspace)."""
    if queue is not None:
        return client.queue(queue)
    from .._producer import discovery as _discovery

    name = await _discovery.find_job_queue(client, job_id)
    if name is None:
        n = len(await _discovery.registered(client))
        raise Fail(
            f"job {job_id} not found in any of the {n} queue(s) in the registry (namespace "
            f"{client.namespace!r}); a queue written before the registry existed is found once "
            "`venturi queues rebuild` has run; or name the queue with -q"
        )
    return client.queue(name)
