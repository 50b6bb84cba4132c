"""Helpers of the chaos runs: worker processes a driver can kill, and figures.

Each scenario is sized for CI (well under a minute); ``VENTURI_LONG=1`` runs
the long version. Every scenario prints one ``CHAOS`` line with its figures
(run pytest with ``-s`` to see them) and asserts them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from venturi_redis._model.records import JOURNAL_FIELDS, journal_from

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
LONG = os.environ.get("VENTURI_LONG", "") not in ("", "0")


def figures(scenario: str, **values: object) -> str:
    """Print (and return) one line of figures: ``CHAOS name: k=v ...``."""
    line = f"CHAOS {scenario}: " + " ".join(f"{k}={v}" for k, v in values.items())
    print(line, flush=True)
    return line


class Fleet:
    """Worker processes (``tests/chaos/worker_proc.py``) started and killed by a test."""

    def __init__(self, url: str, queue: str, logs: Path, **options: object) -> None:
        self.url = url
        self.queue = queue
        self.logs = logs
        self.options = options
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._seq = 0
        self._files: list[BinaryIO] = []

    def start(self, **overrides: object) -> str:
        """Start one worker process; returns its name (also its lease_owner)."""
        self._seq += 1
        name = f"w{self._seq}"
        opts = {**self.options, **overrides}
        args = [sys.executable, "-m", "tests.chaos.worker_proc", self.url, self.queue, "--name", name]
        for key, value in opts.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in close()
        self._files.append(log)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs[name] = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        return name

    async def wait_started(self, timeout: float = 60.0) -> None:
        """Until every worker started so far has passed its start-up checks and logged so.

        A worker whose first connection finds Redis down exits by design (its
        start-up checks), so a test that kills Redis waits for this first.
        """
        with anyio.fail_after(timeout):
            for name in list(self.procs):
                while " starting on " not in self.log(name):
                    assert self.procs[name].poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
                    await anyio.sleep(0.05)

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        """SIGTERM everyone (graceful), then SIGKILL whoever is still there."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in self._files:
            f.close()


async def reconnecting(call: Callable[[], Awaitable[T]], attempts: int = 50) -> T:
    """Await ``call()``, retrying connection errors: the first command on a pooled
    connection the server dropped fails once (redis-py then reconnects)."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except (RedisConnectionError, RedisTimeoutError):
            await anyio.sleep(0.05)
    return await call()


async def redis_now_ms(redis: Any) -> int:
    """The server's clock in ms: the clock every script (and so every stored time) uses."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def journals(redis: Any, keys: Any, ids: list[str]) -> dict[str, list[tuple[str, int]]]:
    """The journal of many jobs as (event, at ms) pairs, read in pipelined chunks, as a
    reader shows it (what the hash says put back: records.py journal_from)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for i in range(0, len(ids), 1000):
        chunk = ids[i : i + 1000]
        pipe = redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.xrange(keys.journal(job_id))
            pipe.hmget(keys.job(job_id), *JOURNAL_FIELDS)
        replies = await pipe.execute()
        for n, job_id in enumerate(chunk):
            entries = journal_from(replies[2 * n], replies[2 * n + 1])
            out[job_id] = [(f[b"event"].decode(), int(f[b"at"])) for _, f in entries]
    return out


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def make(url: str, queue: str, **options: object) -> Fleet:
        fleet = Fleet(url, queue, tmp_path, **options)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()
