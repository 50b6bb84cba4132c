"""The exceptions venturi_redis raises, rooted at one class.

::

    VenturiError
    ├── ConfigurationError        a bad URL, option or queue name
    ├── TaskDefinitionError       a Task or Handler class that cannot be used
    ├── PayloadError              a value that cannot be encoded or decoded
    │   ├── PayloadTooLarge       an encoded payload over the size cap
    │   └── EncryptionKeyMissing  a value encrypted under a key this client does not hold
    ├── LeaseLostError            a worker's lease on a job is gone (fencing)
    ├── MergeConflictError        a dedup merge kept losing its optimistic race
    ├── PartialEnqueueError       an ``enqueue_many`` wrote some of its tasks, not all
    ├── OffloadNotFound           no snapshot under an offload key (_producer/results.py)
    ├── JobNotFound               no such job in the queue (``queue.wait``)
    ├── NotDurableError           too few replicas acknowledged in time (_durable.py)
    ├── MaxClientsError           Redis refused a new connection: it is at its maxclients
    ├── PoolExhaustedError        no connection of a client's pool came free in time
    ├── CorruptQueueError         a queue-wide key, or one job's own data, is corrupt (nothing moved)
    └── TaskError                 raised by a handler; ``TaskError.permanent`` kills the job

Any other exception a handler raises is a retryable failure whose message becomes
the run's note.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class VenturiError(Exception):
    """Base class of every error venturi_redis raises on purpose."""


class ConfigurationError(VenturiError, ValueError):
    """A URL, option or name given to venturi_redis is not valid."""


class TaskDefinitionError(VenturiError, TypeError):
    """A Task or Handler class is missing something venturi_redis needs."""


class PayloadError(VenturiError, ValueError):
    """A payload, carry, attachment or stored value cannot be encoded or decoded."""


class PayloadTooLarge(PayloadError):
    """An encoded payload is larger than the queue's ``max_payload_bytes``."""


class EncryptionKeyMissing(PayloadError):
    """A stored value is encrypted under a key this client (or worker) does not hold."""

    def __init__(self, key_id: str, held: tuple[str, ...] = ()) -> None:
        self.key_id = key_id
        has = f"its keys are {', '.join(held)}" if held else "it has no encryption configured"
        super().__init__(
            f"value is encrypted under key id {key_id}, which this client does not hold ({has}); "
            "give its Client encryption=vr.Encryption(keys=[...]) with that key (docs/security.md)"
        )


class LeaseLostError(VenturiError):
    """A transition was refused because this worker no longer owns the job's lease."""

    def __init__(self, job_id: str, attempted: str, reason: str) -> None:
        self.job_id = job_id
        self.attempted = attempted
        self.reason = reason
        super().__init__(
            f"job {job_id}: {attempted} refused ({reason}); another worker owns the job "
            "now or it already finished, so this run's outcome was discarded"
        )


class CorruptQueueError(VenturiError, ResponseError):
    """A key of the queue holds the wrong type of value; the script stopped before moving any job.

    Also raised, naming the job, when an operator's operation on one job
    (cancel, resume, retry, a dedup merge into it) finds that job's own data
    corrupt (its key not a hash, its journal not a stream, no state, a bad
    priority): nothing was written.

    Also a ``redis.exceptions.ResponseError`` (it is Redis's error reply, coded
    by the script), so code that survives Redis errors survives it too.
    """


class MaxClientsError(VenturiError, RedisConnectionError):
    """Redis refused a new connection: it already serves its ``maxclients`` clients.

    Also a ``redis.exceptions.ConnectionError`` (what redis-py raises for the
    same refusal), so code that survives a lost connection survives it too:
    a worker retries, and goes on once connections come free.
    """


class PoolExhaustedError(VenturiError, RedisConnectionError):
    """Every connection of a client's pool (its ``max_connections``) stayed in use for the whole wait.

    Also a ``redis.exceptions.ConnectionError``: nothing was sent.
    """


class JobNotFound(VenturiError, LookupError):
    """No job has this id in the queue: never enqueued there, or purged."""


class MergeConflictError(VenturiError):
    """A dedup merge lost its optimistic race more often than the retry bound allows."""


class PartialEnqueueError(VenturiError):
    """An ``enqueue_many`` failed after some of its tasks were enqueued; says exactly which."""

    def __init__(self, queue: str, ids: list[str | None], unknown: list[int], cause: BaseException) -> None:
        #: Per task, in the order given: the id of the job holding its work
        #: (created, or merged into), or ``None`` when it was not enqueued.
        self.ids = ids
        #: Indices of tasks whose call failed in flight (its reply was lost):
        #: written or not, nobody can tell; their ``ids`` entry is ``None``.
        self.unknown = unknown
        done = sum(1 for i in ids if i is not None)
        missing = len(ids) - done - len(unknown)
        fate = f", {len(unknown)} unknown (indices in .unknown)" if unknown else ""
        super().__init__(
            f"queue {queue}: enqueue_many failed part-way ({type(cause).__name__}: {cause}); "
            f"{done} of {len(ids)} tasks enqueued (ids in .ids), {missing} not{fate}; "
            "re-enqueue the tasks whose .ids entry is None"
        )

    @property
    def not_enqueued(self) -> list[int]:
        """Indices of the tasks known not to be enqueued: safe to send again."""
        unknown = set(self.unknown)
        return [i for i, job_id in enumerate(self.ids) if job_id is None and i not in unknown]


class TaskError(VenturiError):
    """An error a handler raises on purpose.

    ``raise TaskError("flaky upstream")`` is a retryable failure, like any exception;
    ``raise TaskError.permanent("resource gone")`` sends the job straight to dead.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.is_permanent = permanent

    @classmethod
    def permanent(cls, message: str) -> TaskError:
        """An error that no retry can fix: the job goes to dead with ``message`` as its note."""
        return cls(message, permanent=True)


def said(exc: BaseException, *, named: bool = False) -> str:
    """``str(exc)`` as a note or an error's text says it, never a raise of its own.

    Empty, it is the exception's class name; ``named``, the class name comes
    first (``KeyError: 'sku'``). A library's exception whose ``__str__``
    raises (a format that does not fit its arguments) still says what it is:
    ``KeyError (its str() raised ...)``. A failed run's note, a stored value's
    validation error and a slip logged by the worker all say it this way.
    """
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception as failed:  # noqa: BLE001 - the application's exception class, not ours
        try:
            why = f"{type(failed).__name__}: {failed}"
        except Exception:  # noqa: BLE001 - that one's str() too
            why = type(failed).__name__
        return f"{name} (its str() raised {why})"[:1000]
    if not text:
        return name
    return f"{name}: {text}" if named else text
