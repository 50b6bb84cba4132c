"""Feature soak: does anything grow with the jobs run, whatever features they used?

scripts/memory_soak.py covers the core (complete, pause, dead, attachments).
This one mixes every feature that writes keys of its own, in rounds, through
one worker in this process, on a redis-server of its own (or --redis URL)
with short retention:

- many KINDs (``--kinds``, registered) and some no worker has (they die
  ``unknown_kind``), every job its own dedup key, order key or limit key;
- failures and retries, pauses, permanent deaths, and an operator's
  ``retry_dead`` of each round's dead jobs; progress reports;
- throttled and debounced dedup keys, per-key limits with a rate, ordered
  keys, workflows (``enqueue_flow``, ``after=``), offloads with results;
- ``update`` and ``cancel`` of pending jobs, a pause and resume of the queue;
- an interval and a cron schedule, the event stream, the metrics history,
  Prometheus metrics (the worker's observer);
- each round, a worker process started on the queue and SIGKILLed mid-run
  (``--kill``): its running jobs come back by the reclaim, its record expires;
- a sharded queue and one queue per tenant, each round new tenants.

After each round drained and retention passed, it reads Redis
(``used_memory``, the number of keys) and the worker process (RSS, and the
size of ``tracemalloc``'s traced memory). With ``--trace``, it prints
tracemalloc's largest growths (by line) between the end of round 2 and the
end of the run. Nothing here should creep from round to round.

    .venv/bin/python scripts/feature_soak.py                     # 40 rounds x 5000 jobs
    .venv/bin/python scripts/feature_soak.py --rounds 4 --jobs 1000 --trace
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import types
from pathlib import Path
from typing import Any, ClassVar

import anyio
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memory_soak import start_redis, used_memory  # the script's sibling

import venturi_redis as vr

QUEUE = "fsoak"
KILL_QUEUE = "fsoak-kill"  # the killed worker's: it has only fsoak.slow
SHORT = vr.Retention(completed=1.0, dead=1.0, cancelled=1.0, batch=500)
TENANT = vr.Retention(completed=0, dead=0, cancelled=0)  # nothing kept once the reclaim sweeps


class Carry(vr.Task):
    pass


class Mixed(vr.Task):
    """One job of the mix: what it does is `n % 100`."""

    KIND: ClassVar[str] = "fsoak.k0"
    n: int
    key: str | None = None
    okey: str | None = None
    lkey: str | None = None
    blob: str = ""

    def dedup_key(self) -> str | None:
        return self.key

    def order_key(self) -> str | None:
        return self.okey

    def limit_key(self) -> str | None:
        return self.lkey

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.001, cap=0.002)


async def mixed_handle(self: Mixed, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
    m = self.n % 100
    ctx.set_attachment({"n": self.n})
    if m < 5:
        await ctx.report_progress({"n": self.n})
    if m in (10, 11):
        raise vr.TaskError.permanent(f"job {self.n} is doomed")
    if m in (20, 21, 22) and ctx.run_count == 1:
        raise RuntimeError(f"job {self.n} failed once")
    if m in (30, 31) and ctx.run_count == 1:
        return vr.Outcome.pause_in_with(0, "once more")
    return vr.Outcome.completed_with("ok", result={"n": self.n})


def kinds(count: int) -> tuple[list[type[Mixed]], list[type[Any]]]:
    """`count` task classes (KINDs fsoak.k0...) and their handlers."""
    tasks: list[type[Mixed]] = [Mixed]
    for i in range(1, count):
        tasks.append(type(f"Mixed{i}", (Mixed,), {"KIND": f"fsoak.k{i}", "__module__": __name__}))
    handlers = [
        types.new_class(
            f"{t.__name__}Job",
            (t, vr.Handler[Any]),
            exec_body=lambda ns: ns.update(handle=mixed_handle, __module__=__name__),
        )
        for t in tasks
    ]
    return tasks, handlers


class Stranger(vr.Task):
    """A KIND no worker has: it goes dead (unknown_kind)."""

    KIND: ClassVar[str] = "fsoak.stranger"
    n: int


class Throttled(vr.Task):
    KIND: ClassVar[str] = "fsoak.throttled"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    @classmethod
    def dedup_window(cls) -> float:
        return 0.5


class ThrottledJob(Throttled, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Debounced(vr.Task):
    KIND: ClassVar[str] = "fsoak.debounced"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    @classmethod
    def debounce(cls) -> float:
        return 0.05


class DebouncedJob(Debounced, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class Step(vr.Task):
    KIND: ClassVar[str] = "fsoak.step"
    name: str


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.name.startswith("fail"):
            raise vr.TaskError.permanent("child failed")
        if self.name.startswith("parent"):
            await ctx.dependency_results()
        return vr.Outcome.completed_with("ok", result={"name": self.name})


class Slow(vr.Task):
    """Runs long enough for the killed worker process to hold it."""

    KIND: ClassVar[str] = "fsoak.slow"
    n: int


class SlowJob(Slow, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(0.5)
        return vr.Outcome.completed()


async def double(x: int) -> int:
    return 2 * x


def key_groups(url: str) -> dict[str, int]:
    """The script's own server's keys, counted by shape (ids, tokens and numbers as <x>)."""
    r = redis.Redis.from_url(url)
    try:
        groups: dict[str, int] = {}
        for raw in r.scan_iter(count=1000):
            shape = re.sub(r"fsoak-t\d+-\d+", "fsoak-t<n>", raw.decode())
            shape = re.sub(r":[0-9A-Za-z_-]{20,}(:|$)", r":<x>\1", shape)
            shape = re.sub(r":\d+$", ":<n>", shape)
            groups[shape] = groups.get(shape, 0) + 1
        return groups
    finally:
        r.close()


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


CHILDREN: list[subprocess.Popen[bytes]] = []


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def killed_worker(url: str) -> subprocess.Popen[bytes]:
    """A worker process on the queue (fsoak.slow only), to be SIGKILLed mid-run."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import anyio, venturi_redis as vr, feature_soak as f\n"
        "async def main():\n"
        "    async with vr.Client.from_url(sys.argv[1]) as c:\n"
        "        w = vr.Worker(c.queue(f.KILL_QUEUE), handle_signals=False, lease=3, concurrency=8)\n"
        "        await w.register(f.SlowJob).run()\n"
        "anyio.run(main)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, url, str(Path(__file__).resolve().parent)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    CHILDREN.append(proc)
    return proc


async def soak(url: str, rounds: int, jobs: int, n_kinds: int, kill: bool, trace: bool) -> None:
    tasks, handlers = kinds(n_kinds)
    tracemalloc.start(8)
    async with vr.Client.from_url(url) as client:
        q = client.queue(QUEUE)
        kq = client.queue(KILL_QUEUE)
        sharded = vr.ShardedQueue(client, "fsoak-sh", partitions=4)
        await q.set_history(True)
        await q.set_limit("fsoak.k1", concurrency=8, rate=vr.Rate(50, 0.5), per_key=True)
        await q.schedule("every", Step(name="tick"), every=0.5)
        await q.schedule("nightly", Step(name="nightly"), cron="@daily")
        off = vr.offload(queue=QUEUE, kind="fsoak.double", retention=1.0)(double)
        metrics = vr.PrometheusMetrics()
        # Tenants' queues come and go: the worker serves this round's four.
        worker = vr.Worker(
            [q, kq, *sharded.partitions],
            concurrency=64,
            handle_signals=False,
            poll_interval=0.2,
            reclaim_interval=0.5,
            lease=3,
            retention=SHORT,
            observer=metrics,
        ).register(*handlers, ThrottledJob, DebouncedJob, StepJob, SlowJob, off)
        start_mem, _ = used_memory(url)
        print(f"start: used_memory={start_mem / 1e6:.2f} MB, worker RSS {rss_kb() / 1024:.1f} MB", flush=True)
        t0 = time.monotonic()
        done = 0
        last_tenants: list[vr.Queue] = []
        snap: tracemalloc.Snapshot | None = None
        rows: list[tuple[int, int, float, int, float, float]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            for rnd in range(rounds):
                base = rnd * jobs
                proc = killed_worker(url) if kill else None
                batch: list[vr.Task] = []
                for i in range(jobs):
                    n = base + i
                    t = tasks[n % len(tasks)]
                    m = n % 100
                    if m == 40:
                        batch.append(Stranger(n=n))
                    elif m in (50, 51):
                        batch.append(Throttled(key=f"t{n}"))
                    elif m in (52, 53):
                        batch.append(Debounced(key=f"b{n // 4}"))
                    elif m in (60, 61, 62):
                        batch.append(t(n=n, okey=f"o{n // 3}"))
                    elif m in (70, 71) and t is tasks[1 % len(tasks)]:
                        batch.append(t(n=n, lkey=f"l{n}"))
                    else:
                        batch.append(t(n=n, key=f"d{n}" if m % 2 else None, blob="x" * 100))
                await q.enqueue_many(batch)
                for i in range(jobs // 200):
                    await q.enqueue_flow(
                        Step(name=f"parent{base + i}"),
                        [Step(name=f"c{base + i}"), Step(name=f"fail{i}" if i % 5 == 0 else "ok")],
                    )
                    first = await q.enqueue(Step(name=f"first{i}"))
                    await q.enqueue(Step(name=f"after{i}"), after=[first])
                    await off.offload(client, base + i)
                    await sharded.enqueue(Step(name=f"sh{base + i}"))
                    late = await q.enqueue(Mixed(n=base + i), delay=60)
                    await q.update(late, priority="high")
                    await q.cancel(late)
                if kill:
                    await kq.enqueue_many([Slow(n=i) for i in range(16)])
                # A queue per tenant: this round's four, drained by a worker of
                # their own, which also serves the last round's four (whose
                # retention it applies: a queue nobody serves keeps its jobs).
                tenants = [client.queue(f"fsoak-t{rnd}-{i}") for i in range(4)]
                for t_q in tenants:
                    await t_q.enqueue_many([Step(name=f"tenant{j}") for j in range(25)])
                await q.pause()
                await q.resume_queue()
                await (
                    vr.Worker(
                        [*last_tenants, *tenants],
                        handle_signals=False,
                        retention=TENANT,
                        reclaim_interval=0.2,
                    )
                    .register(StepJob)
                    .run(until_idle=True)
                )
                last_tenants = tenants
                await anyio.sleep(0.3)
                if proc is not None:
                    stop(proc)
                while not all([await p.is_drained() for p in (q, kq, *sharded.partitions)]):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                await q.retry_dead(kind=tasks[0].KIND)
                while not await q.is_drained():  # noqa: ASYNC110 - polling Redis
                    await anyio.sleep(0.1)
                done += jobs
                # Retention (1 s), the throttle windows, offloads and rate
                # windows pass; the interval schedule keeps firing meanwhile.
                await anyio.sleep(2.5)
                gc.collect()
                mem, nkeys = used_memory(url)
                traced, _ = tracemalloc.get_traced_memory()
                rows.append((rnd + 1, done, mem / 1e6, nkeys, rss_kb() / 1024, traced / 1e6))
                print(
                    f"round {rnd + 1:3d}: jobs={done:7d} after retention {mem / 1e6:6.2f} MB ({nkeys} keys); "
                    f"worker RSS {rss_kb() / 1024:6.1f} MB, traced {traced / 1e6:6.2f} MB",
                    flush=True,
                )
                if trace:
                    print("   ", key_groups(url), flush=True)
                if trace and rnd == 1:
                    snap = tracemalloc.take_snapshot()
            worker.shutdown()
        elapsed = time.monotonic() - t0
        print(f"summary: {done} jobs in {elapsed:.0f}s; keys left, by shape: {key_groups(url)}")
        if trace and snap is not None:
            end = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            print("tracemalloc, largest growths since round 2:")
            for stat in end.compare_to(snap, "traceback")[:12]:
                print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
                for line in stat.traceback.format()[-6:]:
                    print("     ", line)


def main() -> None:
    # The mix fails runs on purpose: their WARNINGs would bury the figures.
    logging.getLogger("venturi_redis").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--kinds", type=int, default=50)
    parser.add_argument("--no-kill", action="store_true", help="no worker process SIGKILLed each round")
    parser.add_argument("--trace", action="store_true", help="print tracemalloc's largest growths")
    parser.add_argument("--redis", help="use this Redis instead of starting one (its db must be empty)")
    args = parser.parse_args()
    proc = work = None
    url = args.redis
    if url is None:
        proc, url, work = start_redis()
    try:
        anyio.run(soak, url, args.rounds, args.jobs, args.kinds, not args.no_kill, args.trace)
    finally:
        for child in CHILDREN:
            stop(child)
        if proc is not None:
            proc.terminate()
            proc.wait()
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
