"""Real redis-server processes for the tests, on free ports (mirakuru style).

A missing ``redis-server`` is a failure, never a skip: the contract suite is
only meaningful against a real server.
"""

from __future__ import annotations

import functools
import os
import re
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


def free_port_pair(offset: int) -> int:
    """A free port whose ``port + offset`` is free too (Redis 6.2's cluster bus: port + 10000)."""
    for _ in range(200):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port + offset > 65535:
                continue
            try:
                b.bind(("127.0.0.1", port + offset))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port p with p + {offset} free too")


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


# The server set-ups of managed Redis and least-privilege users (issue 45,
# docs/deployment.md "Managed Redis and ACL users"): the extra redis-server
# arguments, and the ACL rules of the application's user (None: the default
# user, unrestricted). An ACL set-up's url is that user's; admin_url the
# default user's. `VENTURI_REDIS_SETUP` runs the contract suite on one of them
# (tests/conftest.py).
APP_USER = "venturi-app"
APP_PASSWORD = "app-s3cret-pw-4711"
# resetchannels first: Redis 6.2 gives a new user every channel
# (acl-pubsub-default allchannels; 7.0 and later none) and refuses a channel
# pattern after that; on 7.0 and later it changes nothing (docs/deployment.md).
ACL_KEYS = ("~venturi:*", "resetchannels", "&venturi:*")
MANAGED_SETUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "": ((), None),
    # A managed service's CONFIG, renamed away.
    "noconfig": (("--rename-command", "CONFIG", ""), None),
    # Redis's own least-privilege pattern: everything but @dangerous, on our keys.
    "acl": ((), ("+@all", "-@dangerous")),
    "acl+info": ((), ("+@all", "-@dangerous", "+info")),
}


def managed_args(setup: str) -> list[str]:
    """redis-server's arguments for ``setup``: its extra ones, and the application's user."""
    extra, rules = MANAGED_SETUPS[setup]
    if rules is None:
        return list(extra)
    return [*extra, "--user", APP_USER, "on", f">{APP_PASSWORD}", *ACL_KEYS, *rules]


class RedisServer:
    """One redis-server child process that a test may kill and restart.

    With ``tls``, it listens for TLS only (``rediss://``), and checks no client
    certificate; its ``url`` carries the CA for the client to verify it with.
    With ``password``, it requires it (``requirepass``) and, as a replica,
    gives it to its master (``masterauth``).
    """

    def __init__(
        self,
        *extra: str,
        port: int | None = None,
        directory: Path | None = None,
        tls: TlsFiles | None = None,
        password: str | None = None,
        setup: str = "",
    ) -> None:
        if setup not in MANAGED_SETUPS:
            raise ValueError(f"unknown server setup {setup!r}: one of {sorted(MANAGED_SETUPS)}")
        self.setup = setup
        self.port = port or free_port()
        self.extra = list(extra)
        self.dir = directory or Path(tempfile.mkdtemp(prefix="venturi-redis-"))
        self.tls = tls
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL an application uses: under an ACL setup, the restricted user's."""
        return self.url_with()

    @property
    def admin_url(self) -> str:
        """The URL of the unrestricted default user (the tests' own setup and checks)."""
        return self.url_with(admin=True)

    def url_with(self, port: int | None = None, *, admin: bool = False, **query: str | float) -> str:
        """This server's URL, through ``port`` if given (a proxy in front), with ``query`` added."""
        scheme = "rediss" if self.tls else "redis"
        params: dict[str, str | float] = {}
        if self.tls is not None:
            params["ssl_ca_certs"] = str(self.tls.ca)
        params.update(query)
        tail = f"?{urlencode(params, quote_via=quote, safe='/')}" if params else ""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if MANAGED_SETUPS[self.setup][1] is not None and not admin:
            auth = f"{APP_USER}:{quote(APP_PASSWORD, safe='')}@"
        return f"{scheme}://{auth}127.0.0.1:{port or self.port}/0{tail}"

    def connect_kwargs(self) -> dict[str, Any]:
        """What a ``redis.Redis`` needs, beside the port, to talk to this server."""
        kwargs: dict[str, Any] = {}
        if self.password:
            kwargs["password"] = self.password
        if self.tls is not None:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls.ca))
        return kwargs

    def start(self) -> RedisServer:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no",
            ]  # fmt: skip
        if self.password:
            listen += ["--requirepass", self.password, "--masterauth", self.password]
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
            *managed_args(self.setup),
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


@functools.cache
def server_version() -> tuple[int, ...]:
    """The release of the ``redis-server`` on PATH, from its ``--version`` (``v=7.0.15``).

    Valkey's is its own (``v=8.0.1``): every Valkey has what Redis 7.2 has.
    For what the suite's harness must start differently on an older server
    (`make test-server`, docs/operations.md "Servers tested"); never for what
    the package does, which must not depend on it.
    """
    found = re.search(r"\bv=(\d+)\.(\d+)\.(\d+)", version_of())
    if found is None:
        raise RuntimeError(f"cannot read redis-server's version from {version_of()!r}")
    return tuple(int(x) for x in found.groups())


__all__ = [
    "LocalSentinel",
    "RedisServer",
    "TlsFiles",
    "free_port",
    "free_port_pair",
    "make_tls_files",
    "os",
    "redis_server_binary",
    "server_version",
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


def _blocking(server: RedisServer) -> redis.Redis:
    """A short-lived blocking client on ``server`` (close it)."""
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=1, **server.connect_kwargs())


class LocalSentinel:
    """A Redis Sentinel deployment on free ports: one master, its replicas, three sentinels.

    The master and replicas are ``RedisServer``s (the replicas started with
    ``--replicaof``); each sentinel is ``redis-server sentinel.conf --sentinel``
    with a generated config (sentinels rewrite it, so each has its own
    directory) monitoring ``service`` with a quorum of two, a master declared
    down after ``down_after_ms``. ``start`` returns once every replica's link
    is up and every sentinel knows the master and all its replicas (a forced
    failover needs a replica the sentinel knows).

    ``password`` protects the master and replicas (the sentinels are told it by
    ``sentinel auth-pass``); ``sentinel_password`` protects the sentinels
    themselves (``requirepass``, and ``sentinel sentinel-pass`` between them).
    With ``tls``, every process speaks TLS only, replication and the
    sentinels' own links included.
    """

    def __init__(
        self,
        *,
        service: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        password: str | None = None,
        sentinel_password: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.down_after_ms = down_after_ms
        tls_extra = ("--tls-replication", "yes") if tls is not None else ()
        self.master = RedisServer(*tls_extra, "--repl-diskless-sync-delay", "0", tls=tls, password=password)
        self.replicas = [
            RedisServer(
                *tls_extra,
                "--repl-diskless-sync-delay",
                "0",
                "--replicaof",
                "127.0.0.1",
                str(self.master.port),
                tls=tls,
                password=password,
            )
            for _ in range(replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.dir = Path(tempfile.mkdtemp(prefix="venturi-sentinel-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def servers(self) -> list[RedisServer]:
        """The master and the replicas, as started (a failover swaps their roles)."""
        return [self.master, *self.replicas]

    @property
    def url(self) -> str:
        """The URL an application uses: under an ACL setup, the restricted user's."""
        return self.url_with()

    @property
    def admin_url(self) -> str:
        """The URL of the unrestricted default user (the tests' own setup and checks)."""
        return self.url_with(admin=True)

    def url_with(self, **query: str | float) -> str:
        """``redis+sentinel://`` (``rediss+`` with TLS) naming every sentinel, the service and db 0."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        params: dict[str, str | float] = {}
        if self.tls is not None:
            params["ssl_ca_certs"] = str(self.tls.ca)
        if self.sentinel_password:
            params["sentinel_password"] = self.sentinel_password
        params.update(query)
        tail = f"?{urlencode(params, quote_via=quote, safe='/')}" if params else ""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"{scheme}://{auth}{hosts}/{self.service}/0{tail}"

    def sentinel(self, index: int = 0, timeout: float = 1.0) -> redis.Redis:
        """A short-lived blocking client on sentinel ``index`` (close it)."""
        kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        if self.tls is not None:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls.ca))
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], **kwargs)

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def _config(self, port: int) -> str:
        lines = ["bind 127.0.0.1", f"dir {self.dir}", f"logfile {self.dir / f'sentinel-{port}.log'}"]
        if self.tls is None:
            lines.append(f"port {port}")
        else:
            lines += [
                "port 0",
                f"tls-port {port}",
                f"tls-cert-file {self.tls.cert}",
                f"tls-key-file {self.tls.key}",
                f"tls-ca-cert-file {self.tls.ca}",
                "tls-auth-clients no",
                "tls-replication yes",  # the sentinels reach masters and replicas over TLS
            ]
        if self.sentinel_password:
            lines += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
        s = self.service
        lines += [
            f"sentinel monitor {s} 127.0.0.1 {self.master.port} 2",
            f"sentinel down-after-milliseconds {s} {self.down_after_ms}",
            f"sentinel failover-timeout {s} 10000",
            f"sentinel parallel-syncs {s} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {s} {self.password}")
        return "\n".join(lines) + "\n"

    def start(self) -> LocalSentinel:
        try:
            self.master.start()
            for replica in self.replicas:
                replica.start()
            self._wait(self._replicas_linked, "replicas linked to the master")
            for port in self.sentinel_ports:
                conf = self.dir / f"sentinel-{port}.conf"
                conf.write_text(self._config(port))
                self.procs.append(
                    subprocess.Popen(
                        [redis_server_binary(), str(conf), "--sentinel"],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            self._wait(self._sentinels_ready, "sentinels knowing the master and its replicas")
        except BaseException:
            self.stop()
            raise
        return self

    def _replicas_linked(self) -> bool:
        for replica in self.replicas:
            with redis.Redis(
                host="127.0.0.1", port=replica.port, socket_timeout=1, **replica.connect_kwargs()
            ) as r:
                if r.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def _sentinels_ready(self) -> bool:
        want = {s.port for s in self.replicas}
        for i in range(len(self.sentinel_ports)):
            try:
                with self.sentinel(i) as r:
                    known = {int(x["port"]) for x in r.sentinel_slaves(self.service)}
                    if not want <= known:
                        return False
            except redis.RedisError:
                return False
        return True

    def master_port(self) -> set[int]:
        """The master's port as each reachable sentinel reports it (one value once they agree)."""
        ports: set[int] = set()
        for i in range(len(self.sentinel_ports)):
            try:
                with self.sentinel(i) as r:
                    # The bare command: redis-py 6.2 to 7.x's blocking
                    # sentinel_get_master_addr_by_name hands its reply parser
                    # an argument it does not take (`once`).
                    _, port = r.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                    ports.add(int(port))
            except redis.RedisError:
                continue
        return ports

    def failover(self) -> int:
        """``SENTINEL FAILOVER`` on the first sentinel; returns the port of the master it replaces."""
        (old,) = self.master_port()
        with self.sentinel(0) as r:
            r.execute_command("SENTINEL", "FAILOVER", self.service)
        return old

    def wait_for_new_master(self, old: int, timeout: float = 30.0) -> RedisServer:
        """Wait until every sentinel reports a master other than ``old`` and it says it is one."""

        def moved() -> bool:
            ports = self.master_port()
            if len(ports) != 1 or old in ports:
                return False
            new = self.server(next(iter(ports)))
            with _blocking(new) as r:
                return bool(r.info("replication")["role"] == "master")

        self._wait(moved, f"a master other than port {old}", timeout)
        (port,) = self.master_port()
        return self.server(port)

    def wait_for_replica(self, port: int, master: RedisServer, timeout: float = 30.0) -> None:
        """Wait until the server on ``port`` replicates ``master`` with its link up.

        After a switchover the sentinels turn the old master into a replica of
        the new one, about eight seconds later (Sentinel waits four publish
        periods before it reconfigures a replica that reports itself master).
        """

        def linked() -> bool:
            with _blocking(self.server(port)) as r:
                info = r.info("replication")
            return bool(
                info["role"] == "slave"
                and int(info["master_port"]) == master.port
                and info["master_link_status"] == "up"
            )

        self._wait(linked, f"port {port} replicating port {master.port}", timeout)

    def _wait(self, check: Any, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                logs = "".join(p.read_text()[-1500:] for p in sorted(self.dir.glob("*.log")))
                raise RuntimeError(f"sentinel setup: timed out waiting for {what}\n{logs}")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for server in self.servers:
            shutil.rmtree(server.dir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
