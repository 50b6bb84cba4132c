"""venturi_redis: a typed, inspectable job queue on Redis.

Producers import ``Task``, ``Client`` and ``Queue``; workers add ``Handler``
and ``Worker``. Everything public is re-exported here; the modules behind it
are private.
"""

from ._backoff import Backoff, backoff_delay
from ._client import Client, Queue
from ._context import Context
from ._enums import JobState, Priority
from ._errors import (
    ConfigurationError,
    LeaseLostError,
    MergeConflictError,
    PayloadError,
    PayloadTooLarge,
    TaskDefinitionError,
    TaskError,
    VenturiError,
)
from ._handler import Handler
from ._outcome import Outcome
from ._records import JobInfo, JournalEntry
from ._task import Merge, NoCarry, Pending, Task
from ._worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "Client",
    "ConfigurationError",
    "Context",
    "Handler",
    "JobInfo",
    "JobState",
    "JournalEntry",
    "LeaseLostError",
    "Merge",
    "MergeConflictError",
    "NoCarry",
    "Outcome",
    "PayloadError",
    "PayloadTooLarge",
    "Pending",
    "Priority",
    "Queue",
    "Task",
    "TaskDefinitionError",
    "TaskError",
    "VenturiError",
    "Worker",
    "backoff_delay",
]
