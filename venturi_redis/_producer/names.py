"""What a client keeps per queue name, bounded: a producer may write to a queue per tenant.

``Client.queue(name)`` and ``SyncClient.queue(name)`` hand out one object per
name and keep it for the next call; the registry's memo (``registry.py``)
remembers which names it recorded. An app that makes a queue name per
tenant, customer or region asks a long-lived client for 100,000 names or
more, and a dict that only ever grew held a ``Queue`` (~4 KB) per name ever
asked for: 400 MB at 100,000 names (benchmarks/many_queues.py). So each is
bounded, and what falls out is made again when asked for.

Eviction is first in, first out, not least recently used: a hit stays one
``dict.get`` with nothing to reorder (the usual app asks for a few names
millions of times), and a name that keeps being asked for costs one rebuild
(~25 µs for a ``Queue``) per ``cap`` other names made meanwhile. Only the
making of a new entry takes the lock: a ``SyncClient`` is shared between
threads, and eviction walks the dict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# The queues (or SyncQueues) a client keeps: ~4 MB of Queue objects at most.
QUEUES_KEPT = 1024


class Kept(Generic[T]):
    """At most ``cap`` objects by queue name, the oldest made dropped first.

    ``items`` is the dict itself, for the owner to read with its own
    ``.get`` (a hit costs what it did before the bound); ``make`` is the one
    way in.
    """

    __slots__ = ("_lock", "cap", "items")

    def __init__(self, cap: int = QUEUES_KEPT) -> None:
        self.cap = cap
        self.items: dict[str, T] = {}
        self._lock = threading.Lock()

    def make(self, name: str, factory: Callable[[str], T]) -> T:
        """The object for ``name``: the one kept, else ``factory(name)``, kept (dropping the oldest)."""
        items = self.items
        with self._lock:
            item = items.get(name)
            if item is None:
                item = factory(name)  # raises for a bad name: nothing kept, nothing dropped
                while len(items) >= self.cap:
                    del items[next(iter(items))]
                items[name] = item
            return item
