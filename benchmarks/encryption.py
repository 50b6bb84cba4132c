"""Encryption at rest's cost on 1 KiB payloads: W1 (enqueue) and W2 (drain), off against on.

Usage (from the repository root; about 30 s, or 8 min with ``--instructions`` on an idle machine)::

    .venv/bin/python benchmarks/encryption.py [--jobs 3000] [--rounds 5] [--concurrency 10]
    .venv/bin/python benchmarks/encryption.py --instructions   # needs valgrind

One redis-server of its own. Each round runs both settings, in alternating
order (off then on, then on then off), so the machine's drift falls on both:

- W1: ``--jobs`` single enqueues of a task whose encoded payload is 1 KiB,
  awaited one after another;
- W2: one in-process worker (``--concurrency``) drains them, no-op handler;
- W1 bulk: the same tasks again, in ``enqueue_many`` calls of 100.

Each phase reports jobs/s (wall) and this process's CPU per job
(``time.process_time``: the client's, not Redis's). The figures are medians
over the rounds, and the overhead is on's against off's. It also times the
cipher alone (seal, open of one 1 KiB value), the floor of the difference.
Redis's own work does not change: the scripts move the same bytes, 34 more.

Wall-clock figures on this shared 2-core machine swing by 20-30 % between two
runs of the same code (benchmarks/worker_cost.py says why); ``--instructions``
counts instead, as worker_cost.py does, each workload in a process of its own
under callgrind, off and on, with ``--small`` and then ``--large`` jobs:
W1 enqueues them one after another; W2 drains them (queued beforehand by
this process, outside callgrind, with the same setting). The difference over
the difference in jobs is the client's instructions per single enqueue (W1)
and per job run (W2), start-up and imports cancelled out. Those differences
swing by a few thousand instructions between runs (the event loop's turns
follow Redis's timing), so it first counts the cipher alone, 10,000 seals
and 10,000 opens of the 1 KiB payload against none (the loop's own turn
included, a few hundred): W1 pays one seal per job and W2 one open (a no-op
handler writes nothing back), so these over the off figures are the
overheads without that noise. Callgrind counts user-space instructions only:
a system call's kernel time (``os.urandom``'s) is not in them.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any, ClassVar

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis._model.codec import pack_model  # noqa: E402

KEY = bytes(range(32))
BULK = 100  # jobs per enqueue_many call in W1 bulk


class Blob(vr.Task):
    KIND: ClassVar[str] = "bench.blob"
    i: int
    data: str


class BlobJob(Blob, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


def _task(i: int) -> Blob:
    data = ("0123456789abcdef" * 64)[: 1024 - 20]
    return Blob(i=i, data=data)


async def one_round(url: str, jobs: int, concurrency: int, encrypted: bool) -> dict[str, float]:
    redis.Redis.from_url(url).flushall()
    enc = vr.Encryption(keys=[KEY]) if encrypted else None
    async with vr.Client.from_url(url, encryption=enc) as client:
        queue = client.queue("bench")
        tasks = [_task(i) for i in range(jobs)]
        await queue.enqueue(_task(-1))  # connection and scripts ready before the clock
        w0, c0 = time.perf_counter(), time.process_time()
        for t in tasks:
            await queue.enqueue(t)
        w1, c1 = time.perf_counter(), time.process_time()
        worker: vr.Worker[Any] = vr.Worker(queue, concurrency=concurrency, handle_signals=False)
        worker.register(BlobJob)
        await worker.run(until_idle=True)
        w2, c2 = time.perf_counter(), time.process_time()
        counts = await queue.counts()
        assert counts["completed"] == jobs + 1, counts
        # W1 bulk: the same tasks again, BULK to an enqueue_many call.
        w3, c3 = time.perf_counter(), time.process_time()
        for i in range(0, jobs, BULK):
            await queue.enqueue_many(tasks[i : i + BULK])
        w4, c4 = time.perf_counter(), time.process_time()
    n = jobs + 1
    return {
        "w1_rate": jobs / (w1 - w0),
        "w1_cpu_us": (c1 - c0) / jobs * 1e6,
        "w2_rate": n / (w2 - w1),
        "w2_cpu_us": (c2 - c1) / n * 1e6,
        "w1_bulk_rate": jobs / (w4 - w3),
        "w1_bulk_cpu_us": (c4 - c3) / jobs * 1e6,
    }


async def enqueue(url: str, jobs: int, encrypted: bool) -> None:
    """W1 of ``--instructions`` (the child under callgrind, and the untimed fill before W2)."""
    redis.Redis.from_url(url).flushall()
    enc = vr.Encryption(keys=[KEY]) if encrypted else None
    async with vr.Client.from_url(url, encryption=enc) as client:
        queue = client.queue("bench")
        for i in range(jobs):
            await queue.enqueue(_task(i))


async def drain(url: str, jobs: int, concurrency: int, encrypted: bool) -> None:
    """W2 of ``--instructions``: the child drains the ``jobs`` the parent queued."""
    enc = vr.Encryption(keys=[KEY]) if encrypted else None
    async with vr.Client.from_url(url, encryption=enc) as client:
        queue = client.queue("bench")
        worker: vr.Worker[Any] = vr.Worker(queue, concurrency=concurrency, handle_signals=False)
        worker.register(BlobJob)
        await worker.run(until_idle=True)
        counts = await queue.counts()
        assert counts["completed"] == jobs, counts


def instructions(url: str, phase: str, jobs: int, concurrency: int, encrypted: bool) -> int:
    if phase == "drain":  # the queue filled outside callgrind, by the same client settings
        anyio.run(enqueue, url, jobs, encrypted)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        child = [
            sys.executable,
            __file__,
            "--child",
            url,
            phase,
            str(jobs),
            str(concurrency),
            str(int(encrypted)),
        ]
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *child],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        m = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.M)
        assert m, "no totals in the callgrind output"
        return int(m.group(1))


def cipher_loop(phase: str, n: int) -> None:
    """The ``--instructions`` child for the cipher alone: ``n`` seals, or ``n`` opens, of the payload."""
    enc = vr.Encryption(keys=[KEY])
    plain = pack_model(_task(0))
    sealed = enc.seal(plain)
    if phase == "seal":
        for _ in range(n):
            enc.seal(plain)
    else:
        for _ in range(n):
            enc.open(sealed)


def count_instructions(small: int, large: int, concurrency: int) -> None:
    n = 10_000
    none = instructions("-", "seal", 0, 0, True)
    alone = {phase: (instructions("-", phase, n, 0, True) - none) / n for phase in ("seal", "open")}
    print(
        f"cipher alone, 1 KiB: seal {alone['seal']:,.0f}, open {alone['open']:,.0f} instructions a call",
        flush=True,
    )
    totals: dict[bool, float] = {False: 0.0, True: 0.0}
    with RedisServer() as server:
        for phase, label, call in (
            ("enqueue", "W1, one single enqueue", "seal"),
            ("drain", f"W2, one job run (c={concurrency})", "open"),
        ):
            # off, on, on, off: a drift between the runs falls on both settings
            counts: dict[tuple[bool, int], int] = {}
            for encrypted, jobs in ((False, small), (True, small), (True, large), (False, large)):
                counts[encrypted, jobs] = instructions(server.url, phase, jobs, concurrency, encrypted)
            per_job = {e: (counts[e, large] - counts[e, small]) / (large - small) for e in (False, True)}
            for e in (False, True):
                totals[e] += per_job[e]
            off, on = per_job[False], per_job[True]
            print(
                f"{label}: off {off:,.0f}, on {on:,.0f} instructions, "
                f"{on - off:+,.0f} ({(on / off - 1) * 100:+.1f}%); "
                f"its one {call} alone over off: {alone[call] / off * 100:+.1f}%",
                flush=True,
            )
    print(
        f"both (enqueue + run): off {totals[False]:,.0f}, on {totals[True]:,.0f}, "
        f"{(totals[True] / totals[False] - 1) * 100:+.1f}%"
    )


def cipher_floor() -> tuple[float, float, int]:
    enc = vr.Encryption(keys=[KEY])
    plain = pack_model(_task(0))
    sealed = enc.seal(plain)
    n = 20_000
    seal_us = min(timeit.repeat(lambda: enc.seal(plain), number=n, repeat=3)) / n * 1e6
    open_us = min(timeit.repeat(lambda: enc.open(sealed), number=n, repeat=3)) / n * 1e6
    return seal_us, open_us, len(plain)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=1000)
    ap.add_argument(
        "--child",
        nargs=5,
        metavar=("URL", "PHASE", "JOBS", "CONCURRENCY", "ENCRYPTED"),
        help=argparse.SUPPRESS,
    )
    a = ap.parse_args()
    if a.child:
        url, phase, jobs, conc, encrypted = a.child
        if phase == "enqueue":
            anyio.run(enqueue, url, int(jobs), encrypted == "1")
        elif phase in ("seal", "open"):
            cipher_loop(phase, int(jobs))
        else:
            anyio.run(drain, url, int(jobs), int(conc), encrypted == "1")
        return
    if a.instructions:
        count_instructions(a.small, a.large, a.concurrency)
        return
    seal_us, open_us, size = cipher_floor()
    print(f"payload {size} bytes encoded; cipher alone: seal {seal_us:.1f} us, open {open_us:.1f} us")
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with RedisServer() as server:
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for encrypted in order:
                res = anyio.run(one_round, server.url, a.jobs, a.concurrency, encrypted)
                results[encrypted].append(res)
                print(
                    f"round {r + 1} {'on ' if encrypted else 'off'}: "
                    + ", ".join(f"{k} {v:,.1f}" for k, v in res.items()),
                    flush=True,
                )
    print()
    print("| workload | off | on | overhead of the medians | median of the rounds' paired overheads |")
    print("|---|---|---|---|---|")
    for key, label, higher_better in (
        ("w1_rate", "W1 single enqueue, jobs/s", True),
        ("w1_cpu_us", "W1 client CPU per job, us", False),
        ("w2_rate", f"W2 drain c={a.concurrency}, jobs/s", True),
        ("w2_cpu_us", "W2 worker CPU per job, us", False),
        ("w1_bulk_rate", f"W1 bulk enqueue ({BULK} a call), jobs/s", True),
        ("w1_bulk_cpu_us", "W1 bulk client CPU per job, us", False),
    ):
        off = statistics.median(x[key] for x in results[False])
        on = statistics.median(x[key] for x in results[True])
        cost = (off / on - 1) if higher_better else (on / off - 1)
        paired = statistics.median(
            (x[key] / y[key] - 1) if higher_better else (y[key] / x[key] - 1)
            for x, y in zip(results[False], results[True], strict=True)
        )
        print(f"| {label} | {off:,.1f} | {on:,.1f} | {cost * 100:+.1f}% | {paired * 100:+.1f}% |")


if __name__ == "__main__":
    main()
