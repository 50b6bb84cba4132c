"""Reading many queues at once: stats and registered workers, many queues per round trip.

``venturi stats`` and ``venturi workers`` without ``-q`` read every queue of
the registry. They read each queue on its own before (the clock, a MULTI, the
workers' names, their records: four round trips a queue): 20,000 round trips
for 5,000 tenant queues (benchmarks/many_queues.py). Here the same reads go
out ``PER_TRIP`` queues to a pipeline, after one read of the clock:

- ``stats_of``: each queue's ``stats_commands`` (the reads of ``queue.stats()``),
  in one MULTI per pipeline on a single Redis, so a queue's numbers agree as
  they did (on Redis Cluster a plain pipeline, as ``queue.stats()`` there);
- ``workers_of``: each queue's registered names (``ZRANGE``), then, per
  queue, how many of their records still exist (one ``EXISTS`` of them all):
  the ``workers`` column of ``venturi stats``;
- ``registered_workers``: every worker registered on any of the queues, one
  record each (a worker on 1,000 queues has a record on each: one ``GET`` of
  the first that exists, not 1,000).

A queue whose keys cannot be read (a key of the wrong type, written by hand)
comes back as its error, and the others are read all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._model.records import WorkerInfo
from .._store.keys import QueueKeys
from .base import _text, server_now_ms
from .reads import STATS_COMMANDS, QueueStats, _atomic_pipeline, stats_commands, stats_from

if TYPE_CHECKING:
    from .client import Client

# Queues read in one pipeline: 27 commands each for stats (1,350 a pipeline).
PER_TRIP = 50


def _chunks(names: Sequence[str]) -> list[Sequence[str]]:
    return [names[i : i + PER_TRIP] for i in range(0, len(names), PER_TRIP)]


async def stats_of(
    client: Client, names: Sequence[str]
) -> tuple[dict[str, QueueStats], dict[str, Exception]]:
    """The stats of each of ``names`` (``queue.stats()``'s, read at one clock), and the error
    of each queue that could not be read."""
    out: dict[str, QueueStats] = {}
    broken: dict[str, Exception] = {}
    if not names:
        return out, broken
    now = await server_now_ms(client)
    for chunk in _chunks(names):
        pipe = _atomic_pipeline(client)
        queues = [client.queue(n) for n in chunk]
        for q in queues:
            stats_commands(pipe, q, now)
        replies = await pipe.execute(raise_on_error=False)
        for i, q in enumerate(queues):
            mine = replies[i * STATS_COMMANDS : (i + 1) * STATS_COMMANDS]
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is not None:
                broken[q.name] = error
            else:
                out[q.name] = stats_from(q, now, mine)
    return out, broken


async def _names(client: Client, names: Sequence[str]) -> dict[str, list[str]]:
    """The worker names each queue's ``workers`` zset holds (a damaged one: none)."""
    out: dict[str, list[str]] = {}
    for chunk in _chunks(names):
        pipe = client.redis.pipeline(transaction=False)
        for n in chunk:
            pipe.zrange(QueueKeys.for_queue(n, client.namespace).workers, 0, -1)
        for n, got in zip(chunk, await pipe.execute(raise_on_error=False), strict=True):
            out[n] = [] if isinstance(got, Exception) else [_text(w) for w in got]
    return out


async def workers_of(client: Client, names: Sequence[str]) -> dict[str, set[str]]:
    """The workers registered (and not expired) on each of ``names``, by name."""
    listed = await _names(client, names)
    out: dict[str, set[str]] = {n: set() for n in names}
    asked = [(q, w) for q in names for w in listed[q]]
    for i in range(0, len(asked), PER_TRIP * 20):
        part = asked[i : i + PER_TRIP * 20]
        pipe = client.redis.pipeline(transaction=False)
        for q, w in part:
            pipe.exists(QueueKeys.for_queue(q, client.namespace).worker(w))
        for (q, w), alive in zip(part, await pipe.execute(raise_on_error=False), strict=True):
            if alive == 1:
                out[q].add(w)
    return out


async def registered_workers(client: Client, names: Sequence[str]) -> list[WorkerInfo]:
    """Every worker registered on any of ``names``: its record read once, from the first queue
    that has it (a name whose record expired everywhere is not listed), by name."""
    listed = await _names(client, names)
    where: dict[str, list[str]] = {}
    for q in names:
        for w in listed[q]:
            where.setdefault(w, []).append(q)
    found: dict[str, WorkerInfo] = {}
    # Two rounds at most: each name's first queue, then every other queue of the names
    # whose record was gone there (a worker that stopped between its beats).
    first = [(w, qs[0]) for w, qs in where.items()]
    await _read_records(client, first, found)
    rest = [(w, q) for w, qs in where.items() if w not in found for q in qs[1:]]
    await _read_records(client, rest, found)
    return sorted(found.values(), key=lambda w: w.name)


async def _read_records(client: Client, asked: list[tuple[str, str]], found: dict[str, WorkerInfo]) -> None:
    """Read the record of each ``(worker, queue)`` into ``found`` (the first one read of a worker wins)."""
    for i in range(0, len(asked), PER_TRIP * 20):
        part = asked[i : i + PER_TRIP * 20]
        pipe = client.redis.pipeline(transaction=False)
        for w, q in part:
            pipe.get(QueueKeys.for_queue(q, client.namespace).worker(w))
        for (w, _), raw in zip(part, await pipe.execute(raise_on_error=False), strict=True):
            info = None if raw is None or isinstance(raw, Exception) else WorkerInfo.from_json(raw)
            if info is not None and w not in found:
                found[w] = info
