"""Limits declared in code: ``vr.Worker(..., limits=[vr.Limit(...)])`` (docs/flow-control.md).

Like ``schedules=``, the declarations are checked where they are given and
written when the worker starts: each on every queue the worker consumes (a
limit lives in its queue's ``limits`` hash, and a sharded queue's partitions
each enforce their own, as ``ShardedQueue.set_limit`` sets them). A limit
already stored as declared is not written again: setting one makes every
(kind, key) with waiting jobs ready again, which a fleet of identical pods
starting together need not do a hundred times. A stored limit no longer
declared is left alone (an operator may have set it: ``venturi limit``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._model.errors import ConfigurationError
from .._producer.client import Queue

if TYPE_CHECKING:
    from .._model.limits import Limit, LimitInfo


def declared_limits(limits: Sequence[Limit]) -> tuple[Limit, ...]:
    """The worker's ``limits`` argument, checked: a list of ``vr.Limit``, one per kind and scope."""
    if not limits and isinstance(limits, Sequence):
        return ()  # the usual worker declares none: vr.Limit's module stays unimported (issue 42)
    from .._model.limits import Limit

    if isinstance(limits, Limit) or not all(isinstance(x, Limit) for x in limits):
        raise ConfigurationError(f"limits must be a list of vr.Limit, got {limits!r}")
    seen: set[tuple[str, bool]] = set()
    for x in limits:
        if (x.kind, x.per_key) in seen:
            scope = "per-key" if x.per_key else "kind-wide"
            raise ConfigurationError(f"the {scope} limit of {x.kind!r} is declared twice")
        seen.add((x.kind, x.per_key))
    return tuple(limits)


def _same(stored: LimitInfo, limit: Limit) -> bool:
    return stored.concurrency == limit.concurrency and (
        (stored.rate is None and limit.rate is None)
        or (
            stored.rate is not None
            and limit.rate is not None
            and (stored.rate.count, stored.rate.per_ms()) == (limit.rate.count, limit.rate.per_ms())
        )
    )


async def declare_limits(limits: Sequence[Limit], queues: Sequence[Queue]) -> None:
    """Set the declared limits on each of ``queues`` (a worker's start), skipping those stored as declared."""
    if not limits:
        return
    for queue in queues:
        stored = {(x.kind, x.per_key): x for x in await queue.limits(keys=0)}
        for limit in limits:
            current = stored.get((limit.kind, limit.per_key))
            if current is None or not _same(current, limit):
                await queue.set_limit(
                    limit.kind, concurrency=limit.concurrency, rate=limit.rate, per_key=limit.per_key
                )
