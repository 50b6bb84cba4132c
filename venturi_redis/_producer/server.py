"""The server check a worker makes before it starts: version, eviction policy.

Managed services (ElastiCache, MemoryDB, Azure Cache, Memorystore, Redis
Cloud, Upstash) disable ``CONFIG``, and an application's ACL user is often
``+@all -@dangerous``, which leaves out ``INFO`` and ``CONFIG`` both. The
check reads what it can (docs/deployment.md, "Managed Redis and ACL users"):

- the version from ``INFO server``, else from ``HELLO`` (a connection
  command every user may run), else not at all;
- ``maxmemory-policy`` from ``CONFIG GET``, else from ``INFO memory``
  (``maxmemory_policy``, which managed services leave readable), else not at
  all.

A check it cannot make is one WARNING naming what it could not read and
why it matters, and the worker starts; a server it can read and that is too
old or may evict is refused, as before.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from .._model.errors import ConfigurationError
from .._transport.urls import redact_url
from .base import _text

if TYPE_CHECKING:
    from .base import ClientLike

MIN_REDIS_VERSION = (6, 2, 0)
log = logging.getLogger("venturi_redis.worker")


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


def _field(reply: Any, name: str) -> str:
    """``name``'s value in a HELLO reply (RESP2: a flat list; RESP3: a map)."""
    if isinstance(reply, dict):
        return next((_text(v) for k, v in reply.items() if _text(k) == name), "")
    if isinstance(reply, (list, tuple)):
        for k, v in zip(reply[::2], reply[1::2], strict=False):
            if _text(k) == name:
                return _text(v)
    return ""


async def _versions(client: ClientLike) -> tuple[list[str], str]:
    """The servers' versions (one per node), and why none could be read ('' when read)."""
    from redis.exceptions import ResponseError

    try:
        return [_text(i.get("redis_version")) for i in _per_node(await client.redis.info("server"))], ""
    except ResponseError as exc:  # NoPermissionError too: INFO is @dangerous
        refused = f"INFO: {exc}"
    try:
        version = _field(await client.redis.execute_command("HELLO"), "version")
    except ResponseError as exc:
        return [], f"{refused}; HELLO: {exc}"
    return ([version] if version else []), "" if version else f"{refused}; HELLO gave no version"


async def _policies(client: ClientLike) -> tuple[list[str], str]:
    """Each node's ``maxmemory-policy``, and why none could be read ('' when read)."""
    from redis.exceptions import ResponseError

    try:
        reply = await client.redis.config_get("maxmemory-policy")
        return [
            next((_text(v) for k, v in cfg.items() if _text(k) == "maxmemory-policy"), "")
            for cfg in _per_node(reply)
        ], ""
    except ResponseError as exc:  # renamed away (managed services), or not granted
        refused = f"CONFIG GET: {exc}"
    try:
        reply = await client.redis.info("memory")
    except ResponseError as exc:
        return [], f"{refused}; INFO memory: {exc}"
    return [_text(info.get("maxmemory_policy")) for info in _per_node(reply)], ""


async def check_server(client: ClientLike, *, eviction_policy: bool = True) -> None:
    """Refuse (ConfigurationError) a Redis too old for the scripts, or one that may evict jobs.

    The embedded ``memory://`` server always passes (it never evicts).
    ``eviction_policy=False`` skips the ``maxmemory-policy`` check. What the
    server does not let this client read is logged (one WARNING), not refused.
    """
    if _is_embedded(client):
        return
    where = redact_url(client.url) if client.url else "the Redis server"
    minimum = ".".join(map(str, MIN_REDIS_VERSION))
    versions, refused = await _versions(client)
    if refused:
        log.warning(
            "cannot read the Redis version of %s (%s): make sure it is Redis %s or newer",
            where,
            refused,
            minimum,
        )
    for version in versions:
        if version and _version(version) < MIN_REDIS_VERSION:
            raise ConfigurationError(
                f"{where} runs Redis {version}; venturi_redis needs Redis {minimum} or newer "
                "(its Lua scripts use streams and effect replication): upgrade the server"
            )
    if not eviction_policy:
        return
    policies, refused = await _policies(client)
    if refused:
        log.warning(
            "cannot read maxmemory-policy of %s (%s): under memory pressure a server whose policy "
            "evicts keys would silently delete jobs; make sure it is noeviction (docs/deployment.md)",
            where,
            refused,
        )
        return
    for policy in policies:
        if policy and policy != "noeviction":
            raise ConfigurationError(
                f"{where} has maxmemory-policy {policy}: under memory pressure Redis would "
                "silently delete jobs. Set it with CONFIG SET maxmemory-policy noeviction (and in "
                "redis.conf; on a managed service, in its parameter group), or override with "
                "Worker(..., check_eviction_policy=False) (venturi worker --no-eviction-check)"
            )
