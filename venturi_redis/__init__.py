"""venturi_redis: a typed, inspectable job queue on Redis.

Producers import ``Task``, ``Client`` and ``Queue``; workers add ``Handler``
and ``Worker``. Everything public is re-exported here; the modules behind it
are private.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._backoff import Backoff, backoff_delay
from ._client import Client, Queue
from ._context import Context
from ._durable import Durability, NotDurableError
from ._enums import JobState, Priority
from ._errors import (
    ConfigurationError,
    LeaseLostError,
    MergeConflictError,
    PartialEnqueueError,
    PayloadError,
    PayloadTooLarge,
    TaskDefinitionError,
    TaskError,
    VenturiError,
)
from ._handler import Handler
from ._offload import (
    OffloadFunction,
    OffloadHandle,
    OffloadNotFound,
    OffloadResult,
    offload,
    read_result,
    read_result_redacted,
    resolve,
)
from ._ops import QueueStats, Retention
from ._outcome import Outcome
from ._records import JobInfo, JournalEntry
from ._sharded import ShardedQueue
from ._sync import SyncClient, SyncQueue
from ._task import Merge, NoCarry, Pending, Task

if _TYPE_CHECKING:
    from ._worker import Worker

__version__ = "0.1.0"


def __getattr__(name: str) -> _Any:
    # The worker side loads on first use, so a web process that only enqueues
    # never imports it (tests/test_package.py checks this).
    if name == "Worker":
        from ._worker import Worker

        globals()["Worker"] = Worker
        return Worker
    raise AttributeError(f"module 'venturi_redis' has no attribute {name!r}")


__all__ = [
    "Backoff",
    "Client",
    "ConfigurationError",
    "Context",
    "Durability",
    "Handler",
    "JobInfo",
    "JobState",
    "JournalEntry",
    "LeaseLostError",
    "Merge",
    "MergeConflictError",
    "NoCarry",
    "NotDurableError",
    "OffloadFunction",
    "OffloadHandle",
    "OffloadNotFound",
    "OffloadResult",
    "Outcome",
    "PartialEnqueueError",
    "PayloadError",
    "PayloadTooLarge",
    "Pending",
    "Priority",
    "Queue",
    "QueueStats",
    "Retention",
    "ShardedQueue",
    "SyncClient",
    "SyncQueue",
    "Task",
    "TaskDefinitionError",
    "TaskError",
    "VenturiError",
    "Worker",
    "backoff_delay",
    "offload",
    "read_result",
    "read_result_redacted",
    "resolve",
]
