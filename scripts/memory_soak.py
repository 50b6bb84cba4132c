"""Memory soak: does Redis memory stay flat over a long run of many jobs?

Starts its own redis-server on a free port (or uses --redis URL), then runs
rounds of: enqueue a batch (most jobs complete, some pause once, some die),
let one worker drain it, and read ``INFO memory``. Retention is short
(completed 2 s, dead 4 s) so that trimming, not the absence of load, is what
keeps memory flat; the journals are capped per job by the scripts.

    .venv/bin/python scripts/memory_soak.py                  # 40 rounds x 5000 jobs
    .venv/bin/python scripts/memory_soak.py --rounds 10 --jobs 1000

Prints one line per round, read twice: right after the batch drained (its
finished jobs still retained) and again once retention has removed them. The
second figure is the floor; if anything accumulated (journals, index entries,
dedup fields), it would creep up from round to round.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import venturi_redis as vr


class Soak(vr.Task):
    KIND: ClassVar[str] = "soak"
    n: int
    blob: str = ""

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=0.001, cap=0.002)


class SoakJob(Soak, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        ctx.set_attachment({"n": self.n})
        if self.n % 50 == 0:
            raise vr.TaskError.permanent(f"job {self.n} is doomed")
        if self.n % 10 == 0 and ctx.run_count == 1:
            return vr.Outcome.pause_in_with(0, "once more")
        return vr.Outcome.completed_with("ok", result={"n": self.n})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis() -> tuple[subprocess.Popen[bytes], str, Path]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH (apt-get install -y redis-server)")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="venturi-soak-"))
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(500):
        try:
            redis.Redis(port=port).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    return proc, f"redis://127.0.0.1:{port}/0", work


def used_memory(url: str) -> tuple[int, int]:
    r = redis.Redis.from_url(url)
    try:
        info = r.info("memory")
        return int(info["used_memory"]), int(r.dbsize())
    finally:
        r.close()


async def soak(url: str, rounds: int, jobs: int) -> None:
    async with vr.Client.from_url(url) as client:
        q = client.queue("soak")
        worker = vr.Worker(
            q,
            concurrency=64,
            handle_signals=False,
            poll_interval=0.2,
            reclaim_interval=0.5,
            retention=vr.Retention(completed=2.0, dead=4.0, cancelled=2.0, batch=500),
        ).register(SoakJob)
        samples: list[int] = []
        peaks: list[int] = []
        start_mem, _ = used_memory(url)
        print(f"start: used_memory={start_mem / 1e6:.2f} MB")
        t0 = time.monotonic()
        done = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            for rnd in range(rounds):
                base = rnd * jobs
                await q.enqueue_many([Soak(n=base + i, blob="x" * 200) for i in range(jobs)])
                while not await q.is_drained():  # noqa: ASYNC110 - polling Redis, not a local event
                    await anyio.sleep(0.05)
                done += jobs
                peak, peak_keys = used_memory(url)
                st = await q.stats()
                retained = st.completed + st.dead
                # Then wait for retention to remove this round's jobs: the floor
                # must not creep up from round to round.
                while (st := await q.stats()).completed + st.dead:  # noqa: ASYNC110 - polling Redis
                    await anyio.sleep(0.25)
                floor, floor_keys = used_memory(url)
                samples.append(floor)
                peaks.append(peak)
                print(
                    f"round {rnd + 1:3d}: jobs={done:7d} after drain {peak / 1e6:6.2f} MB "
                    f"({peak_keys} keys, {retained} finished jobs retained); "
                    f"after retention {floor / 1e6:5.2f} MB ({floor_keys} keys)"
                )
            worker.shutdown()
        elapsed = time.monotonic() - t0
        end_mem, end_keys = used_memory(url)
        first, last = samples[: len(samples) // 2], samples[len(samples) // 2 :]
        halves = (
            f"first half of the rounds {min(first) / 1e6:.2f}-{max(first) / 1e6:.2f} MB, "
            f"second half {min(last) / 1e6:.2f}-{max(last) / 1e6:.2f} MB"
            if first
            else f"{min(last) / 1e6:.2f} MB"  # one round: no halves to compare
        )
        print(
            f"summary: {done} jobs in {elapsed:.0f}s; used_memory at start {start_mem / 1e6:.2f} MB; "
            f"after retention: {halves}; "
            f"after drain (retained jobs included) at most {max(peaks) / 1e6:.2f} MB; "
            f"at the end {end_mem / 1e6:.2f} MB with {end_keys} keys"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--redis", help="use this Redis instead of starting one (its db must be empty)")
    args = parser.parse_args()
    proc = None
    work = None
    url = args.redis
    if url is None:
        proc, url, work = start_redis()
    try:
        anyio.run(soak, url, args.rounds, args.jobs)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
