"""A real local Redis Cluster for the tests, built from ``redis-server`` processes.

``LocalCluster(masters=3, replicas=1)`` starts ``masters * (1 + replicas)``
servers on free ports (client port and cluster-bus port both picked free, via
``cluster-port``, so nothing collides with another test run; Redis 6.2 has no
``cluster-port``, its bus is the port + 10000, and both are picked free), each
with its ``nodes.conf`` in its own temp dir, then wires them by hand:

1. every master gets an equal slot range (``CLUSTER ADDSLOTS``, every release;
   ``ADDSLOTSRANGE`` is 7.0+) and a
   distinct config epoch (``CLUSTER SET-CONFIG-EPOCH``), exactly what
   ``redis-cli --cluster create`` does, without its fixed one-second sleeps;
2. every node ``CLUSTER MEET``s the first one;
3. each replica ``CLUSTER REPLICATE``s its master once it has heard of it;
4. we wait until every node reports ``cluster_state:ok``, every node maps all
   16384 slots to the same masters, and every replica's link is up.

That takes well under two seconds on the 2-core CI machine. A test may
``kill()`` a master (SIGKILL) and ``wait_for_failover`` to see a replica
promoted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import redis

from tests.servers import RedisServer, TlsFiles, free_port, free_port_pair, server_version

SLOTS = 16384


@dataclass(eq=False)
class ClusterNode:
    """One redis-server of the cluster."""

    server: RedisServer
    bus_port: int
    role: str  # "master" or "replica" (as started; failover may swap them)
    node_id: str = ""
    master_of: ClusterNode | None = None  # for replicas, the master they follow
    slots: tuple[int, int] | None = None  # for masters, their (first, last) slot

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def conn(self, timeout: float = 1.0) -> redis.Redis:
        """A short-lived blocking client on this node (close it)."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            **self.server.connect_kwargs(),
        )

    def info(self, section: str) -> dict[str, str]:
        with self.conn() as r:
            raw = r.info(section)
        return {str(k): str(v) for k, v in raw.items()}

    def cluster_info(self) -> dict[str, str]:
        with self.conn() as r:
            raw = r.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)


@dataclass(eq=False)
class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, on free ports.

    ``node_timeout_ms`` is Redis' ``cluster-node-timeout``: how long a node must
    be unreachable before it is flagged as failing. It bounds how fast a
    failover starts; tests of failover use a short one.

    With ``tls``, every node speaks only TLS, to clients, on the cluster bus
    and for replication; ``url`` is then ``rediss+cluster://`` with the CA.
    """

    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = 2000
    extra: tuple[str, ...] = ()
    tls: TlsFiles | None = None
    nodes: list[ClusterNode] = field(default_factory=list)

    # -- addresses -------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every master as a seed (survives a dead seed)."""
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes if n.role == "master")
        if self.tls is None:
            return f"redis+cluster://{seeds}"
        return f"rediss+cluster://{seeds}?ssl_ca_certs={quote(str(self.tls.ca), safe='/')}"

    @property
    def master_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.role == "master"]

    def owner_of_slot(self, slot: int) -> ClusterNode:
        """The node that currently serves ``slot`` (asks a live node)."""
        for n in self.nodes:
            if not n.alive:
                continue
            with n.conn() as r:
                for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        port = int(primary[1])
                        return next(x for x in self.nodes if x.port == port)
        raise RuntimeError(f"no live node knows who serves slot {slot}")

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        for i in range(self.masters * (1 + self.replicas)):
            self.nodes.append(self._launch("master" if i < self.masters else "replica"))
        for n in self.nodes:
            with n.conn() as r:
                n.node_id = r.execute_command("CLUSTER", "MYID").decode()
        masters = self.master_nodes
        for i, m in enumerate(masters):
            first, last = i * SLOTS // self.masters, (i + 1) * SLOTS // self.masters - 1
            m.slots = (first, last)
            with m.conn() as r:
                r.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
                # Distinct epochs up front, as redis-cli does: no epoch
                # collision round before the slot map settles.
                r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        seed = self.nodes[0]
        for n in self.nodes[1:]:
            with n.conn() as r:
                r.execute_command("CLUSTER", "MEET", "127.0.0.1", seed.port, seed.bus_port)
        self._wait(lambda: all(self._known(n) == len(self.nodes) for n in self.nodes), "all nodes to meet")
        for j, n in enumerate(self.nodes[self.masters :]):
            master = masters[j % self.masters]
            n.master_of = master
            with n.conn() as r:
                r.execute_command("CLUSTER", "REPLICATE", master.node_id)
        self._wait(self.healthy, "cluster_state:ok with replicas in sync")

    def _launch(self, role: str) -> ClusterNode:
        """Start one node on fresh free ports, retrying when a port was taken meanwhile.

        Between ``free_port()`` and redis-server's bind another process (other
        test runs start servers too) can grab either port: pick new ones.
        """
        for attempt in range(5):
            if server_version() >= (7, 0):
                port, bus = None, free_port()
                bus_args: tuple[str, ...] = ("--cluster-port", str(bus))
            else:  # no cluster-port before 7.0: the bus is always the port + 10000
                port = free_port_pair(10000)
                bus, bus_args = port + 10000, ()
            server = RedisServer(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                *bus_args,
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                # Let a replica take over however long it was disconnected:
                # the tests kill masters on purpose.
                "--cluster-replica-validity-factor",
                "0",
                # A replica's first full sync starts at once instead of after
                # the default 5 s diskless-sync delay.
                "--repl-diskless-sync-delay",
                "0",
                *(("--tls-cluster", "yes", "--tls-replication", "yes") if self.tls else ()),
                *self.extra,
                port=port,
                tls=self.tls,
            )
            try:
                server.start()
            except RuntimeError:
                server.__exit__(None, None, None)
                if attempt == 4:
                    raise
                continue
            return ClusterNode(server=server, bus_port=bus, role=role)
        raise AssertionError("unreachable")

    def _known(self, node: ClusterNode) -> int:
        with node.conn() as r:
            raw = r.execute_command("CLUSTER", "NODES").decode()
        return sum(1 for line in raw.splitlines() if line.strip() and "handshake" not in line)

    def healthy(self) -> bool:
        """Every live node: state ok, same full slot map; every live replica's link up."""
        maps = set()
        for n in self.nodes:
            if not n.alive:
                continue
            if n.cluster_info().get("cluster_state") != "ok":
                return False
            with n.conn() as r:
                slots = r.execute_command("CLUSTER", "SLOTS")
            maps.add(tuple(sorted((int(s), int(e), int(p[1])) for s, e, p, *_ in slots)))
            repl = n.info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        if len(maps) != 1:
            return False
        (only,) = maps
        return sum(e - s + 1 for s, e, _ in only) == SLOTS

    def _wait(self, check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except (redis.RedisError, OSError):
                pass  # a node still starting or just killed: ask again
            if time.monotonic() > deadline:
                raise RuntimeError(f"local cluster: timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL one node (no shutdown save, no goodbye on the cluster bus)."""
        node.server.kill()

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again (same port, same nodes.conf) and wait until all is healthy.

        A master that lost its slots to a failover rejoins as a replica of the
        node that replaced it, as it would under an orchestrator.
        """
        node.server.start()
        self._wait(self.healthy, f"{node.port} to rejoin and sync")

    def wait_for_failover(self, dead: ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Wait until a replica of ``dead`` serves its slots; return that new master."""
        assert dead.slots is not None, "only a master that owned slots can fail over"
        first = dead.slots[0]
        self._wait(
            lambda: (
                self.owner_of_slot(first) is not dead
                and all(n.cluster_info().get("cluster_state") == "ok" for n in self.nodes if n.alive)
            ),
            f"a replica to take over the slots of {dead.port}",
            timeout,
        )
        new = self.owner_of_slot(first)
        new.role, dead.role = "master", "replica"
        new.slots, dead.slots = dead.slots, None
        return new

    def stop(self) -> None:
        for n in self.nodes:
            n.server.__exit__(None, None, None)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ClusterNode", "LocalCluster", "SLOTS"]
