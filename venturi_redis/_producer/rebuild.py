"""``venturi queues rebuild``: the registry of queues refilled by walking the keyspace, on purpose.

The package's one ``SCAN`` (tests/test_registry.py checks that nothing else
calls ``SCAN`` or ``KEYS``). Run it once after upgrading from a version that
had no registry, or after the registry key was lost (deleted by hand, or
writes lost in a failover): every queue that has any key is recorded again.
Queues written since the registry exists need nothing (registry.py).

Bounded: each step is one ``SCAN cursor MATCH venturi:{*}:* COUNT n`` (the
server examines about ``n`` keys and answers with ours only), then the names
it found that this run had not recorded yet, in one ``ZADD``. ``max_calls``
stops a run after that many steps, ``pause`` waits between steps, so an
operator chooses what a run may cost a production server.

Resumable: after every step the cursor (one per node) is saved in
``venturi:queues:rebuild`` (``keys.rebuild_key``), so a run that stops (its
``max_calls``, Ctrl-C, a lost connection) continues from there when run
again; the walk's end deletes the key. SCAN guarantees every key present for
the whole walk is returned at least once, across runs too (the cursor is all
the state it needs); a queue created meanwhile records itself.

On Redis Cluster, SCAN walks one node: each master is walked with its own
cursor (saved by node name). A run that finds other masters than the saved
walk had (a resharding, a failover) starts the walk over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._model.errors import ConfigurationError
from .._store.keys import queue_keys_match, queue_of_key, rebuild_key, registry_key
from .._transport.cluster import is_cluster
from .base import _text

if TYPE_CHECKING:
    from .base import ClientLike

DEFAULT_COUNT = 1000


@dataclass(slots=True)
class Walk:
    """Where a rebuild is: what it examined, of how many keys, and what it recorded."""

    total: int  # keys in the database (summed over the masters) when this run started
    examined: int = 0  # keys the server examined so far, this walk (resumed runs included): ~ calls x count
    recorded: int = 0  # queue names this run recorded
    calls: int = 0  # SCAN calls this run
    done: bool = False  # the walk reached its end (every node's cursor came back to 0)
    resumed: bool = False  # this run continued a walk an earlier run had started


def _nodes(redis: Any) -> list[tuple[str, Any]]:
    """The nodes to walk, each ``(name, target)``: every master of a cluster, else the server."""
    if is_cluster(redis):
        return [(node.name, node) for node in redis.get_primaries()]
    return [("server", None)]


async def _scan(redis: Any, target: Any, cursor: int, count: int, match: str) -> tuple[int, list[Any]]:
    if target is None:
        nxt, keys = await redis.scan(cursor=cursor, match=match, count=count)
        return int(nxt), list(keys)
    cursors, keys = await redis.scan(cursor=cursor, match=match, count=count, target_nodes=target)
    return int(cursors[target.name]), list(keys)


async def _size(redis: Any, target: Any) -> int:
    if target is None:
        return int(await redis.dbsize())
    return int(await redis.execute_command("DBSIZE", target_nodes=target))


async def _load(client: ClientLike, names: list[str]) -> dict[str, Any] | None:
    """The saved walk, if it was over exactly these nodes."""
    raw = await client.redis.get(rebuild_key(client.namespace))
    if raw is None:
        return None
    try:
        state = json.loads(_text(raw))
        if sorted(state["nodes"]) == sorted(names):
            return dict(state)
    except (ValueError, KeyError, TypeError):
        pass  # not ours, or from another layout: start over
    return None


async def rebuild(
    client: ClientLike,
    *,
    count: int = DEFAULT_COUNT,
    max_calls: int | None = None,
    pause: float = 0.0,
    restart: bool = False,
    on_step: Callable[[Walk], None] | None = None,
) -> Walk:
    """Walk the keyspace (or go on walking it) and record every queue found in the registry.

    Args:
        count: SCAN's COUNT: about how many keys the server examines per call.
        max_calls: Stop after this many SCAN calls (the walk resumes at the next run).
        pause: Seconds to wait between two calls.
        restart: Forget a saved walk and start from the beginning.
        on_step: Called after every step with the walk so far (a progress bar).
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigurationError(f"count must be a whole number >= 1, got {count!r}")
    if max_calls is not None and max_calls < 1:
        raise ConfigurationError(f"max_calls must be a whole number >= 1, got {max_calls!r}")
    redis, namespace = client.redis, client.namespace
    nodes = _nodes(redis)
    names = [n for n, _ in nodes]
    state_key = rebuild_key(namespace)
    if restart:
        await redis.delete(state_key)
    state = await _load(client, names)
    walk = Walk(total=sum([await _size(redis, target) for _, target in nodes]), resumed=state is not None)
    if state is None:
        state = {"nodes": {n: {"cursor": 0, "done": False} for n in names}, "examined": 0, "at": 0}
    walk.examined = int(state.get("examined", 0))
    match = queue_keys_match(namespace)
    seen: set[str] = set()
    for name, target in nodes:
        node = state["nodes"][name]
        while not node["done"]:
            if max_calls is not None and walk.calls >= max_calls:
                return walk
            if walk.calls and pause > 0:
                await anyio.sleep(pause)
            cursor, keys = await _scan(redis, target, int(node["cursor"]), count, match)
            walk.calls += 1
            found = {q for q in (queue_of_key(_text(k), namespace) for k in keys) if q is not None} - seen
            if found:
                # Recorded before the cursor moves on: a run stopped between the
                # two repeats a step, never skips one.
                now_ms = int(time.time() * 1000)
                await redis.zadd(registry_key(namespace), dict.fromkeys(found, now_ms), gt=True)
                seen |= found
                walk.recorded += len(found)
            node["cursor"], node["done"] = cursor, cursor == 0
            walk.examined += count  # about: SCAN's COUNT is a hint, not an exact number
            state["examined"], state["at"] = walk.examined, int(time.time() * 1000)
            await redis.set(state_key, json.dumps(state))
            if on_step is not None:
                on_step(walk)
    await redis.delete(state_key)
    walk.done = True
    if on_step is not None:
        on_step(walk)
    return walk
