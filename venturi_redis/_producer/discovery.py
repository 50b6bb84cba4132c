"""Finding queues and jobs from the registry of queues, never by walking the keyspace.

The registry (``registry.py`` writes it) is one sorted set of queue names, so
listing the queues costs one ``ZRANGE`` and one ``EXISTS`` per registered
queue, pipelined: O(queues), whatever else shares the database. Finding the
queue of a job probes each registered queue for the job's hash, in one
pipeline: O(queues) again. The CLI (``venturi stats``, ``job show`` without
``-q``, its hints) and the dashboard's overview read through here.

A queue written before the registry existed is not in it until
``venturi queues rebuild`` (``rebuild.py``, the package's one SCAN) finds it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._model.errors import ConfigurationError
from .._store.keys import QueueKeys, is_queue_name, registry_key
from .base import _text
from .registry import PRUNE_AFTER_MS

if TYPE_CHECKING:
    from .base import ClientLike

log = logging.getLogger("venturi_redis.registry")

_JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")
# A listing prunes at most this many names (one WATCH transaction each), so a
# registry full of dead names is cleaned over several listings, each short.
_PRUNE_PER_LISTING = 50


async def registered(client: ClientLike) -> dict[str, float]:
    """Every name in the registry, with when it was last recorded (ms): one ``ZRANGE``.

    A member that is no queue name (written by hand) is left out.
    """
    raw = await client.redis.zrange(registry_key(client.namespace), 0, -1, withscores=True)
    out: dict[str, float] = {}
    for member, score in raw:
        name = _text(member)
        if is_queue_name(name):
            out[name] = float(score)
    return out


async def _present(client: ClientLike, names: list[str]) -> list[bool]:
    """Whether each queue has any of its keys (``QueueKeys.presence``): one EXISTS each, pipelined."""
    if not names:
        return []
    pipe = client.redis.pipeline(transaction=False)
    for name in names:
        pipe.exists(*QueueKeys.for_queue(name, client.namespace).presence)
    return [int(n) > 0 for n in await pipe.execute()]


async def discover_queues(client: ClientLike) -> list[str]:
    """The registered queues that exist now, sorted (what ``venturi stats`` lists).

    A registered queue none of whose keys exist (purged, expired, never
    written after all) is not listed; once nobody has recorded it for
    ``registry.PRUNE_AFTER_MS`` it is also removed from the registry
    (``prune``).
    """
    entries = await registered(client)
    names = sorted(entries)
    alive = await _present(client, names)
    horizon = time.time() * 1000 - PRUNE_AFTER_MS
    stale = [(n, entries[n]) for n, ok in zip(names, alive, strict=True) if not ok and entries[n] < horizon]
    if stale:
        await prune(client, stale[:_PRUNE_PER_LISTING])
    return [n for n, ok in zip(names, alive, strict=True) if ok]


async def prune(client: ClientLike, stale: list[tuple[str, float]]) -> int:
    """Remove each ``(name, recorded_at)`` from the registry if nobody recorded it since and
    its queue still has no key; returns how many went.

    Each removal is a WATCH transaction on the registry: a process that
    records the name meanwhile (it is about to write the queue) makes the
    ``EXEC`` fail, so no name that is being written to is removed. A name
    recorded before the WATCH has a new time, and is kept. Best effort: a
    reader without the right to write (an ACL) lists the queues all the same.
    """
    key = registry_key(client.namespace)
    removed = 0
    for name, seen in stale:

        async def remove(pipe: Any, name: str = name, seen: float = seen) -> bool:
            score = await pipe.zscore(key, name)
            if score is None or float(score) != seen:
                return False  # recorded again (or gone) since it was read
            if int(await client.redis.exists(*QueueKeys.for_queue(name, client.namespace).presence)):
                return False  # written since it was read
            pipe.multi()
            pipe.zrem(key, name)
            return True

        try:
            removed += bool(await client.redis.transaction(remove, key, value_from_callable=True))
        except RedisError as exc:
            log.debug("registry: could not prune queue %r: %s", name, exc)
            break
    return removed


async def find_job_queue(client: ClientLike, job_id: str) -> str | None:
    """The queue holding job ``job_id``: one ``EXISTS`` of its hash per registered queue, pipelined."""
    if not _JOB_ID_RE.fullmatch(job_id):
        raise ConfigurationError(f"{job_id!r} is not a job id (a ULID such as 01J9ZQ4K8V3M0S5B2N7XWYQ1RT)")
    names = sorted(await registered(client))
    if not names:
        return None
    pipe = client.redis.pipeline(transaction=False)
    for name in names:
        pipe.exists(QueueKeys.for_queue(name, client.namespace).job(job_id))
    found = await pipe.execute()
    return next((n for n, hit in zip(names, found, strict=True) if int(hit)), None)


async def discover_schedule_queues(client: ClientLike) -> list[str]:
    """The registered queues with schedules (their ``schedules`` set), sorted."""
    names = sorted(await registered(client))
    if not names:
        return []
    pipe = client.redis.pipeline(transaction=False)
    for name in names:
        pipe.exists(QueueKeys.for_queue(name, client.namespace).schedules)
    return [n for n, hit in zip(names, await pipe.execute(), strict=True) if int(hit)]
