"""venturi_redis: a typed, inspectable job queue on Redis.

Producers import ``Task``, ``Client`` and ``Queue``; workers add ``Handler``
and ``Worker``. Everything public is re-exported here; the modules behind it
are private.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._model.backoff import Backoff, backoff_delay
from ._model.enums import DeadReason, JobState, Priority
from ._model.errors import (
    ConfigurationError,
    CorruptQueueError,
    EncryptionKeyMissing,
    JobNotFound,
    LeaseLostError,
    MaxClientsError,
    MergeConflictError,
    PartialEnqueueError,
    PayloadError,
    PayloadTooLarge,
    PoolExhaustedError,
    TaskDefinitionError,
    TaskError,
    VenturiError,
)
from ._model.flow import Flow
from ._model.outcome import Outcome
from ._model.records import JobInfo, JournalEntry, WorkerInfo
from ._model.sealing import Encrypted, Encryption
from ._model.task import Merge, NoCarry, Pending, Task
from ._producer.client import Client, Queue
from ._producer.client_options import ClientOptions
from ._producer.offload import OffloadFunction, SyncOffloadFunction, offload
from ._producer.retention import Retention
from ._producer.sharded import ShardedQueue
from ._store.prepare import EnqueueManyOptions, EnqueueOptions
from ._transport.durable import Durability, NotDurableError
from ._worker.context import Context
from ._worker.handler import BatchHandler, BatchItem, Handler

if _TYPE_CHECKING:
    from ._model.events import QueueEvent
    from ._model.history import HistoryPoint
    from ._model.limits import Limit, LimitInfo, LimitKeyLoad, Rate
    from ._model.schedule import Schedule, ScheduleInfo
    from ._producer.bulk import BulkFilters, BulkProgress
    from ._producer.reads import QueueStats
    from ._producer.results import (
        OffloadHandle,
        OffloadNotFound,
        OffloadResult,
        read_result,
        read_result_redacted,
        resolve,
    )
    from ._producer.scale import ScaleTotal
    from ._producer.sync import SyncClient, SyncQueue
    from ._worker.logcontext import JobLogFilter
    from ._worker.metrics import PrometheusMetrics, WorkerObserver
    from ._worker.worker import Worker

__version__ = "0.1.0"

# The worker side loads on first use, so a web process that only enqueues
# never imports it (tests/test_package.py checks this); so do the
# synchronous client, which neither a worker nor an async producer needs,
# the readings (stats, job lists), the operators' bulk filters, the metrics
# history and the offload results' reading side, and the models of the event
# stream, limits and schedules, which a worker that uses none of them never
# imports (issue 42: a worker's start-up). Name -> its module.
_LAZY = {
    "BulkFilters": "._producer.bulk",
    "BulkProgress": "._producer.bulk",
    "HistoryPoint": "._model.history",
    "JobLogFilter": "._worker.logcontext",
    "Limit": "._model.limits",
    "LimitInfo": "._model.limits",
    "LimitKeyLoad": "._model.limits",
    "OffloadHandle": "._producer.results",
    "OffloadNotFound": "._producer.results",
    "OffloadResult": "._producer.results",
    "PrometheusMetrics": "._worker.metrics",
    "QueueEvent": "._model.events",
    "QueueStats": "._producer.reads",
    "Rate": "._model.limits",
    "ScaleTotal": "._producer.scale",
    "Schedule": "._model.schedule",
    "ScheduleInfo": "._model.schedule",
    "SyncClient": "._producer.sync",
    "SyncQueue": "._producer.sync",
    "Worker": "._worker.worker",
    "WorkerObserver": "._worker.metrics",
    "read_result": "._producer.results",
    "read_result_redacted": "._producer.results",
    "resolve": "._producer.results",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'venturi_redis' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Backoff",
    "BatchHandler",
    "BatchItem",
    "BulkFilters",
    "BulkProgress",
    "Client",
    "ClientOptions",
    "ConfigurationError",
    "Context",
    "CorruptQueueError",
    "DeadReason",
    "Durability",
    "Encrypted",
    "Encryption",
    "EncryptionKeyMissing",
    "EnqueueManyOptions",
    "EnqueueOptions",
    "Flow",
    "Handler",
    "HistoryPoint",
    "JobInfo",
    "JobLogFilter",
    "JobNotFound",
    "JobState",
    "JournalEntry",
    "LeaseLostError",
    "Limit",
    "LimitInfo",
    "LimitKeyLoad",
    "MaxClientsError",
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
    "PoolExhaustedError",
    "Priority",
    "PrometheusMetrics",
    "Queue",
    "QueueEvent",
    "QueueStats",
    "Rate",
    "Retention",
    "ScaleTotal",
    "Schedule",
    "ScheduleInfo",
    "ShardedQueue",
    "SyncClient",
    "SyncOffloadFunction",
    "SyncQueue",
    "Task",
    "TaskDefinitionError",
    "TaskError",
    "VenturiError",
    "Worker",
    "WorkerInfo",
    "WorkerObserver",
    "backoff_delay",
    "offload",
    "read_result",
    "read_result_redacted",
    "resolve",
]
