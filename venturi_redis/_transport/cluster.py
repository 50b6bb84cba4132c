"""Redis Cluster support: cluster URLs and the cluster-only code paths.

Every key of a queue carries the hash tag ``{queue}``, so a queue lives in one
slot, on one master: every Lua transition and every WATCH/MULTI touches that
one slot and Redis Cluster routes it like any single-key command. Nothing in
the scripts knows it runs on a cluster.

What does differ is handled here or at the call site, each with a comment:

* connecting (``redis+cluster://`` URLs, ``cluster=True``);
* the first command of a fresh client (``_cluster_class`` below);
* pipelines of scripts (``Sender.pipeline``, ``_store/sender.py``): redis-py refuses
  ``pipe.evalsha`` in cluster pipelines but not ``execute_command("EVALSHA",
  ...)``, which routes each call by its first key; the cluster pipeline groups
  the calls by node (one connection each, concurrently) and returns NOSCRIPT
  replies in place, which are then redone singly;
* NOSCRIPT after a failover: the fallback EVAL runs on the node owning the
  key, whichever node that is now;
* WATCH/MULTI (dedup merges): redis-py 8's cluster pipeline supports
  ``transaction=True`` with WATCH when every key is in one slot, which the
  hash tag guarantees; it pins the connection to the slot's master;
* wake-ups: scripts push tokens onto the queue's wake list (same slot); an
  idle worker's ``BLPOP`` goes through the cluster client to the queue's
  master, and its claim follows (on a single Redis the claim is pipelined
  behind the BLPOP on a connection of its own, which a cluster client does
  not offer).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from .._model.errors import ConfigurationError
from .redispy import cluster_uninitialized, is_cut_connection, release

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# The oldest redis-py whose async cluster client the package runs on. Below
# it (found by running the suite; docs/operations.md, "Supported redis-py"):
# 8.0 and 8.1 resend a cluster transaction whose EXEC reply was lost, so a
# dedup merge could apply twice; 6.2 to 7.4 fail reading a job's journal in
# a transaction and have no pub/sub on the cluster client (offload results);
# before 6.2 the async cluster client has no transactions at all. None of
# that can be worked around from outside, so a cluster client is refused.
CLUSTER_FLOOR = (8, 2)


def require_cluster_support() -> None:
    """Refuse Redis Cluster on a redis-py below ``CLUSTER_FLOOR``, before anything is sent.

    Raises:
        ConfigurationError: The installed redis-py is older than the floor.
    """
    installed = release()
    if installed[:2] < CLUSTER_FLOOR:
        need = ".".join(map(str, CLUSTER_FLOOR))
        raise ConfigurationError(
            f"Redis Cluster needs redis-py {need} or later; this process has redis-py "
            f"{'.'.join(map(str, installed))}, whose async cluster client can apply a dedup merge "
            f"twice or fail mid-transaction: pip install 'redis[hiredis]>={need},<9' "
            '(docs/operations.md, "Supported redis-py"); a single Redis and Sentinel work on it as is.'
        )


def is_cluster(redis: Any) -> bool:
    """Whether ``redis`` is a ``redis.asyncio.cluster.RedisCluster`` client."""
    from redis.asyncio.cluster import RedisCluster

    # Durable mode wraps the client (``_durable.DurableRedis``): look inside.
    return isinstance(getattr(redis, "venturi_inner", redis), RedisCluster)


def split_cluster_url(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``redis+cluster://[user:pass@]h1:p1,h2:p2[?opts]`` -> (first seed's redis:// URL, all seeds).

    Several comma-separated seeds let a client start while one seed is down;
    the client learns the rest of the cluster from whichever seed answers.
    ``redis://`` (or ``rediss://``) with ``cluster=True`` is the one-seed form.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(f"cluster URL {url!r} has no scheme: use redis+cluster://host:port")
    scheme = scheme.lower()
    base = scheme.removesuffix("+cluster")
    if base not in ("redis", "rediss"):
        raise ConfigurationError(
            f"cluster URL {url!r}: Redis Cluster needs redis+cluster:// or rediss+cluster:// (TCP)"
        )
    # The query first: its values may hold slashes (ssl_ca_certs=/etc/ssl/ca.pem).
    body, qmark, query = rest.partition("?")
    netloc, _, path = body.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for part in hosts.split(","):
        parsed = urlsplit(f"//{part}")
        if not parsed.hostname:
            raise ConfigurationError(f"cluster URL {url!r}: empty seed address in {hosts!r}")
        try:
            port = parsed.port or 6379
        except ValueError:
            raise ConfigurationError(f"cluster URL {url!r}: bad port in seed {part!r}") from None
        seeds.append((unquote(parsed.hostname), port))
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"cluster URL {url!r} selects database {path.strip('/')!r}: Redis Cluster has only database 0"
        )
    first = hosts.split(",", 1)[0]
    single = f"{base}://{userinfo}{at}{first}/{path}{qmark}{query}"
    return single, seeds


def cluster_redis(url: str, max_connections: int | None = None) -> Any:
    """A ``RedisCluster`` (``decode_responses=False``) for a cluster URL.

    ``max_connections``: redis-py's own bound per node (the URL's
    ``?max_connections=`` wins); a call past it fails with "Too many
    connections" (docs/deployment.md, "Connections each part holds").

    Raises:
        ConfigurationError: A malformed URL, or a redis-py below ``CLUSTER_FLOOR``.
    """
    from redis.asyncio.cluster import ClusterNode

    single, seeds = split_cluster_url(url)
    require_cluster_support()
    bound = {} if max_connections is None else {"max_connections": max_connections}
    return _cluster_class().from_url(
        single,
        **bound,
        startup_nodes=[ClusterNode(host, port) for host, port in seeds[1:]],
        decode_responses=False,
        # On MOVED, redis-py's default (5) closes the whole client every 5th
        # redirection to rebuild it, cutting every other coroutine's command in
        # flight. 0: follow each MOVED by updating that slot only (a failover
        # moves slots this way); connection errors still refresh the whole map,
        # lazily, without cutting live connections.
        reinitialize_steps=0,
    )


_CLASS: Any = None


def _cluster_class() -> Any:
    """``RedisCluster`` that learns the slot map before routing its first command.

    redis-py 8.1's async ``RedisCluster.execute_command`` decides how to route a
    command *before* it initializes: on a fresh client (no default node yet) it
    treats even a keyed EVALSHA as keyless and sends it to an arbitrary node.
    Sequentially that costs one MOVED; with many coroutines starting at once
    (20 producers, a worker's claim loops) the MOVEDs pile up, and every 5th one
    makes the client ``aclose()`` and rebuild itself, cutting the connections
    other coroutines are using mid-command (``AttributeError: 'NoneType' object
    has no attribute 'writelines'``). Initializing first (once; later calls are a
    flag check) routes every command by its key from the start.

    The client still ``aclose()``s itself on CLUSTERDOWN (a master failed and no
    replica has taken over yet); a command or a pipeline whose connection that
    cuts fails with an ``AttributeError`` deep in redis-py. It is reported as
    the ``redis.exceptions.ConnectionError`` it is, which callers (workers, the
    failover test's producers) already treat as transient: like any connection
    error, the script may or may not have run. Pipelines need it as much as
    single commands: a worker's completer has two in flight at once.
    """
    global _CLASS
    if _CLASS is None:
        from redis.asyncio.cluster import ClusterPipeline, RedisCluster
        from redis.exceptions import ConnectionError as RedisConnectionError

        def cut(what: str, exc: AttributeError) -> RedisConnectionError:
            return RedisConnectionError(
                f"{what}: its connection was closed under it by the cluster client "
                f"resetting itself after a topology change ({exc}); retry"
            )

        class _Pipeline(ClusterPipeline):
            async def execute(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await super().execute(*args, **kwargs)
                except AttributeError as exc:
                    if not is_cut_connection(exc):
                        raise
                    raise cut("a pipeline", exc) from exc

        class _InitializedCluster(RedisCluster):
            async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
                if cluster_uninitialized(self):
                    await self.initialize()
                try:
                    return await super().execute_command(*args, **kwargs)
                except AttributeError as exc:
                    if not is_cut_connection(exc):
                        raise
                    raise cut(repr(args[0]), exc) from exc

            def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
                if shard_hint:
                    return super().pipeline(transaction, shard_hint)  # raises, as redis-py does
                return _Pipeline(self, transaction)  # type: ignore[abstract]

        _CLASS = _InitializedCluster
    return _CLASS


__all__ = [
    "CLUSTER_FLOOR",
    "CLUSTER_SCHEMES",
    "cluster_redis",
    "is_cluster",
    "require_cluster_support",
    "split_cluster_url",
]
