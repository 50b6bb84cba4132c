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
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

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


class TlsFiles(NamedTuple):
    """A throwaway certificate authority and a server certificate for 127.0.0.1 (not for localhost)."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Make a CA and a server certificate signed by it with the ``openssl`` CLI (EC P-256, two days).

    Missing ``openssl`` is a failure, as a missing ``redis-server`` is.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "openssl is not on PATH: the TLS tests make their certificates with it "
            "(apt-get install -y openssl); .ci/run installs it"
        )
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(ca=directory / "ca.crt", cert=directory / "server.crt", key=directory / "server.key")
    ca_key, csr, ext = directory / "ca.key", directory / "server.csr", directory / "server.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str | Path) -> None:
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", ca_key, "-out", files.ca, "-days", "2",
        "-subj", "/CN=venturi-redis test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    run("req", *ec, "-keyout", files.key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=IP:127.0.0.1\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectKeyIdentifier=hash\n"
    )
    run("x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", files.cert, "-days", "2", "-extfile", ext)  # fmt: skip
    return files


class RedisServer:
    """One redis-server child process that a test may kill and restart.

    With ``tls``, it listens for TLS only (``rediss://``), and checks no client
    certificate; its ``url`` carries the CA for the client to verify it with.
    """

    def __init__(
        self,
        *extra: str,
        port: int | None = None,
        directory: Path | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.port = port or free_port()
        self.extra = list(extra)
        self.dir = directory or Path(tempfile.mkdtemp(prefix="venturi-redis-"))
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_with()

    def url_with(self, port: int | None = None, **query: str | float) -> str:
        """This server's URL, through ``port`` if given (a proxy in front), with ``query`` added."""
        scheme = "rediss" if self.tls else "redis"
        params: dict[str, str | float] = {}
        if self.tls is not None:
            params["ssl_ca_certs"] = str(self.tls.ca)
        params.update(query)
        tail = f"?{urlencode(params, quote_via=quote, safe='/')}" if params else ""
        return f"{scheme}://127.0.0.1:{port or self.port}/0{tail}"

    def connect_kwargs(self) -> dict[str, Any]:
        """What a ``redis.Redis`` needs, beside the port, to talk to this server."""
        if self.tls is None:
            return {}
        return {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}

    def start(self) -> RedisServer:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no",
            ]  # fmt: skip
        args = [
            redis_server_binary(),
            *listen,
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
        self.proc = proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                # Closed at once: an unclosed client's socket warns whenever a
                # later collection finds it, failing whichever test runs then.
                with redis.Redis(
                    host="127.0.0.1", port=self.port, socket_connect_timeout=0.2, **self.connect_kwargs()
                ) as r:
                    r.ping()
                return self
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()  # not left running behind the failure
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


__all__ = [
    "RedisServer",
    "TlsFiles",
    "free_port",
    "make_tls_files",
    "os",
    "redis_server_binary",
    "version_of",
]


async def replicate(replica: RedisServer, master: RedisServer) -> None:
    """Make ``replica`` a replica of ``master`` and wait until its link is up."""
    import anyio
    import redis

    with redis.Redis(port=replica.port) as r:
        r.execute_command("REPLICAOF", "127.0.0.1", master.port)
        while r.info("replication")["master_link_status"] != "up":
            await anyio.sleep(0.05)
