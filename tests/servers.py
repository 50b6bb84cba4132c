"""Real redis-server processes for the tests, on free ports (mirakuru style).

A missing ``redis-server`` is a failure, never a skip: the contract suite is
only meaningful against a real server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server is not on PATH: the tests need a real Redis "
            "(apt-get install -y redis-server); .ci/run installs it"
        )
    return path


class RedisServer:
    """One redis-server child process that a test may kill and restart."""

    def __init__(self, *extra: str, port: int | None = None, directory: Path | None = None) -> None:
        self.port = port or free_port()
        self.extra = list(extra)
        self.dir = directory or Path(tempfile.mkdtemp(prefix="venturi-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                # Closed at once: an unclosed client's socket warns whenever a
                # later collection finds it, failing whichever test runs then.
                with redis.Redis(port=self.port, socket_connect_timeout=0.2) as r:
                    r.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.dir / "redis.log"
                    err = log.read_text()[-2000:] if log.exists() else ""
                    raise RuntimeError(f"redis-server on port {self.port} did not start: {err}") from None
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def version_of(binary: str | None = None) -> str:
    out = subprocess.run([binary or redis_server_binary(), "--version"], capture_output=True, text=True)
    return out.stdout.strip()


__all__ = ["RedisServer", "free_port", "redis_server_binary", "version_of", "os"]


async def replicate(replica: RedisServer, master: RedisServer) -> None:
    """Make ``replica`` a replica of ``master`` and wait until its link is up."""
    import anyio
    import redis

    with redis.Redis(port=replica.port) as r:
        r.execute_command("REPLICAOF", "127.0.0.1", master.port)
        while r.info("replication")["master_link_status"] != "up":
            await anyio.sleep(0.05)
