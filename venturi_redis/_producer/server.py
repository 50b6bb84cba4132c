"""The server check a worker makes before it starts: version, eviction policy."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .._model.errors import ConfigurationError
from .reads import _text

if TYPE_CHECKING:
    from .base import ClientLike

MIN_REDIS_VERSION = (6, 2, 0)


def _is_embedded(client: ClientLike) -> bool:
    return client.url.startswith("memory://") or type(client.redis).__module__.startswith("fakeredis")


def _per_node(reply: Any) -> list[dict[Any, Any]]:
    """INFO / CONFIG GET replies: one dict, or (Redis Cluster) one dict per node."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return list(reply.values())
    return [reply] if isinstance(reply, dict) else []


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        parts.append(int(digits.group()) if digits else 0)
    return tuple(parts)


async def check_server(client: ClientLike, *, eviction_policy: bool = True) -> None:
    """Refuse (ConfigurationError) a Redis too old for the scripts, or one that may evict jobs.

    The embedded ``memory://`` server always passes (it never evicts).
    ``eviction_policy=False`` skips the ``maxmemory-policy`` check (for a
    server whose CONFIG command is disabled, after checking the policy yourself).
    """
    from redis.exceptions import ResponseError

    if _is_embedded(client):
        return
    where = client.url or "the Redis server"
    minimum = ".".join(map(str, MIN_REDIS_VERSION))
    for info in _per_node(await client.redis.info("server")):
        version = _text(info.get("redis_version"))
        if version and _version(version) < MIN_REDIS_VERSION:
            raise ConfigurationError(
                f"{where} runs Redis {version}; venturi_redis needs Redis {minimum} or newer "
                "(its Lua scripts use streams and effect replication): upgrade the server"
            )
    if not eviction_policy:
        return
    try:
        reply = await client.redis.config_get("maxmemory-policy")
    except ResponseError as exc:
        raise ConfigurationError(
            f"cannot read maxmemory-policy on {where} ({exc}); make sure it is noeviction, "
            "then start the worker with Worker(..., check_eviction_policy=False) "
            "(venturi worker --no-eviction-check)"
        ) from None
    for cfg in _per_node(reply):
        policy = next((_text(v) for k, v in cfg.items() if _text(k) == "maxmemory-policy"), "")
        if policy and policy != "noeviction":
            raise ConfigurationError(
                f"{where} has maxmemory-policy {policy}: under memory pressure Redis would "
                "silently delete jobs. Set it with CONFIG SET maxmemory-policy noeviction (and in "
                "redis.conf), or override with Worker(..., check_eviction_policy=False) "
                "(venturi worker --no-eviction-check)"
            )
