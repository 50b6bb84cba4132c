"""``venturi worker MODULE:ATTR``: import the user's worker, run it until a signal."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, cast

import anyio
import typer

from .._worker.logcontext import JobLogFilter, json_fields, text_suffix
from .app import DEFAULT_URL, Fail, app, die, one_line_errors, redis_url


def _load_target(target: str) -> Any:
    """Import ``MODULE:ATTR``; every failure is one line."""
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise Fail(f"expected MODULE:ATTR (for example myapp.tasks:worker), got {target!r}", 2)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the project directory is importable
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            raise Fail(
                f"cannot import {mod_name!r}: no module named {exc.name!r} "
                "(run venturi from your project's directory, or install the project)"
            ) from None
        raise Fail(f"importing {mod_name!r} failed: ModuleNotFoundError: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise Fail(f"importing {mod_name!r} failed: {type(exc).__name__}: {first}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Fail(f"module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def _loop_options(loop: str) -> dict[str, Any]:
    """anyio's asyncio backend options for ``--loop`` (a usage error when unusable)."""
    if loop == "asyncio":
        return {}
    if loop != "uvloop":
        die(f"--loop must be asyncio or uvloop, not {loop!r}", 2)
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        die(f"--loop uvloop needs the uvloop package ({exc}): pip install 'venturi_redis[uvloop]'", 2)
    return {"loop_factory": uvloop.new_event_loop}


def _metrics_usable(metrics_port: int | None) -> None:
    """``--metrics-port`` without prometheus_client: a usage error now, before any worker is built."""
    if metrics_port is None:
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        die(f"--metrics-port needs prometheus_client ({exc}): pip install 'venturi-redis[metrics]'", 2)


class _JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "at": datetime.fromtimestamp(record.created).astimezone().isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(json_fields(record))  # the job it belongs to, when it does (JobLogFilter)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class _TextLogFormatter(logging.Formatter):
    """The text lines: `` [KIND JOB_ID run N]`` appended to a record logged during a run."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record) + text_suffix(record)


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
            help=f"Exported as REDIS_URL before MODULE is imported, for Client.from_url() "
            f"(default: $REDIS_URL, then {DEFAULT_URL}).",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus metrics here.")
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option("--metrics-addr", help="Address for the metrics server.")
    ] = "0.0.0.0",
    metrics_gauges: Annotated[
        str,
        typer.Option(
            "--metrics-gauges",
            metavar="all|elected|none",
            help="Who exports the venturi_queue_* gauges (27 Redis reads a queue every 5 s): every "
            "worker (all), one of the workers serving the same queues at a time (elected), or none.",
        ),
    ] = "all",
    no_eviction_check: Annotated[
        bool,
        typer.Option("--no-eviction-check", help="Start even if maxmemory-policy is not noeviction."),
    ] = False,
    startup_wait: Annotated[
        float | None,
        typer.Option(
            "--startup-wait",
            min=0,
            metavar="SECONDS",
            help="Keep trying a Redis not reachable at start this long (default 30; 0: exit at once).",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error.")] = "info",
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Log JSON lines instead of text (a run's: with job_id, kind, queue, run)."
        ),
    ] = False,
    log_runs: Annotated[
        bool,
        typer.Option("--log-runs", help="Log one INFO line per finished run: its job, ending and duration."),
    ] = False,
    loop: Annotated[
        str,
        typer.Option(
            "--loop",
            metavar="asyncio|uvloop",
            # Escaped: rich markup would take "[uvloop]" for a style tag and drop it.
            help="The event loop. uvloop: pip install 'venturi_redis\\[uvloop]' (benchmarks/README.md).",
        ),
    ] = "asyncio",
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            help="Worker processes, restarted when they die; signals go to all (cli/processes.py).",
        ),
    ] = 1,
    health_file: Annotated[
        str | None,
        typer.Option(
            "--health-file",
            metavar="PATH",
            help="Touch this file at start and every lease tick (a liveness probe's file).",
        ),
    ] = None,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs",
            min=1,
            metavar="N",
            help="Exit 0 after claiming N runs, once they finish (with --processes: a fresh child starts).",
        ),
    ] = None,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Development: restart the worker(s) when a .py file under the current directory "
            "changes (pip install 'venturi-redis[reload]').",
        ),
    ] = False,
    max_memory_mib: Annotated[
        int | None,
        typer.Option(
            "--max-memory-mib",
            min=1,
            metavar="MIB",
            help="Exit 0 once resident memory is above MIB, its running jobs finished first.",
        ),
    ] = None,
) -> None:
    """Run a worker until SIGTERM / SIGINT (graceful: running jobs get their grace period)."""
    from .._worker.worker import Worker

    backend_options = _loop_options(loop)
    _metrics_usable(metrics_port)
    if metrics_gauges not in ("all", "elected", "none"):
        die(f"--metrics-gauges {metrics_gauges!r}: use all, elected or none", 2)
    if reload:
        try:
            import watchfiles  # noqa: F401
        except ImportError as exc:
            die(f"--reload needs the watchfiles package ({exc}): pip install 'venturi-redis[reload]'", 2)

    handler = logging.StreamHandler()
    handler.setFormatter(_JsonLogFormatter() if json_out else _TextLogFormatter())
    handler.addFilter(JobLogFilter())  # which job each record belongs to (docs/observability.md, "Logs")
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(log_level.upper())
    # The resolved URL, given or not: a factory calling Client.from_url() then
    # reaches the server every other command here reaches.
    os.environ["REDIS_URL"] = redis_url(redis)
    if processes > 1 or reload:
        from .processes import child_commands, supervise

        options = [f"--log-level={log_level}", f"--metrics-addr={metrics_addr}", f"--loop={loop}"]
        options += [f"--metrics-gauges={metrics_gauges}"]
        options += [f"--queue={q}" for q in queue or []]
        options += [f"--concurrency={concurrency}"] if concurrency is not None else []
        options += ["--no-eviction-check"] if no_eviction_check else []
        options += [f"--startup-wait={startup_wait}"] if startup_wait is not None else []
        options += ["--json"] if json_out else []
        options += ["--log-runs"] if log_runs else []
        # Every child touches the same file: it goes stale only when none is ticking.
        options += [f"--health-file={health_file}"] if health_file is not None else []
        options += [f"--max-runs={max_runs}"] if max_runs is not None else []
        options += [f"--max-memory-mib={max_memory_mib}"] if max_memory_mib is not None else []
        commands = child_commands(target, processes, options=options, metrics_port=metrics_port)
        raise typer.Exit(supervise(commands, reload=[Path.cwd()] if reload else ()))
    from .processes import watch_lifeline

    watch_lifeline()  # a child of --processes: stop when the supervisor is gone

    async def main() -> int:
        obj = _load_target(target)
        w = obj
        if not isinstance(w, Worker):
            if not callable(obj):
                raise Fail(f"{target} is a {type(obj).__name__}, not a vr.Worker or a factory returning one")
            if isinstance(obj, type) and not issubclass(obj, Worker):
                raise Fail(
                    f"{target} is the class {obj.__name__}, not a vr.Worker or a factory returning one"
                )
            try:
                w = obj()
                if inspect.isawaitable(w):
                    w = await w
            except Exception as exc:  # noqa: BLE001 - the user's factory: report it in one line
                first = (str(exc).strip().splitlines() or [""])[0]
                raise Fail(f"calling {target}() failed: {type(exc).__name__}: {first}") from None
            if not isinstance(w, Worker):
                raise Fail(f"{target}() returned a {type(w).__name__}, not a vr.Worker")
        if queue:
            w.only_queues(queue)
        if concurrency is not None:
            w.concurrency = concurrency  # a default batch_size follows it
        if no_eviction_check:
            w.check_eviction_policy = False
        if startup_wait is not None:
            w.startup_wait = startup_wait
        if health_file is not None:
            w.health_file = Path(health_file)
        if max_runs is not None:
            w.max_runs = max_runs
        if max_memory_mib is not None:
            w.max_memory_mib = max_memory_mib
        if log_runs:
            w.log_runs = True
        running = type(asyncio.get_running_loop())
        logging.getLogger("venturi_redis.cli").info(
            "event loop: %s.%s", running.__module__, running.__qualname__
        )
        if metrics_port is None:
            await w.run()
            return 0
        from .._worker.metrics import Gauges, PrometheusMetrics

        metrics = PrometheusMetrics(gauges=cast("Gauges", metrics_gauges))
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

    # What escapes run() is a start that failed: a worker rides out Redis outages once running.
    try:
        with one_line_errors(what=f"worker {target} cannot start", config_status=1):
            code = anyio.run(main, backend_options=backend_options)
    except (KeyboardInterrupt, SystemExit) as exc:
        # A handler raised it: the worker released its other jobs and stopped
        # (docs/guarantees.md). Never status 0, so a supervisor restarts it.
        status = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        where = " ".join(getattr(exc, "__notes__", ()))
        die(
            f"worker {target} stopped: {exc!r} {where}".rstrip(),
            status if isinstance(status, int) and status else 1,
        )
    raise typer.Exit(code)
