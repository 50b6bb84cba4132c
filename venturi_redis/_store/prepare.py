"""Tasks checked and encoded for ``enqueue.lua``: the producer's CPU-bound half of an enqueue.

``prepare`` raises everything an ``enqueue`` can refuse before it writes
(wrong type, oversized payload or carry, bad priority, lease, max_failures or
dedup key), so a refused call has sent nothing. ``prepare_many`` does the same
for a batch with the per-call work done once. The checks of each value, and
their errors, are ``checks.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypedDict

from pydantic import BaseModel

from .._model import tracing as _tracing
from .._model.backoff import to_ms
from .._model.codec import pack_model
from .._model.enums import Priority
from .._model.errors import ConfigurationError, PayloadTooLarge, TaskDefinitionError
from .._model.ids import new_job_id, new_job_ids
from .._model.outcome import UNSET
from .._model.sealing import Encryption, Sealer
from .._model.task import Task, task_kind
from .checks import (
    batch_too_large,
    check_batch_count,
    checked_dedup_field,
    checked_expires,
    checked_limit_key,
    checked_order_key,
    checked_timeout,
    not_a_task,
    payload_too_large,
)

# Jobs per enqueue script call (a batch's chunks, a coalesced burst).
ENQUEUE_CHUNK = 500


class EnqueueManyOptions(TypedDict, total=False):
    """The options of ``queue.enqueue_many`` (every job of the call gets them), all optional.

    The queue faces (``Queue``, ``ShardedQueue``, ``SyncQueue``) take them as
    ``**options`` and pass them on, so an option is declared here, once, and
    read by ``prepare``: a new one changes this module and no face.

    Attributes:
        delay: Seconds (or a timedelta) before the job becomes eligible (default 0).
        priority: Overrides ``task.priority()``.
        lease: Lease for this job's runs, for work known to run long.
        max_failures: Overrides the worker's retry backstop; ``None`` disables it.
        timeout: Seconds one run of this job may take (overrides
            ``task.timeout()`` and the worker's ``timeout``).
        expires: Seconds (or a timedelta) from now within which the job must
            start (overrides ``task.expires()``): a job not started before
            this deadline, on Redis's clock, never runs (its first run or a
            retry) and goes dead, ``vr.DeadReason.EXPIRED``. A value that is
            not a positive finite number or timedelta, or a ``delay`` (or
            ``at``) that puts eligibility at or past the deadline, raises
            ``ConfigurationError`` with nothing written.
    """

    delay: float | timedelta
    priority: Priority | int | str | None
    lease: float | timedelta | None
    max_failures: int | None
    timeout: float | timedelta | None
    expires: float | timedelta | None


class PrepareOptions(EnqueueManyOptions, total=False):
    """What ``prepare`` takes: the batch options and a single job's ``carry``."""

    carry: BaseModel | None


class EnqueueOptions(PrepareOptions, total=False):
    """The options of ``queue.enqueue``: ``EnqueueManyOptions``, and these.

    Attributes:
        carry: Initial carry (an instance of the task's carry model).
        after: Job ids of this queue the job waits for (workflows,
            docs/workflows.md): it is WAITING until every one has completed
            (one already completed counts as done), then pending (after
            ``delay``, counted from now). An id that is no job of this queue
            raises ``ConfigurationError`` with nothing written; so does a task
            with a dedup key. A ``ShardedQueue`` refuses it.
        at: Or when the job becomes eligible: a timezone-aware datetime (a
            past one: now), by the clock every script uses (Redis ``TIME``,
            read once more for it). A naive datetime, or ``at`` with a
            ``delay``, raises ``ConfigurationError`` with nothing written.
    """

    after: Sequence[str] | None
    at: datetime | None


ENQUEUE_OPTIONS: frozenset[str] = EnqueueOptions.__optional_keys__
ENQUEUE_MANY_OPTIONS: frozenset[str] = EnqueueManyOptions.__optional_keys__


# The enqueue options of Celery's ``apply_async``, RQ's ``enqueue``, arq's
# ``enqueue_job`` and Dramatiq's ``send_with_options`` that a user moving code
# here writes first, each with what takes its place (docs/migrating.md): the
# TypeError of an unknown option says it, rather than leave them to search.
_PEER_OPTIONS = {
    "countdown": "delay= (seconds)",
    "eta": "at= (a timezone-aware datetime)",
    "_defer_by": "delay= (seconds)",
    "_defer_until": "at= (a timezone-aware datetime)",
    "queue": "client.queue(name).enqueue(...): a queue is the object you enqueue on",
    "queue_name": "client.queue(name).enqueue(...): a queue is the object you enqueue on",
    "_queue_name": "client.queue(name).enqueue(...): a queue is the object you enqueue on",
    "job_id": "the task's dedup_key() (docs/dedup.md): job ids are minted by enqueue",
    "_job_id": "the task's dedup_key() (docs/dedup.md): job ids are minted by enqueue",
    "task_id": "the task's dedup_key() (docs/dedup.md): job ids are minted by enqueue",
    "job_timeout": "timeout= (seconds)",
    "time_limit": "timeout= (seconds)",
    "soft_time_limit": "timeout= (seconds)",
    "_expires": "expires= (seconds)",
    "ttl": "expires= (seconds)",
    "max_retries": "max_failures= (failed runs before the job is dead: max_retries + 1)",
    "retry": "max_failures= and the task's backoff()",
    "depends_on": "after= (job ids: docs/workflows.md)",
    "link": "after= (job ids: docs/workflows.md)",
    "at_front": "priority=",
    "args": "the task's fields: enqueue(MyTask(field=value))",
    "kwargs": "the task's fields: enqueue(MyTask(field=value))",
}


def unknown_option(options: Mapping[str, object], known: frozenset[str], call: str) -> TypeError | None:
    """A TypeError naming the first option of ``options`` that ``call`` does not take, if any.

    An option another job queue has says what takes its place here; one that
    ``enqueue`` takes and ``call`` does not says so.
    """
    for name in options:
        if name not in known:
            said = f"{call}() got an unexpected keyword argument {name!r}"
            if name in _PEER_OPTIONS:
                return TypeError(f"{said}: use {_PEER_OPTIONS[name]}")
            if name in ENQUEUE_OPTIONS:
                return TypeError(f"{said}: only enqueue() takes it, one job at a time")
            return TypeError(said)
    return None


class Prepared(NamedTuple):
    """One job, checked and encoded, ready for ``enqueue.lua`` (``calls.enqueue``).

    Immutable; a NamedTuple rather than a frozen dataclass because it is built
    once per job and a frozen dataclass's ``__init__`` costs five times as much.
    """

    id: str
    kind: str
    priority: Priority
    delay_ms: int
    payload: bytes
    carry: bytes
    lease_ms: str
    max_failures: str
    dedup: str
    explicit_priority: bool
    # The W3C trace context of the enqueue (``traceparent``, then `` tracestate``
    # when there is one), stored on the job: set only while
    # ``venturi_redis.otel`` is instrumented (``_model/tracing.py``), else ''.
    trace: str = ""
    # Per-job run timeout in ms ('' = the worker's), and the job's limit key
    # as stored (``limit_field``: length-prefixed; '' = none).
    timeout_ms: str = ""
    limit_key: str = ""
    # The start deadline in ms from the enqueue script's clock ('' = none):
    # job_args.lua stores it as ``expires_at`` (that clock + this) and indexes it.
    expires_ms: str = ""
    # The task's dedup window in ms ('' = none: ``Task.dedup_window``), stored
    # as the job's `dedup_window` field: the claim keeps its dedup key held,
    # and its completion holds it on for the window (lua/complete.lua).
    dedup_window: str = ""
    # The job's order key ('' = none): stored as ``order_key`` with the
    # ``hooks`` flag, so the scripts that end its run see to the key
    # (lua/include/order.lua) and a job without one pays nothing for it.
    order_key: str = ""

    def optional(self) -> list[str | bytes]:
        """The optional job-hash fields this job has, as name, value pairs, for the enqueue
        scripts to store as they come (lua/include/job_args.lua): a new optional field of a
        job is one more line here, and none in the scripts."""
        out: list[str | bytes] = []
        if self.order_key:
            # First, always: enqueue.lua looks for it in the first pair only.
            out += ("order_key", self.order_key, "hooks", "1")
        if self.carry:
            out += ("carry", self.carry)
        if self.lease_ms:
            out += ("lease_ms", self.lease_ms)
        if self.max_failures:
            out += ("max_failures", self.max_failures)
        if self.timeout_ms:
            out += ("timeout_ms", self.timeout_ms)
        if self.limit_key:
            out += ("limit_key", self.limit_key)
        if self.trace:
            out += ("trace", self.trace)
        if self.expires_ms:
            out += ("expires_at", self.expires_ms)
        if self.dedup_window:
            out += ("dedup_window", self.dedup_window)
        return out


def prepare(
    task: Task[Any],
    cap: int,
    encryption: Encryption | Sealer | None,
    *,
    delay: float | timedelta = 0.0,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
    carry: BaseModel | None = None,
    timeout: float | timedelta | None = None,
    expires: float | timedelta | None = None,
) -> Prepared:
    if not isinstance(task, Task):
        raise TaskDefinitionError(not_a_task(task))
    kind = task_kind(type(task))
    payload = pack_model(task)
    if len(payload) > cap:
        raise payload_too_large(kind, len(payload), cap)
    if encryption is not None:  # sealed after the cap's check: the cap is on the plain value
        payload = encryption.seal(payload)
    carry_bytes = b""
    if carry is not None:
        carry_cls = type(task).carry_type()
        if not isinstance(carry, carry_cls):
            raise TaskDefinitionError(
                f"carry for {kind} must be a {carry_cls.__name__}, got {type(carry).__name__}"
            )
        carry_bytes = pack_model(carry)
        if len(carry_bytes) > cap:
            raise PayloadTooLarge(f"{kind} carry is {len(carry_bytes)} bytes, over the cap of {cap}")
        if encryption is not None:
            carry_bytes = encryption.seal(carry_bytes)
    if priority is None:
        prio = task.priority()
        if type(prio) is not Priority:
            prio = Priority.parse(prio)
    else:
        prio = Priority.parse(priority)
    lease_ms = ""
    if lease is not None:
        ms = to_ms(lease, "lease")
        if ms < 1:
            raise ConfigurationError(f"lease must be positive, got {lease!r}")
        lease_ms = str(ms)
    if max_failures is UNSET:
        maxf = ""
    elif max_failures is None:
        maxf = "none"
    elif type(max_failures) is int and max_failures >= 1:  # not a bool: True is not 1 here
        maxf = str(max_failures)
    else:
        raise ConfigurationError(f"max_failures must be an int >= 1 or None, got {max_failures!r}")
    key = task.dedup_key()
    field = ""
    if key is not None:
        field = checked_dedup_field(kind, key)
    okey = task.order_key()
    order = "" if okey is None else checked_order_key(kind, okey, field)
    # ``delay == 0`` is only true of a number zero (not NaN, not a timedelta),
    # and of False, which to_ms refuses as it refuses True.
    delay_ms = 0 if delay == 0 and delay is not False else to_ms(delay, "delay")
    # None (the common case) skips the checks' calls: a single enqueue's hot path.
    tmo = task.timeout() if timeout is None else timeout
    timeout_ms = "" if tmo is None else checked_timeout(kind, tmo)
    lkey = task.limit_key()
    limit = "" if lkey is None else checked_limit_key(kind, lkey)
    exp = task.expires() if expires is None else expires
    expires_ms = "" if exp is None else checked_expires(kind, exp, delay_ms)
    # Positional, in Prepared's field order (id, kind, priority, delay_ms,
    # payload, carry, lease_ms, max_failures, dedup, explicit_priority, trace,
    # timeout_ms, limit_key, expires_ms): keywords double the cost of this line.
    job = Prepared(
        new_job_id(),
        kind,
        prio,
        delay_ms,
        payload,
        carry_bytes,
        lease_ms,
        maxf,
        field,
        priority is not None,
        "",
        timeout_ms,
        limit,
        expires_ms,
    )
    timing = type(task)._vr_dedup_timing
    if timing is not None:  # one read for a task without them
        job = with_dedup_timing(job, timing)
    if order:
        job = job._replace(order_key=order)
    if _tracing.TRACE is not None:
        return job._replace(trace=_tracing.TRACE())
    return job


def prepare_many(
    tasks: Sequence[Task[Any]],
    cap: int,
    encryption: Encryption | None,
    *,
    delay: float | timedelta = 0.0,
    priority: Priority | int | str | None = None,
    lease: float | timedelta | None = None,
    max_failures: int | None = UNSET,
    timeout: float | timedelta | None = None,
    expires: float | timedelta | None = None,
    max_jobs: int | None = None,
    max_bytes: int | None = None,
) -> list[Prepared]:
    """``prepare`` of each task (no carry), with the per-call work done once.

    ``max_jobs`` and ``max_bytes`` bound the call (``Client(max_batch_jobs=...,
    max_batch_bytes=...)``; None: no bound): more tasks, or more encoded
    payload bytes in all, raise before anything is sent. The count is checked
    before any task is encoded, the bytes as they add up, so a refused call
    never holds more than its bound in memory.

    The first task goes through ``prepare`` itself, so the call's arguments
    are checked there, in its order, raising what ``enqueue`` would. The
    others reuse what it worked out and check only what is their own, in the
    same order: the type, KIND (once per class), payload size, priority and
    dedup key. Their ids come from one ``new_job_ids`` call, after the first.

    With ``encryption``, the call's nonces are drawn from the kernel at once,
    here (``Encryption.sealer``), and each payload is sealed after its cap's
    check, as ``prepare`` seals one.
    """
    if not tasks:
        return []
    if max_jobs is not None:
        check_batch_count(len(tasks), max_jobs)
    sealer = None if encryption is None else encryption.sealer(len(tasks))
    first = prepare(
        tasks[0],
        cap,
        encryption=sealer,
        delay=delay,
        priority=priority,
        lease=lease,
        max_failures=max_failures,
        carry=None,
        timeout=timeout,
        expires=expires,
    )
    jobs = [first]
    kinds: dict[type[Task[Any]], str] = {}
    pack = pack_model  # one msgpack packer per thread, reused
    # Encoded bytes so far (the first job's, sealed or not: within a few bytes of its plain size).
    total, most = len(first.payload), (1 << 62) if max_bytes is None else max_bytes
    if total > most:
        raise batch_too_large("enqueue_many", len(tasks), most)
    prio, delay_ms, explicit = first.priority, first.delay_ms, first.explicit_priority
    for job_id, task in zip(new_job_ids(len(tasks) - 1), tasks[1:], strict=True):
        if not isinstance(task, Task):
            raise TaskDefinitionError(not_a_task(task))
        cls = type(task)
        kind = kinds.get(cls)
        if kind is None:
            kind = kinds[cls] = cls.kind()
        payload = pack(task)
        size = len(payload)
        if size > cap:
            raise payload_too_large(kind, size, cap)
        total += size
        if total > most:
            raise batch_too_large("enqueue_many", len(tasks), most)
        if sealer is not None:
            payload = sealer.seal(payload)
        if not explicit:
            prio = Priority.parse(task.priority())
        key = task.dedup_key()
        field = "" if key is None else checked_dedup_field(kind, key)
        if timeout is not None:
            timeout_ms = first.timeout_ms  # the call's own, checked once
        else:
            tmo = task.timeout()
            timeout_ms = "" if tmo is None else checked_timeout(kind, tmo)
        lkey = task.limit_key()
        limit = "" if lkey is None else checked_limit_key(kind, lkey)
        if expires is not None:
            expires_ms = first.expires_ms  # the call's own, checked once
        else:
            exp = task.expires()
            expires_ms = "" if exp is None else checked_expires(kind, exp, delay_ms)
        okey = task.order_key()
        order = "" if okey is None else checked_order_key(kind, okey, field)
        # Positional, in Prepared's field order: keywords double the cost
        # of this line. The tests read every field back from Redis.
        job = Prepared(
            job_id,
            kind,
            prio,
            delay_ms,
            payload,
            b"",
            first.lease_ms,
            first.max_failures,
            field,
            explicit,
            first.trace,
            timeout_ms,
            limit,
            expires_ms,
        )
        timing = cls._vr_dedup_timing
        if timing is not None:
            job = with_dedup_timing(job, timing)
        if order:
            job = job._replace(order_key=order)
        jobs.append(job)
    return jobs


def with_dedup_timing(job: Prepared, timing: tuple[int, int]) -> Prepared:
    """``job`` with its task's dedup window and debounce (``Task._vr_dedup_timing``).

    Both act on the dedup key, so a job without one keeps neither. A debounced
    job is eligible no sooner than the debounce after its enqueue (a later
    ``delay`` or ``at`` wins): a burst's first enqueue waits for the burst too.
    """
    if not job.dedup:
        return job
    window, debounce = timing
    if debounce and job.expires_ms and max(job.delay_ms, debounce) >= int(job.expires_ms):
        raise ConfigurationError(
            f"{job.kind}: its debounce ({debounce} ms) puts its start at or past its "
            f"expiry ({job.expires_ms} ms from now): it could never run; shorten one of them"
        )
    return job._replace(
        delay_ms=max(job.delay_ms, debounce),
        dedup_window=str(window) if window else "",
    )
