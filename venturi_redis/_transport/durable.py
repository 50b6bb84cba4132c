"""Durable mode: each transition returns only once replicas acknowledged it.

Redis replicates asynchronously. A master that acknowledged a write and dies
before its replica received it loses that write when the replica is promoted:
an enqueue the producer saw succeed vanishes, a completion rolls back to
running (and the job runs again once its lease expires). ``docs/cluster.md``
reports how much the failover test lost that way.

``Client(..., durable=vr.Durability(replicas=1))`` sends every transition
script together with ``WAIT replicas timeout`` (or, with ``aof=True``,
``WAITAOF 1 replicas timeout``, Redis 7.2+) on the *same connection* to the
*same node*: WAIT only counts the writes of the connection it runs on, so a
WAIT sent anywhere else would return at once and prove nothing.

The guarantee: when a script call returns, its writes are in the memory of at
least ``replicas`` replicas (with ``aof=True``: fsynced to the master's and
those replicas' append-only files). A failover to one of those replicas keeps
them. When fewer replicas acknowledge within ``timeout``, the call raises
``NotDurableError``; the write *is* applied on the master and may or may not
survive a failover. It subclasses ``redis.exceptions.TimeoutError``, so the
worker treats it like any transient error (a commit is retried and then
refused as already applied, a claim's jobs come back after their lease), and a
producer may retry the enqueue (a dedup key makes the retry idempotent).

What it does not cover: dedup merges made under WATCH/MULTI (a merge is not
followed by WAIT: a failover right after it can undo the merge, leaving the
older pending job), and reads. WAIT is not consensus: a replica that
acknowledged can still lose the election to one that did not (Redis prefers the
replica with the largest replication offset, which normally is one that
acknowledged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import AskError, MovedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._model.errors import ConfigurationError, VenturiError
from .cluster import is_cluster

_REDIRECT_RETRIES = 3


class NotDurableError(VenturiError, RedisTimeoutError):
    """Fewer replicas than required acknowledged a transition in time (it is applied on the master)."""


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must acknowledge each transition (``Client(durable=...)``).

    Args:
        replicas: Replicas that must acknowledge (``WAIT replicas``), >= 1.
        timeout: Seconds to wait for them before ``NotDurableError``.
        aof: Also require the write to be fsynced to the append-only file of
            the master and of ``replicas`` replicas (``WAITAOF``, Redis 7.2+,
            with ``appendonly yes``).
    """

    replicas: int = 1
    timeout: float = 1.0
    aof: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigurationError(f"Durability.replicas must be >= 1, got {self.replicas}")
        if not self.timeout > 0:
            raise ConfigurationError(f"Durability.timeout must be > 0 seconds, got {self.timeout!r}")

    def _command(self) -> tuple[Any, ...]:
        ms = max(1, int(self.timeout * 1000))
        if self.aof:
            return ("WAITAOF", 1, self.replicas, ms)
        return ("WAIT", self.replicas, ms)

    def _check(self, reply: Any, what: str) -> None:
        """Raise unless ``reply`` (of WAIT / WAITAOF) meets the requirement."""
        if self.aof:
            local, replicas = (int(x) for x in reply)
            if local < 1 or replicas < self.replicas:
                raise NotDurableError(
                    f"{what}: applied on the master, but fsynced locally {local}/1 and by "
                    f"{replicas}/{self.replicas} replicas within {self.timeout}s; it may be lost "
                    "in a failover (check the replicas' links and appendonly)"
                )
            return
        if int(reply) < self.replicas:
            raise NotDurableError(
                f"{what}: applied on the master, but acknowledged by {int(reply)}/{self.replicas} "
                f"replicas within {self.timeout}s; it may be lost in a failover "
                "(check INFO replication on the master)"
            )


def as_durability(value: Durability | int | None) -> Durability | None:
    """``durable=`` of ``Client``: a Durability, a replica count, or None."""
    if value is None or value is False:
        return None
    if isinstance(value, Durability):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Durability(replicas=value)
    if value is True:
        return Durability()
    raise ConfigurationError(f"durable must be a vr.Durability, a replica count or None, got {value!r}")


class DurableRedis:
    """Wraps a Redis (or RedisCluster) client: every EVALSHA / EVAL is followed by WAIT.

    Everything but ``evalsha`` and ``eval`` is the wrapped client's own (attribute access is
    forwarded), so the rest of the package is unaware of it.
    """

    def __init__(self, inner: Any, durability: Durability) -> None:
        if type(inner).__module__.startswith("fakeredis"):
            raise ConfigurationError(
                "durable mode needs a real Redis with replicas; memory:// has no replicas and no WAIT"
            )
        self.venturi_inner = inner
        self.durability = durability

    def __getattr__(self, name: str) -> Any:
        return getattr(self.venturi_inner, name)

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """EVALSHA, then WAIT on the same connection."""
        return await self._with_wait("EVALSHA", sha, numkeys, *keys_and_args)

    async def eval(self, source: str, numkeys: int, *keys_and_args: Any) -> Any:
        """EVAL (the NOSCRIPT fallback of ``Sender.call``), then WAIT on the same connection."""
        return await self._with_wait("EVAL", source, numkeys, *keys_and_args)

    async def _with_wait(self, command: str, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        inner, d = self.venturi_inner, self.durability
        label = script[:10] if command == "EVALSHA" else "(source)"
        what = f"script {label} on {keys_and_args[0] if numkeys else 'no key'}"
        if not is_cluster(inner):
            # One non-transactional pipeline = one connection: WAIT counts the
            # script's writes.
            pipe = inner.pipeline(transaction=False)
            pipe.execute_command(command, script, numkeys, *keys_and_args)
            pipe.execute_command(*d._command())
            res, acked = await pipe.execute(raise_on_error=False)
            return self._finish(res, acked, what)
        await inner.initialize()
        for _ in range(_REDIRECT_RETRIES):
            # Both commands pinned to the node owning the key's slot, so the
            # cluster pipeline sends them on one connection, in order. Without
            # redirections: a MOVED script did not run, and WAIT must never be
            # counted on a node that did not run it, so we refresh and resend both.
            node = inner.get_node_from_key(keys_and_args[0])
            pipe = inner.pipeline(transaction=False)
            pipe.execute_command(command, script, numkeys, *keys_and_args, target_nodes=node)
            pipe.execute_command(*d._command(), target_nodes=node)
            res, acked = await pipe.execute(raise_on_error=False, allow_redirections=False)
            if isinstance(res, (MovedError, AskError)):
                await inner.nodes_manager.initialize()
                continue
            return self._finish(res, acked, what)
        raise NotDurableError(f"{what}: the slot kept moving; nothing was applied, retry")

    def _finish(self, res: Any, acked: Any, what: str) -> Any:
        if isinstance(res, Exception):
            raise res  # NOSCRIPT included: Sender.call sends the source by EVAL
        if isinstance(acked, ResponseError):
            # The script ran; only the wait is impossible (an old server, or
            # appendonly off): a configuration problem, said plainly.
            cmd = self.durability._command()[0]
            raise ConfigurationError(
                f"{what}: applied, but {cmd} failed ({acked}); WAITAOF needs Redis 7.2+ with "
                "appendonly yes, WAIT needs a real Redis: fix the server or use Durability(aof=False)"
            ) from acked
        if isinstance(acked, Exception):
            raise acked
        self.durability._check(acked, what)
        return res


__all__ = ["Durability", "DurableRedis", "NotDurableError", "as_durability"]
