"""Logs that say which job: ``vr.JobLogFilter``, ``venturi worker``'s formats, ``log_runs``.

Every record logged while a run executes (an async handler, a sync one in its
thread, a batch handler's call; the handler's own logger or a library's)
carries the job's ``venturi_*`` fields once ``vr.JobLogFilter`` sees it; one
logged outside a run carries them as None. ``Worker(log_runs=True)`` logs one
INFO line per finished run, its ending as written. All on a real redis-server;
nothing here asserts how long anything took.
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.test_cli import start_worker, stop_when
from tests.test_docs_runnable import BLOCKS, run_block

pytestmark = pytest.mark.anyio

FIELDS = ("venturi_job_id", "venturi_kind", "venturi_queue", "venturi_run", "venturi_batch")


@pytest.fixture
def backend() -> str:
    return "redis"


class Collect(logging.Handler):
    """The records that reach it, through a JobLogFilter, as an application's handler would."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.addFilter(vr.JobLogFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def named(self, name: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.name == name]


@pytest.fixture
def logs() -> Iterator[Collect]:
    handler = Collect()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def fields(record: logging.LogRecord) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in FIELDS)


def library_call(what: str) -> None:
    """A library's own logger, as httpx's or botocore's: it knows nothing of jobs."""
    logging.getLogger("thirdparty.http").debug("GET %s", what)


# -- the handlers --------------------------------------------------------------------------------


class Say(vr.Task):
    KIND: ClassVar[str] = "logs-say"
    text: str
    fail_first: bool = False


class SayJob(Say, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        log = logging.getLogger("app.say")
        log.info("start %s", ctx.job_id)
        library_call(self.text)
        await anyio.sleep(0.01)  # another job's handler runs meanwhile (concurrency)

        async def child() -> None:  # a task the handler starts runs in a copy of its context
            log.info("child %s", ctx.job_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
        log.info("end %s", ctx.job_id)
        if self.fail_first and ctx.run_count == 1:
            raise RuntimeError("first run fails")
        return vr.Outcome.completed()


class SaySync(vr.Task):
    KIND: ClassVar[str] = "logs-say-sync"
    text: str


class SaySyncJob(SaySync, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        logging.getLogger("app.sync").info("in %s on %s", ctx.job_id, threading.current_thread().name)
        library_call(self.text)
        return vr.Outcome.completed()


class Mail(vr.Task):
    KIND: ClassVar[str] = "logs-mail"
    to: str


class MailBatch(Mail, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 3
    BATCH_WAIT: ClassVar[float] = 0.5

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Mail]], state: Any) -> None:
        logging.getLogger("app.mail").info("sending %d", len(items))
        library_call(items[0].task.to)


class MailSync(vr.Task):
    KIND: ClassVar[str] = "logs-mail-sync"
    to: str


class MailSyncBatch(MailSync, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 2
    BATCH_WAIT: ClassVar[float] = 0.5

    @classmethod
    def handle_batch(cls, items: Sequence[vr.BatchItem[MailSync]], state: Any) -> None:
        logging.getLogger("app.mail").info("sending %d in a thread", len(items))


# -- every record logged during a run carries its job -------------------------------------------


async def test_an_async_handlers_records_carry_its_job_and_run(queue: vr.Queue, logs: Collect) -> None:
    a = await queue.enqueue(Say(text="a"))
    b = await queue.enqueue(Say(text="b", fail_first=True))
    await _drain(queue, SayJob, concurrency=2)
    mine = logs.named("app.say")
    # Each record says the job its message names, though both ran at once.
    assert len(mine) == 3 * 3  # a once, b twice (it failed its first run)
    for r in mine:
        assert fields(r)[:3] + fields(r)[4:] == (r.getMessage().split()[1], "logs-say", queue.name, None)
    assert {fields(r)[3] for r in mine if fields(r)[0] == a} == {1}
    assert sorted({fields(r)[3] for r in mine if fields(r)[0] == b}) == [1, 2]
    lib = logs.named("thirdparty.http")
    assert sorted((r.getMessage(), fields(r)[0]) for r in lib) == [("GET a", a), ("GET b", b), ("GET b", b)]
    # The worker's failed-run WARNING carries the job too.
    (failed,) = [r for r in logs.named("venturi_redis.worker") if "failed" in r.getMessage()]
    assert failed.levelno == logging.WARNING
    assert fields(failed) == (b, "logs-say", queue.name, 1, None)


async def test_a_sync_handlers_records_carry_its_job_from_its_thread(queue: vr.Queue, logs: Collect) -> None:
    ids = [await queue.enqueue(SaySync(text=str(i))) for i in range(3)]
    await _drain(queue, SaySyncJob, concurrency=3)
    mine = logs.named("app.sync")
    assert sorted(fields(r)[0] for r in mine) == sorted(ids)
    for r in mine:
        assert r.threadName != threading.main_thread().name  # logged from the handler's thread
        assert fields(r) == (r.getMessage().split()[1], "logs-say-sync", queue.name, 1, None)
    assert sorted((r.getMessage(), fields(r)[0]) for r in logs.named("thirdparty.http")) == sorted(
        (f"GET {i}", job_id) for i, job_id in enumerate(ids)
    )


class Stuck(vr.Task):
    KIND: ClassVar[str] = "logs-stuck"


class StuckJob(Stuck, vr.Handler[Any]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        state["go"].wait(20)  # past its run's timeout: its thread is abandoned, and logs later
        logging.getLogger("app.stuck").info("late %s", ctx.job_id)
        return vr.Outcome.completed()


async def test_an_abandoned_threads_late_records_still_carry_its_own_job(
    queue: vr.Queue, logs: Collect
) -> None:
    stuck = await queue.enqueue(Stuck())
    state = {"go": threading.Event()}
    w = make_worker(queue, StuckJob, SayJob, state=state, timeout=0.2, max_failures=1, concurrency=1)
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(w.run)
                while (await queue.get(stuck)).state != "dead":
                    await anyio.sleep(0.02)
                # The slot goes on to another job while the abandoned thread still runs.
                nxt = await queue.enqueue(Say(text="next"))
                while (await queue.get(nxt)).state != "completed":
                    await anyio.sleep(0.02)
                state["go"].set()
                while not logs.named("app.stuck"):
                    await anyio.sleep(0.02)
                w.shutdown()
    finally:
        state["go"].set()
    (late,) = logs.named("app.stuck")
    assert fields(late) == (stuck, "logs-stuck", queue.name, 1, None)


async def test_a_batch_handlers_records_carry_the_batch(queue: vr.Queue, logs: Collect) -> None:
    ids = await queue.enqueue_many([Mail(to=f"m{i}") for i in range(3)])
    sync_ids = await queue.enqueue_many([MailSync(to=f"s{i}") for i in range(2)])
    await _drain(queue, MailBatch, MailSyncBatch)
    by_message = {r.getMessage(): r for r in logs.named("app.mail")}
    # A batch's call runs several jobs: no one job id; the batch's first job and size.
    assert fields(by_message["sending 3"]) == (None, "logs-mail", queue.name, None, f"{ids[0]} of 3")
    threaded = by_message["sending 2 in a thread"]
    assert threaded.threadName != threading.main_thread().name
    assert fields(threaded) == (None, "logs-mail-sync", queue.name, None, f"{sync_ids[0]} of 2")
    (lib,) = logs.named("thirdparty.http")
    assert fields(lib) == (None, "logs-mail", queue.name, None, f"{ids[0]} of 3")


def test_the_filter_outside_a_run_sets_every_field_to_none() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(vr.JobLogFilter())
    handler.setFormatter(
        logging.Formatter("%(message)s [%(venturi_kind)s %(venturi_job_id)s %(venturi_run)s]")
    )
    log = logging.getLogger(f"app.outside.{uuid.uuid4().hex}")
    log.addHandler(handler)
    log.propagate = False
    log.warning("no job here")
    assert out.getvalue() == "no job here [None None None]\n"
    handler.setFormatter(logging.Formatter("%(message)s%(venturi_job)s"))
    log.warning("still none")
    assert out.getvalue().splitlines()[-1] == "still none"
    # A record already about one job (the worker's own lines, extra=) keeps its fields.
    log.warning("about one", extra={"venturi_job_id": "J1", "venturi_kind": "k", "venturi_run": 3})
    assert out.getvalue().splitlines()[-1] == "about one [k J1 run 3]"


def test_importing_the_package_changes_no_logging() -> None:
    import subprocess
    import sys

    code = (
        "import logging; before = logging.getLogRecordFactory(); import venturi_redis as vr; "
        "vr.JobLogFilter; import venturi_redis._worker.worker; "
        "r = logging.getLogger('x').makeRecord('x', 20, 'f', 1, 'm', (), None); "
        "print(logging.getLogRecordFactory() is before, hasattr(r, 'venturi_job_id'), logging.root.handlers)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "[]"]


# -- the Django LOGGING form ---------------------------------------------------------------------

STREAM = io.StringIO()

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"venturi_job": {"()": "venturi_redis.JobLogFilter"}},
    "formatters": {
        "with_job": {
            "format": "%(levelname)s %(name)s %(message)s [job %(venturi_job_id)s run %(venturi_run)s]"
        }
    },
    "handlers": {
        "out": {
            "class": "logging.StreamHandler",
            "stream": "ext://tests.test_logs.STREAM",
            "filters": ["venturi_job"],
            "formatter": "with_job",
        }
    },
    "loggers": {"djapp": {"handlers": ["out"], "level": "INFO", "propagate": False}},
}


class Dj(vr.Task):
    KIND: ClassVar[str] = "logs-dj"


class DjJob(Dj, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        logging.getLogger("djapp.views").info("in the handler")
        return vr.Outcome.completed()


async def test_the_django_logging_dict_names_the_filter_by_its_dotted_path(queue: vr.Queue) -> None:
    STREAM.seek(0)
    STREAM.truncate()
    logging.config.dictConfig(LOGGING)
    try:
        job_id = await queue.enqueue(Dj())
        logging.getLogger("djapp").info("outside")
        await _drain(queue, DjJob)
        assert STREAM.getvalue().splitlines() == [
            "INFO djapp outside [job None run None]",
            f"INFO djapp.views in the handler [job {job_id} run 1]",
        ]
    finally:
        djapp = logging.getLogger("djapp")
        for handler in list(djapp.handlers):
            djapp.removeHandler(handler)
        djapp.propagate = True


def test_the_documented_django_example_logs_its_job(tmp_path: Path, redis_server: RedisServer) -> None:
    """docs/observability.md's LOGGING example (also run by test_docs_runnable): its lines name the job."""
    (body,) = [body for name, body in BLOCKS if "venturi_redis.JobLogFilter" in body]
    res = run_block(tmp_path, body, redis_server.url)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    lines = res.stderr.splitlines()
    assert f"INFO reports: building 2026-11 [report {job_id} run 1]" in lines
    ran = f"INFO venturi_redis.worker: job {job_id} (report) on queue reports run 1: completed in "
    assert [line for line in lines if line.startswith(ran) and line.endswith(f" ms [report {job_id} run 1]")]
    assert any(
        line.startswith("INFO venturi_redis.worker: worker ") and line.endswith("stopped") for line in lines
    )


# -- log_runs: one line per finished run ---------------------------------------------------------


class End(vr.Task):
    KIND: ClassVar[str] = "logs-end"
    how: str


class EndJob(End, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.how == "fail":
            raise RuntimeError("boom")
        if self.how == "permanent":
            raise vr.TaskError.permanent("never")
        if self.how == "pause" and ctx.run_count == 1:
            return vr.Outcome.pause_in_with(0.05, "later")
        if self.how == "suspend":
            return vr.Outcome.suspend(note="waiting for a person")
        if self.how == "cancel":
            state["running"].set()
            with anyio.fail_after(20):
                await ctx.cancelled()
            raise RuntimeError("stopped")
        if self.how == "release":
            state["running"].set()
            await anyio.sleep(30)
        return vr.Outcome.completed()


_RUN_LINE = re.compile(r"^job (\S+) \(logs-end\) on queue (\S+) run (\d+): (.*) in (\d+\.\d) ms$")


def run_lines(logs: Collect) -> dict[tuple[str, int], str]:
    """Each --log-runs line's ending, by (job, run); each line carries its job's fields."""
    out: dict[tuple[str, int], str] = {}
    for r in logs.named("venturi_redis.worker"):
        m = _RUN_LINE.match(r.getMessage())
        if m is None:
            continue
        assert r.levelno == logging.INFO
        job_id, run = m[1], int(m[3])
        assert fields(r) == (job_id, "logs-end", m[2], run, None)
        out[job_id, run] = m[4]
    return out


async def test_log_runs_logs_one_line_per_finished_run_with_its_ending(
    queue: vr.Queue, logs: Collect
) -> None:
    ids = {how: await queue.enqueue(End(how=how)) for how in ("ok", "fail", "permanent", "pause", "suspend")}
    backoff = vr.Backoff.fibonacci(base=0.05, cap=0.07)
    await _drain(queue, EndJob, log_runs=True, max_failures=4, backoff=backoff)
    lines = run_lines(logs)
    assert lines[ids["ok"], 1] == "completed"
    # Each retry's delay is the one the retry script stored (backoff.delay_ms, one definition),
    # jitter and all: 0, 0, then 50 ms less its jitter (Fibonacci from the third failure).
    delays = {
        e.run: int(e.details["delay_ms"])
        for e in await queue.journal(ids["fail"])
        if e.event == "failed" and "delay_ms" in e.details
    }
    assert delays[3] > 0
    for run in (1, 2, 3):
        retry = f"retry in {delays[run] / 1000:g} s (failure {run})"
        assert lines[ids["fail"], run] == f"failed, {retry}: RuntimeError: boom"
    assert lines[ids["fail"], 4] == "dead (max_failures): RuntimeError: boom"
    assert lines[ids["permanent"], 1] == "dead (permanent): venturi_redis.TaskError: never"
    assert lines[ids["pause"], 1] == "paused for 0.05 s: later"
    assert lines[ids["pause"], 2] == "completed"
    assert lines[ids["suspend"], 1] == "suspended: waiting for a person"
    assert len(lines) == 9
    # The death WARNINGs the worker logs anyway carry their job too.
    dead = [r for r in logs.named("venturi_redis.worker") if " is dead (" in r.getMessage()]
    assert sorted(fields(r) for r in dead) == sorted(
        (ids[how], "logs-end", queue.name, run, None) for how, run in (("fail", 4), ("permanent", 1))
    )


async def test_log_runs_logs_cancelled_and_released_runs(queue: vr.Queue, logs: Collect) -> None:
    cancel = await queue.enqueue(End(how="cancel"))
    state = {"running": anyio.Event()}
    w = make_worker(queue, EndJob, log_runs=True, state=state, lease=0.3)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            await state["running"].wait()
            assert await queue.cancel(cancel) == "requested"
            while (await queue.get(cancel)).state != "cancelled":
                await anyio.sleep(0.02)
            state["running"] = anyio.Event()
            release = await queue.enqueue(End(how="release"))
            await state["running"].wait()
            w.shutdown(grace=0)
    lines = run_lines(logs)
    assert lines[cancel, 1].startswith("cancelled: cancelled by an operator")
    assert lines[release, 1] == "released: released on worker shutdown"
    assert len(lines) == 2


async def test_without_log_runs_nothing_is_logged_per_run(queue: vr.Queue, logs: Collect) -> None:
    await queue.enqueue_many([End(how="ok") for _ in range(3)])
    await _drain(queue, EndJob)
    assert run_lines(logs) == {}


async def test_log_runs_is_a_flag(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="log_runs must be True or False"):
        vr.Worker(queue, log_runs="yes")  # type: ignore[arg-type]


# -- venturi worker's text and --json lines ------------------------------------------------------

APP = """
import logging
from typing import Any, ClassVar

import venturi_redis as vr


class Hello(vr.Task):
    KIND: ClassVar[str] = "hello"
    name: str


class HelloJob(Hello, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        logging.getLogger("logsapp").warning("hello %s", self.name)
        return vr.Outcome.completed()


client = vr.Client.from_url()
worker = vr.Worker(client.queue("{q}"), poll_interval=0.2).register(HelloJob)
"""


@pytest.fixture
def logs_app(tmp_path: Path, queue_name: str) -> Path:
    (tmp_path / "logsapp.py").write_text(APP.replace("{q}", queue_name))
    return tmp_path


def test_venturi_worker_text_lines_end_with_the_job(
    logs_app: Path, redis_server: RedisServer, queue_name: str
) -> None:
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(queue_name)
        job_id = q.enqueue(Hello(name="world"))
        proc = start_worker(logs_app, "logsapp:worker", "--redis", redis_server.url, "--log-runs")
        err = stop_when(proc, lambda: q.counts()["completed"] >= 1)
    assert proc.returncode == 0, err
    (hello,) = [line for line in err.splitlines() if "logsapp: hello world" in line]
    assert hello.endswith(f"logsapp: hello world [hello {job_id} run 1]")
    (ran,) = [line for line in err.splitlines() if f"job {job_id} (hello) on queue" in line]
    assert re.search(
        rf"INFO venturi_redis\.worker: .*run 1: completed in \S+ ms \[hello {job_id} run 1\]$", ran
    )
    started = [line for line in err.splitlines() if "venturi_redis.cli: event loop" in line]
    assert started and not started[0].endswith("]")  # no job: nothing appended


def test_venturi_worker_json_lines_carry_the_job(
    logs_app: Path, redis_server: RedisServer, queue_name: str
) -> None:
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(queue_name)
        job_id = q.enqueue(Hello(name="json"))
        proc = start_worker(logs_app, "logsapp:worker", "--redis", redis_server.url, "--json", "--log-runs")
        err = stop_when(proc, lambda: q.counts()["completed"] >= 1)
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    (hello,) = [d for d in docs if d["message"] == "hello json"]
    assert {k: hello[k] for k in ("logger", "job_id", "kind", "queue", "run")} == {
        "logger": "logsapp",
        "job_id": job_id,
        "kind": "hello",
        "queue": queue_name,
        "run": 1,
    }
    (ran,) = [d for d in docs if d["message"].startswith(f"job {job_id} (hello)")]
    assert (ran["level"], ran["job_id"], ran["run"]) == ("info", job_id, 1)
    outside = [d for d in docs if d["logger"] == "venturi_redis.cli"]
    assert outside and all("job_id" not in d and "kind" not in d for d in outside)  # absent outside a run


class Hello(vr.Task):
    """The subprocess app's task, enqueued from here (its KIND and fields are what matter)."""

    KIND: ClassVar[str] = "hello"
    name: str


async def _drain(queue: vr.Queue, *handlers: type[Any], **options: Any) -> vr.Worker[Any]:
    worker = make_worker(queue, *handlers, **options)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    return worker
