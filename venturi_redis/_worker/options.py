"""The checks on ``vr.Worker(...)``'s arguments, each where it is given.

A wrong value is refused by the constructor with a ``ConfigurationError`` that
names the argument and what it accepts, instead of being stored and crashing
``run()`` later (``reclaim_interval=-1``, ``poll_interval=float("nan")``). A
bool is never a number here: ``max_failures=True`` is a mistake, not 1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .._model.backoff import to_ms
from .._model.errors import ConfigurationError
from .._producer.client import Client, Queue
from .._producer.sharded import ShardedQueue, expand_queues

if TYPE_CHECKING:
    from .metrics import WorkerObserver

T = TypeVar("T")


def seconds(value: Any, what: str, *, zero: bool = False) -> float:
    """A finite number of seconds, above zero (or at least zero with ``zero``), as a float.

    Bounded like every other duration of the API (``to_ms``).
    """
    lowest = "0 or more" if zero else "more than 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a number of seconds ({lowest}), got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ConfigurationError(f"{what} must be a finite number of seconds ({lowest}), got {value!r}")
    try:
        to_ms(value, what)
    except ValueError as exc:  # ConfigurationError is one too
        raise ConfigurationError(str(exc)) from None
    return float(value)


def optional_seconds(value: Any, what: str) -> float | None:
    """``seconds`` or None (the default is then worked out by the caller)."""
    return None if value is None else seconds(value, what)


def count(value: Any, what: str) -> int:
    """A whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be >= 1 (a whole number), got {value!r}")
    return value


def optional_count(value: Any, what: str) -> int | None:
    """``count`` or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be >= 1 (a whole number) or None, got {value!r}")
    return value


def fraction(value: Any, what: str) -> float:
    """A number within [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"{what} must be a number within [0, 1], got {value!r}")
    return float(value)


def flag(value: Any, what: str) -> bool:
    """True or False, nothing that merely looks like one (``"false"`` is truthy)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, got {value!r}")
    return value


def worker_name(value: Any) -> str | None:
    """None (``host:pid:random``) or 1 to 200 printable characters, no spaces.

    The name is the lease owner shown by the CLI and part of the key the
    worker pushes onto to interrupt its own idle wait.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 200 or not value.isprintable() or " " in value:
        raise ConfigurationError(
            f"name must be 1 to 200 printable characters without spaces, or None, got {value!r}"
        )
    return value


def instance_or_none(value: Any, cls: type[T], what: str, expected: str) -> T | None:
    """``value`` when it is a ``cls`` or None; else a ``ConfigurationError`` naming ``what``."""
    if value is not None and not isinstance(value, cls):
        raise ConfigurationError(f"{what} must be {expected} or None, got {value!r}")
    return value


def path_or_none(value: Any, what: str) -> Path | None:
    """A filesystem path (str or ``os.PathLike``) as a ``Path``, or None."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigurationError(f"{what} must be a path or None, got {value!r}")
    return Path(value)


def observer(value: Any) -> WorkerObserver | None:
    """A ``WorkerObserver`` (anything with ``job_claimed()`` and ``job_finished()``), or None."""
    methods = ("job_claimed", "job_finished")
    if value is not None and not all(callable(getattr(value, m, None)) for m in methods):
        raise ConfigurationError(
            f"observer must have job_claimed() and job_finished() (a WorkerObserver), got {value!r}"
        )
    return cast("WorkerObserver | None", value)


def worker_queues(queues: Any, client: Any) -> list[Queue]:
    """The queues a worker consumes: queues, sharded queues (their partitions) or names with ``client``."""
    if client is not None and not isinstance(client, Client):
        raise ConfigurationError(f"client must be a vr.Client, got {client!r}")
    items = [queues] if isinstance(queues, (Queue, ShardedQueue, str)) else list(queues)
    if any(isinstance(q, str) for q in items):
        # Queues by name (``Worker(["reports", "default"], client=client)``).
        if client is None:
            raise ConfigurationError("queues given by name need the client: Worker([...], client=client)")
        items = [client.queue(q) if isinstance(q, str) else q for q in items]
    qs = expand_queues(items)  # a ShardedQueue becomes its partitions
    if not qs or not all(isinstance(q, Queue) for q in qs):
        raise ConfigurationError("Worker needs at least one vr.Queue")
    if len({(id(q.client), q.name) for q in qs}) != len(qs):
        raise ConfigurationError("Worker was given the same queue twice")
    return qs


def wanted_queues(queues: Sequence[Queue], names: Sequence[str]) -> set[str]:
    """The names of ``queues`` that ``names`` pick (``Worker.only_queues``, ``venturi worker --queue``).

    A name is one of ``queues``, a sharded queue whose partitions are among
    them (meaning all of those), or one partition. Any other name is a
    ``ConfigurationError`` listing what is accepted.
    """
    from .._producer.sharded import parse_partition

    # The worker holds a ShardedQueue as its partitions (in index order);
    # their names give the sharded queue's name back.
    shards: dict[str, list[str]] = {}
    for q in queues:
        if (parsed := parse_partition(q.name)) is not None:
            shards.setdefault(parsed[0], []).append(q.name)
    own = {q.name for q in queues}
    wanted: set[str] = set()
    unknown: list[str] = []
    for n in names:
        match = set(shards.get(n, ())) | ({n} & own)
        if not match:
            unknown.append(n)
        wanted |= match
    if unknown:
        partitions = {p for parts in shards.values() for p in parts}
        accepted = sorted(own - partitions) + [
            f"{base} (sharded: all {len(parts)} partitions, or one of them, "
            + (", ".join(parts) if len(parts) <= 4 else f"{parts[0]} ... {parts[-1]}")
            + ")"
            for base, parts in sorted(shards.items())
        ]
        raise ConfigurationError(
            f"this worker does not consume queue(s) {', '.join(unknown)}; "
            f"--queue accepts: {'; '.join(accepted)}"
        )
    return wanted
