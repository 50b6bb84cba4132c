"""A long-running worker's (or producer's) memory: does it stay flat over hundreds of thousands of jobs?

usage (from the repository root)::

    .venv/bin/python benchmarks/memory_soak.py [--jobs 300000] [--tracemalloc] [--every 5]
    .venv/bin/python benchmarks/memory_soak.py --producer [--sync] [--jobs 2000000] [--tracemalloc]

Worker mode (the default): a ``redis-server`` of its own (``tests/servers.py``),
one worker process (``vr.Worker``, concurrency 100, library defaults: events on,
default retention, gc freeze and threshold) and one producer process that
enqueues ``--jobs`` jobs continuously while the worker drains them, a tenth of
them as single enqueues (50 awaited at a time) and the rest by
``enqueue_many`` (450 a call), keeping a backlog of about ``--backlog`` jobs.
The jobs are of the shapes real applications send (``shape_of``): plain
completions returning a result; plain jobs with a start deadline
(``expires``); jobs that fail once and succeed on their retry; jobs that
time out on their first run (``Task.timeout``) and succeed on the retry;
jobs that fail permanently (to dead); jobs with a dedup key (merged into a
pending job of the same key) and with a throttling dedup window, their keys
ever new; jobs that report progress twice, set an attachment and complete
with a note; a synchronous (``def handle``) kind; jobs that pause once.
``--batch`` puts a ``vr.BatchHandler`` kind in the mix (3 jobs in 20).

Every ``--every`` seconds the worker process itself prints a sample: its RSS
(``/proc/self/status`` VmRSS), the asyncio tasks alive, its threads, jobs
finished (completed + dead, from a ``WorkerObserver``), the lengths of every
dict/set/list/deque reachable from the worker's and client's own objects
(venturi_redis classes, three levels down), and, with ``--tracemalloc`` (the
child runs with ``PYTHONTRACEMALLOC=1``), the traced bytes grouped by package
(venturi_redis, redis, asyncio, anyio, pydantic, other). The driver adds
Redis's ``used_memory`` and key count (``DBSIZE``) beside each sample.

When the producer has sent ``--warmup`` (20%) of the jobs, the driver signals
the worker (SIGUSR1) to take its baseline (a tracemalloc snapshot, object
counts by type from ``gc.get_objects``, the container lengths); once the
producer is done and the queue drained, SIGUSR2 makes it print what grew
since: the top allocation sites (``Snapshot.compare_to``, by line, within the
packages above and elsewhere), the object types whose count grew, and the containers that
grew. The summary gives each figure's growth per 100,000 jobs finished
after the baseline (a least-squares slope over the samples after it).

Producer mode (``--producer``): the measured process is one long-lived
``vr.Client`` that enqueues ``--jobs`` jobs, per round 100 single enqueues,
one ``enqueue_many`` of 1,000, and 10 jobs on a second queue that it
``queue.wait``s for and whose result it reads back (``queue.get``). A worker
process (not measured) drains both queues, so that Redis stays bounded.
``--sync`` makes it a ``vr.SyncClient`` driven from one thread (a web
application's producer), the same rounds one call at a time.

tracemalloc slows a process by several times and adds its own memory to
the RSS: read RSS from a run without it, allocation sites from a run with it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import venturi_redis as vr  # noqa: E402

QUEUE = "soak"
WAIT_QUEUE = "soak-wait"
GROUPS = ("venturi_redis", "redis", "asyncio", "anyio", "pydantic")
PREFIX = "SOAK "  # a child's sample line on its stdout


# -- the jobs --------------------------------------------------------------------------------


class Plain(vr.Task):
    KIND: ClassVar[str] = "soak.plain"
    i: int


class PlainJob(Plain, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result={"i": self.i, "ok": True})


class Expiring(vr.Task):
    """A plain job with a start deadline (``Task.expires``): listed in the queue's ``expiring`` index."""

    KIND: ClassVar[str] = "soak.expiring"
    i: int

    def expires(self) -> float:
        return 10.0


class ExpiringJob(Expiring, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


class Flaky(vr.Task):
    """Fails its first run, succeeds on the retry."""

    KIND: ClassVar[str] = "soak.flaky"
    i: int

    def backoff(self) -> vr.Backoff:
        return vr.Backoff.fibonacci(0.05, 0.2)


class FlakyJob(Flaky, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.failures == 0:
            raise vr.TaskError("flaky upstream")
        return vr.Outcome.completed(result=self.i)


class Doomed(vr.Task):
    """Fails permanently: straight to dead."""

    KIND: ClassVar[str] = "soak.doomed"
    i: int


class DoomedJob(Doomed, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        raise vr.TaskError.permanent(f"resource {self.i} gone")


class Deduped(vr.Task):
    """A dedup key shared by two jobs (a new key every 20 jobs): the second merges into the first."""

    KIND: ClassVar[str] = "soak.deduped"
    key: int
    i: int

    def dedup_key(self) -> str | None:
        return f"user:{self.key}"


class DedupedJob(Deduped, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


class Throttled(vr.Task):
    """A dedup key held for a second after its job completes (a throttle; two jobs a key, 20 apart)."""

    KIND: ClassVar[str] = "soak.throttled"
    key: int
    i: int

    def dedup_key(self) -> str | None:
        return f"t:{self.key}"

    @classmethod
    def dedup_window(cls) -> float:
        return 1.0


class ThrottledJob(Throttled, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


class Reporter(vr.Task):
    """Two progress reports (the second held back, written before the ending), an attachment, a note."""

    KIND: ClassVar[str] = "soak.reporter"
    i: int


class ReporterJob(Reporter, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        await ctx.report_progress({"done": 1, "of": 2})
        await ctx.report_progress({"done": 2, "of": 2})
        ctx.set_attachment({"i": self.i, "pages": [1, 2]})
        return vr.Outcome.completed_with(f"reported {self.i}", result=self.i)


class Blocking(vr.Task):
    KIND: ClassVar[str] = "soak.sync"
    i: int


class BlockingJob(Blocking, vr.Handler[None]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result=str(self.i))


class Slow(vr.Task):
    """Times out on its first run (50 ms of a 1 s sleep: cancelled, a failed run), then completes."""

    KIND: ClassVar[str] = "soak.slow"
    i: int

    def timeout(self) -> float:
        return 0.05

    def backoff(self) -> vr.Backoff:
        return vr.Backoff.fibonacci(0.05, 0.2)


class SlowJob(Slow, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.failures == 0:
            await anyio.sleep(1.0)
        return vr.Outcome.completed()


class Pauser(vr.Task):
    """Pauses once (a checkpoint), then completes."""

    KIND: ClassVar[str] = "soak.pauser"
    i: int


class PauserJob(Pauser, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        if ctx.run_count <= 1:
            return vr.Outcome.pause_in(0)
        return vr.Outcome.completed()


class Mail(vr.Task):
    """A job of a batch handler's kind (``--batch``): many per ``handle_batch`` call."""

    KIND: ClassVar[str] = "soak.mail"
    i: int

    def backoff(self) -> vr.Backoff:
        return vr.Backoff.fibonacci(0.05, 0.2)


class MailJob(Mail, vr.BatchHandler[None]):
    BATCH_SIZE: ClassVar[int] = 50
    BATCH_WAIT: ClassVar[float] = 0.02

    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[Mail]], state: None
    ) -> Sequence[vr.Outcome | BaseException] | None:
        # Most complete with a result; one in ten fails its first run and is retried.
        return [
            vr.TaskError("bounced")
            if item.task.i % 10 == 0 and item.ctx.failures == 0
            else vr.Outcome.completed(result=item.task.i)
            for item in items
        ]


HANDLERS: tuple[type[Any], ...] = (
    PlainJob,
    ExpiringJob,
    FlakyJob,
    DoomedJob,
    DedupedJob,
    ThrottledJob,
    ReporterJob,
    BlockingJob,
    PauserJob,
    SlowJob,
)


def shape_of(i: int, batch: bool = False) -> vr.Task:
    """Job ``i``'s shape, out of 20: 7 plain, 1 with a deadline, 2 flaky, 1 doomed, 2 deduped, 1 throttled,
    2 reporters, 2 sync, 1 pauser, 1 slow (times out once). Dedup keys are ever new, as an
    app's order or user ids are: what a key leaves behind in Redis once its jobs are done must go.
    With ``batch``, 3 of the plain are a batch handler's kind instead."""
    r = i % 20
    if batch and r < 3:
        return Mail(i=i)
    if r < 7:
        return Plain(i=i)
    if r == 7:
        return Expiring(i=i)
    if r == 19:
        return Slow(i=i)
    if r < 10:
        return Flaky(i=i)
    if r == 10:
        return Doomed(i=i)
    if r < 13:
        return Deduped(key=i // 20, i=i)
    if r == 13:
        return Throttled(key=i // 40, i=i)
    if r < 16:
        return Reporter(i=i)
    if r < 18:
        return Blocking(i=i)
    return Pauser(i=i)


# -- what a measured process reports about itself ---------------------------------------------


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def group_of(filename: str) -> str:
    for g in GROUPS:
        if f"/{g}/" in filename:
            return g
    return "other"


def traced_by_group(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    out: dict[str, int] = dict.fromkeys((*GROUPS, "other"), 0)
    for stat in snapshot.statistics("filename"):
        out[group_of(stat.traceback[0].filename)] += stat.size
    return out


def containers(roots: dict[str, object], depth: int = 3) -> dict[str, int]:
    """Lengths of the dicts, sets, lists and deques reachable from ``roots`` through the
    attributes of venturi_redis objects, ``depth`` levels down (each object once)."""
    out: dict[str, int] = {}
    seen: set[int] = set()

    def attrs(obj: object) -> list[tuple[str, object]]:
        items: list[tuple[str, object]] = list(getattr(obj, "__dict__", {}).items())
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(obj, slot):
                    items.append((slot, getattr(obj, slot)))
        return items

    def walk(obj: object, path: str, level: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (dict, set, frozenset, list, collections.deque)):
            out[path] = len(obj)
            values = list(obj.values()) if isinstance(obj, dict) else list(obj)
            # A container of venturi objects (the runners): look into its first few.
            for n, v in enumerate(values[:4]):
                if type(v).__module__.startswith("venturi_redis"):
                    walk(v, f"{path}[{n}]", level)
            return
        if level > depth or not type(obj).__module__.startswith("venturi_redis"):
            return
        for name, value in attrs(obj):
            walk(value, f"{path}.{name}", level + 1)

    for name, root in roots.items():
        walk(root, name, 0)
    return out


def type_counts() -> collections.Counter[str]:
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def emit(record: dict[str, Any]) -> None:
    print(PREFIX + json.dumps(record), flush=True)


class SelfReport:
    """Samples of this process (``sample``), and its baseline and growth on SIGUSR1 / SIGUSR2."""

    def __init__(self, roots: dict[str, object]) -> None:
        self.roots = roots
        self.base: tuple[tracemalloc.Snapshot | None, collections.Counter[str], dict[str, int]] | None = None
        self.reported = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.mark)
        loop.add_signal_handler(signal.SIGUSR2, self.report)

    def sample(self, **extra: Any) -> None:
        record: dict[str, Any] = {
            "at": time.time(),
            "rss_kb": rss_kb(),
            "tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(),
            "gc_objects": len(gc.get_objects()),
            **extra,
        }
        if tracemalloc.is_tracing():
            record["traced"] = traced_by_group(tracemalloc.take_snapshot())
            # tracemalloc's own memory (its traces), part of the RSS but not traced.
            record["tracemalloc_kb"] = tracemalloc.get_tracemalloc_memory() // 1024
        record["containers"] = containers(self.roots)
        emit(record)

    def mark(self) -> None:
        snap = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        self.base = (snap, type_counts(), containers(self.roots))
        emit({"marked": True})

    def report(self) -> None:
        if self.base is None:
            self.mark()
        assert self.base is not None
        snap0, types0, sizes0 = self.base
        lines: list[str] = []
        types = type_counts()  # before the snapshots below add tracemalloc's own objects
        if snap0 is not None:
            now = tracemalloc.take_snapshot()
            keep = [tracemalloc.Filter(True, f"*/{g}/*") for g in GROUPS]
            drop = [tracemalloc.Filter(False, f"*/{g}/*") for g in GROUPS]
            for title, filters in (("within " + ", ".join(GROUPS), keep), ("elsewhere", drop)):
                diffs = now.filter_traces(filters).compare_to(snap0.filter_traces(filters), "lineno")
                lines.append(f"top allocation sites grown since the baseline, {title} (bytes, blocks):")
                for stat in sorted((d for d in diffs if d.size_diff > 0), key=lambda d: -d.size_diff)[:15]:
                    frame = stat.traceback[0]
                    where = frame.filename.split("site-packages/")[-1].split(str(ROOT) + "/")[-1]
                    lines.append(f"  {stat.size_diff:+10,} B {stat.count_diff:+8,}  {where}:{frame.lineno}")
        grown = [(k, v - types0.get(k, 0)) for k, v in types.items() if v - types0.get(k, 0) > 100]
        lines.append("object types whose count grew by more than 100 since the baseline:")
        lines += [f"  {d:+9,}  {k}" for k, d in sorted(grown, key=lambda kv: -kv[1])[:25]] or ["  none"]
        sizes = containers(self.roots)
        bigger = [(k, sizes0.get(k, 0), v) for k, v in sizes.items() if v > sizes0.get(k, 0) + 10]
        lines.append("containers longer by more than 10 since the baseline (baseline -> now):")
        lines += [f"  {k}: {a:,} -> {b:,}" for k, a, b in bigger] or ["  none"]
        tasks = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in asyncio.all_tasks())
        lines.append("asyncio tasks alive now, by coroutine:")
        lines += [f"  {n:5}  {name}" for name, n in tasks.most_common()]
        emit({"report": lines})
        self.reported.set()


async def sampler(report: SelfReport, every: float, extra: Any) -> None:
    while True:
        report.sample(**extra())
        await anyio.sleep(every)


# -- the child processes -------------------------------------------------------------------


class Finished:
    """A ``WorkerObserver``: jobs finished (completed, dead) and runs by outcome."""

    def __init__(self) -> None:
        self.outcomes: collections.Counter[str] = collections.Counter()

    def job_claimed(self, queue: str, kind: str) -> None:
        pass

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        self.outcomes[outcome] += 1

    def done(self) -> int:
        return self.outcomes["completed"] + self.outcomes["dead"]


async def worker_main(a: argparse.Namespace) -> None:
    # Each failed run and each dead job logs a WARNING: a fifth of the jobs here.
    logging.getLogger("venturi_redis").setLevel(logging.ERROR)
    finished = Finished()
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as client:
        queues = [client.queue(name) for name in a.queues.split(",")]
        worker = vr.Worker(queues, concurrency=a.concurrency, observer=finished)
        worker.register(*HANDLERS, *((MailJob,) if a.batch else ()))
        report = SelfReport({"worker": worker, "client": client})
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                sampler, report, a.every, lambda: {"done": finished.done(), "outcomes": finished.outcomes}
            )
            await worker.run()
            tg.cancel_scope.cancel()


async def producer_main(a: argparse.Namespace) -> None:
    """The worker mode's producer: ``a.jobs`` jobs, a fifth single (50 at a time), the rest in bulk."""
    async with vr.Client.from_url(os.environ["REDIS_URL"]) as client:
        q = client.queue(QUEUE)
        sent, last = 0, 0.0
        while sent < a.jobs:
            now = time.monotonic()
            if now - last > 1.0:
                emit({"sent": sent})
                last = now
            counts = await q.counts()
            if counts["pending"] + counts["running"] > a.backlog:
                await anyio.sleep(0.05)
                continue
            n = min(50, a.jobs - sent)
            await asyncio.gather(*(q.enqueue(shape_of(i, a.batch)) for i in range(sent, sent + n)))
            sent += n
            n = min(450, a.jobs - sent)
            if n:
                await q.enqueue_many([shape_of(i, a.batch) for i in range(sent, sent + n)])
                sent += n
        emit({"sent": sent, "producer_done": True})


def _check(info: vr.JobInfo | None) -> None:
    assert info is not None
    assert info.result == {"i": info.payload["i"], "ok": True}, info


async def client_rounds(q: vr.Queue, wq: vr.Queue, a: argparse.Namespace, state: dict[str, int]) -> None:
    """Producer mode's rounds on a ``vr.Client``: 100 single enqueues, 1,000 in bulk, 10 waited for."""
    i = 0
    while i < a.jobs:
        counts = await q.counts()
        if counts["pending"] > a.backlog:
            await anyio.sleep(0.05)
            continue
        for _ in range(100):
            await q.enqueue(Plain(i=i))
            i += 1
        await q.enqueue_many([Plain(i=j) for j in range(i, i + 1000)])
        i += 1000
        ids = await asyncio.gather(*(wq.enqueue(Plain(i=j)) for j in range(i, i + 10)))
        i += 10
        infos = await asyncio.gather(*(wq.wait(job_id, timeout=60) for job_id in ids))
        state["waited"] += len(infos)
        for job_id in ids[:3]:
            _check(await wq.get(job_id))
            state["read"] += 1
        state["sent"] = i


def sync_rounds(sc: vr.SyncClient, a: argparse.Namespace, state: dict[str, int]) -> None:
    """The same rounds on a ``vr.SyncClient`` (a web app's producer), from one thread."""
    q, wq = sc.queue(QUEUE), sc.queue(WAIT_QUEUE)
    i = 0
    while i < a.jobs:
        if q.counts()["pending"] > a.backlog:
            time.sleep(0.05)
            continue
        for _ in range(100):
            q.enqueue(Plain(i=i))
            i += 1
        q.enqueue_many([Plain(i=j) for j in range(i, i + 1000)])
        i += 1000
        ids = [wq.enqueue(Plain(i=j)) for j in range(i, i + 10)]
        i += 10
        for job_id in ids:
            wq.wait(job_id, timeout=60)
            state["waited"] += 1
        for job_id in ids[:3]:
            _check(wq.get(job_id))
            state["read"] += 1
        state["sent"] = i


async def client_main(a: argparse.Namespace) -> None:
    """Producer mode's measured process: one long-lived Client (or SyncClient, with ``--sync``)."""
    state = {"sent": 0, "waited": 0, "read": 0}
    async with anyio.create_task_group() as tg:
        if a.sync:
            with vr.SyncClient(os.environ["REDIS_URL"]) as sc:
                report = SelfReport({"sync_client": sc, "client": sc.client})

                async def count_tasks() -> int:
                    return len(asyncio.all_tasks())

                def extra() -> dict[str, int]:
                    # The loop thread's tasks, not this (sampling) loop's.
                    return {**state, "loop_tasks": sc._ensure()[0].call(count_tasks)}

                tg.start_soon(sampler, report, a.every, extra)
                await anyio.to_thread.run_sync(sync_rounds, sc, a, state)
                emit({"sent": state["sent"], "producer_done": True})
                await report.reported.wait()
        else:
            async with vr.Client.from_url(os.environ["REDIS_URL"]) as client:
                q, wq = client.queue(QUEUE), client.queue(WAIT_QUEUE)
                report = SelfReport({"client": client, "queue": q, "wait_queue": wq})
                tg.start_soon(sampler, report, a.every, lambda: dict(state))
                await client_rounds(q, wq, a, state)
                emit({"sent": state["sent"], "producer_done": True})
                await report.reported.wait()
        tg.cancel_scope.cancel()


# -- the driver --------------------------------------------------------------------------------


class Child:
    """A child process whose ``SOAK`` lines are collected by a thread."""

    def __init__(self, role: str, args: list[str], env: dict[str, str]) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, *args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        self.samples: list[dict[str, Any]] = []
        self.latest: dict[str, Any] = {}
        self.report: list[str] | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith(PREFIX):
                sys.stdout.write(line)
                continue
            record = json.loads(line[len(PREFIX) :])
            if "report" in record:
                self.report = record["report"]
            elif "rss_kb" in record:
                self.samples.append(record)
            self.latest.update(record)

    def last(self, field: str, default: Any = 0) -> Any:
        """The newest value of ``field`` in any of the child's records."""
        return self.latest.get(field, default)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


Row = tuple[float, int, int, int, float, int, int, int, int]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (0 with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def keys_by_shape(r: Any) -> collections.Counter[str]:
    """Every key, its id-like parts (ULIDs, numbers) as ``*``."""
    out: collections.Counter[str] = collections.Counter()
    for key in r.scan_iter(count=1000):
        parts = key.decode(errors="replace").split(":")
        out[":".join("*" if len(p) >= 16 or p.isdigit() else p for p in parts)] += 1
    return out


def queue_keys(r: Any) -> list[str]:
    """The queues' own keys (not a job's hash or journal) with their type and length."""
    out = []
    for key in sorted(r.scan_iter(match="venturi:{soak*", count=1000)):
        name = key.decode()
        if ":job:" in name or ":journal:" in name:
            continue
        kind = r.type(key).decode()
        size = {"hash": r.hlen, "zset": r.zcard, "set": r.scard, "list": r.llen, "stream": r.xlen}.get(kind)
        out.append(f"  {name} ({kind}{f', {size(key):,}' if size else ''})")
    return out


def redis_figures(r: Any) -> tuple[int, int, int, int]:
    """Redis's used_memory, its key count, and the queue's throttled keys held and deadlines listed."""
    pipe = r.pipeline(transaction=False)
    pipe.info("memory")
    pipe.dbsize()
    pipe.zcard(f"venturi:{{{QUEUE}}}:dedup:held")
    pipe.zcard(f"venturi:{{{QUEUE}}}:expiring")
    memory, keys, held, deadlines = pipe.execute()
    return int(memory["used_memory"]), int(keys), int(held), int(deadlines)


def drive(a: argparse.Namespace) -> None:
    import redis

    from tests.servers import RedisServer

    measured_role = "client" if a.producer else "worker"
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(ROOT)}
        measured_env = {**env, "PYTHONTRACEMALLOC": "1"} if a.tracemalloc else env
        common = ["--jobs", str(a.jobs), "--every", str(a.every), "--backlog", str(a.backlog)]
        common += ["--batch"] if a.batch else []
        if a.producer:
            # The worker only keeps Redis bounded; the client is measured.
            helper = Child("worker", [*common, "--queues", f"{QUEUE},{WAIT_QUEUE}"], env)
            measured = Child("client", [*common, *(["--sync"] if a.sync else [])], measured_env)
            sender = measured
        else:
            measured = Child("worker", [*common, "--concurrency", str(a.concurrency)], measured_env)
            time.sleep(1.0)  # the worker registered before jobs arrive (not needed, but tidier)
            helper = Child("producer", common, env)
            sender = helper
        done_field = "sent" if a.producer else "done"
        mode = "tracemalloc on" if a.tracemalloc else "tracemalloc off"
        mode += ", batch kind" if a.batch else ""
        mode += ", SyncClient" if a.sync and a.producer else ""
        print(f"{measured_role} measured, {a.jobs:,} jobs, {mode}, redis {server.url}")
        heads = "   t s    jobs   RSS MB  tasks thr  gc objects  traced MB  used_memory MB     keys"
        heads += "   held  expiring"
        print(heads, flush=True)
        # t, jobs, RSS, tasks, traced, used_memory, keys, throttled keys held, deadlines listed
        rows: list[Row] = []
        marked_at: int | None = None
        start = time.time()

        def show_new() -> None:
            while len(rows) < len(measured.samples):
                s = measured.samples[len(rows)]
                mem, keys, held, deadlines = redis_figures(r)
                traced = sum(s.get("traced", {}).values()) / 1e6
                row = (s["at"] - start, int(s.get(done_field, 0)), s["rss_kb"], s["tasks"])
                rows.append((*row, traced, mem, keys, held, deadlines))
                mark = "*" if marked_at is not None and len(rows) == marked_at + 1 else " "
                print(
                    f"{row[0]:6.0f}{mark}{row[1]:9,} {s['rss_kb'] / 1024:7.1f} {s['tasks']:6} "
                    f"{s['threads']:3} {s['gc_objects']:11,} {traced:10.1f} {mem / 1e6:15.1f} {keys:8,} "
                    f"{held:6,} {deadlines:9,}",
                    flush=True,
                )

        try:
            with vr.SyncClient(server.url) as sync:
                while True:
                    time.sleep(0.5)
                    if measured.proc.poll() is not None or (a.producer and helper.proc.poll() is not None):
                        raise SystemExit("a child process ended early")
                    # After its first sample: its handler of SIGUSR1 is in place by then.
                    warm = sender.last("sent") >= a.warmup * a.jobs
                    if marked_at is None and measured.samples and warm:
                        measured.signal(signal.SIGUSR1)
                        marked_at = len(measured.samples)
                    show_new()
                    if sender.last("producer_done", False) and sync.queue(QUEUE).is_drained():
                        break
            time.sleep(2 * a.every + 1)  # two more samples, drained
            show_new()
            keys, own = keys_by_shape(r), queue_keys(r)
            measured.signal(signal.SIGUSR2)
            deadline = time.monotonic() + 120
            while measured.report is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            measured.stop()
            helper.stop()
        summarize(a, measured, rows, marked_at, done_field)
        print("Redis keys at the end, by shape (ids as *):")
        for shape, n in keys.most_common(20):
            print(f"  {n:8,}  {shape}")
        print("the queues' own keys at the end (type, length):")
        print("\n".join(own))


def summarize(
    a: argparse.Namespace,
    measured: Child,
    rows: list[Row],
    marked_at: int | None,
    done_field: str,
) -> None:
    if not rows:
        return
    base = marked_at if marked_at is not None and marked_at < len(rows) else len(rows) // 5
    after = rows[base:]
    first, last = after[0], after[-1]
    per = 100_000
    xs = [float(row[1]) for row in after]
    what = "jobs sent" if a.producer else "jobs finished (completed + dead)"
    print(f"\nafter the baseline ({what} {first[1]:,} -> {last[1]:,}, {len(after)} samples):")
    print(
        f"  RSS {first[2] / 1024:.1f} -> {last[2] / 1024:.1f} MB (max {max(r[2] for r in rows) / 1024:.1f}); "
        f"slope {slope(xs, [row[2] / 1024 for row in after]) * per:+.2f} MB per 100k jobs"
    )
    if a.tracemalloc:
        print(
            f"  traced {first[4]:.1f} -> {last[4]:.1f} MB; "
            f"slope {slope(xs, [row[4] for row in after]) * per:+.3f} MB per 100k jobs"
        )
        own = [s["tracemalloc_kb"] / 1024 for s in measured.samples[base:] if "tracemalloc_kb" in s]
        if own:
            print(f"  tracemalloc's own memory {own[0]:.1f} -> {own[-1]:.1f} MB (in the RSS, not traced)")
        groups: dict[str, list[float]] = collections.defaultdict(list)
        for s in measured.samples[base:]:
            for g, v in s.get("traced", {}).items():
                groups[g].append(v / 1e6)
        xs_all = [float(s.get(done_field, 0)) for s in measured.samples[base:]]
        for g, vs in groups.items():
            if len(vs) == len(xs_all):
                grew = slope(xs_all, vs) * per
                print(f"    {g:14} {vs[0]:7.2f} -> {vs[-1]:7.2f} MB, {grew:+.3f} MB per 100k")
    print(f"  asyncio tasks {first[3]} -> {last[3]} (max {max(r[3] for r in after)})")
    print(
        f"  Redis used_memory {rows[0][5] / 1e6:.1f} (first sample) -> {first[5] / 1e6:.1f} (baseline) "
        f"-> {last[5] / 1e6:.1f} MB (end, drained); keys {rows[0][6]:,} -> {first[6]:,} -> {last[6]:,}"
    )
    print(f"  Redis used_memory at most {max(r[5] for r in after) / 1e6:.1f} MB after the baseline")
    print(
        f"  throttled keys held {first[7]:,} (baseline) -> {last[7]:,} (end); "
        f"deadlines listed {first[8]:,} -> {last[8]:,}"
    )
    if measured.last("loop_tasks", None) is not None:  # --sync: the SyncClient's loop thread
        tasks = [s["loop_tasks"] for s in measured.samples[base:] if "loop_tasks" in s]
        print(f"  the SyncClient loop thread's asyncio tasks {tasks[0]} -> {tasks[-1]} (max {max(tasks)})")
    outcomes = measured.last("outcomes", None)
    if outcomes:
        print("  runs by outcome: " + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items())))
    if measured.report:
        print()
        print("\n".join(measured.report))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None, help="default 300,000 (2,000,000 with --producer)")
    ap.add_argument("--producer", action="store_true", help="measure a long-lived producer instead")
    ap.add_argument("--batch", action="store_true", help="worker mode: a batch handler's kind in the mix")
    ap.add_argument("--sync", action="store_true", help="with --producer: a vr.SyncClient, from one thread")
    ap.add_argument("--tracemalloc", action="store_true", help="trace the measured process's allocations")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the jobs sent before the baseline")
    ap.add_argument("--backlog", type=int, default=5_000, help="jobs the producer keeps ahead of the worker")
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--role", choices=("worker", "producer", "client"), help=argparse.SUPPRESS)
    ap.add_argument("--queues", default=QUEUE, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.jobs is None:
        a.jobs = 2_000_000 if a.producer else 300_000
    if a.role == "worker":
        anyio.run(worker_main, a)
    elif a.role == "producer":
        anyio.run(producer_main, a)
    elif a.role == "client":
        anyio.run(client_main, a)
    else:
        drive(a)


if __name__ == "__main__":
    main()
