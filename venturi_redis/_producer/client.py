"""The producer side: ``Client`` (a connection) and ``Queue`` (one named queue).

Nothing here imports the worker: a web process that only enqueues stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Unpack, cast

from .._model.codec import pack
from .._model.errors import ConfigurationError, PayloadTooLarge
from .._model.flow import Flow
from .._model.records import JOURNAL_FIELDS, JobInfo, JournalEntry, journal_from
from .._model.sealing import Encryption
from .._model.sizes import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_JOBS,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_MAX_RESULT,
    checked_cap,
)
from .._model.task import Task
from .._store.checks import checked_at
from .._store.keys import QueueKeys
from .._store.prepare import (
    ENQUEUE_MANY_OPTIONS,
    ENQUEUE_OPTIONS,
    EnqueueManyOptions,
    EnqueueOptions,
    PrepareOptions,
    prepare,
    prepare_many,
    unknown_option,
)
from .._store.sender import Sender
from .._store.store import QueueStore
from .._transport.cluster import is_cluster, require_cluster_support
from .._transport.connect import connect, default_url
from .._transport.durable import Durability, DurableRedis, as_durability
from .._transport.lane import Lane
from .._transport.urls import redact_url
from . import flow as _flow
from .base import server_now_ms
from .batch import enqueue_prepared
from .client_options import ClientOptions
from .coalesce import Coalescer
from .dedup import merge_into
from .names import Kept
from .queue_admin import QueueAdmin
from .queue_features import QueueFeatures
from .registry import Recorded

if TYPE_CHECKING:
    from .scale import ScaleTotal
    from .tail import StreamTail


class Client:
    """A connection to one Redis (or the embedded ``memory://`` server).

    Args:
        redis: A ``redis.asyncio.Redis`` (or fakeredis) client with
            ``decode_responses=False``.
        namespace: The first part of every key (``venturi`` by default).
        max_payload_bytes: Largest encoded payload, carry, resume value or
            attachment (1 MiB by default): a producer's is refused before
            anything is sent (``PayloadTooLarge``), a run's carry or
            attachment over it fails the run, unsaved.
        max_result_bytes: Largest encoded result or suspend output a run may
            store (8 MiB by default); over it the run fails, with a note
            naming the cap.
        max_batch_jobs: Most tasks one ``enqueue_many`` call takes (10,000 by
            default): the call is one transaction, and Redis serves nobody
            else while it runs.
        max_batch_bytes: Most encoded payload bytes one ``enqueue_many`` or
            ``enqueue_flow`` call sends (32 MiB by default), for the same
            reason; concurrent ``enqueue`` calls that share a script call
            share at most this much. docs/guarantees.md, "Sizes and
            limits", has every limit.
        clock: Milliseconds-since-epoch source passed to every script. ``None``
            (the default) lets each script read Redis ``TIME``, so every pod
            shares the server's clock and skew between pods cannot matter.
        durable: Durable mode (``vr.Durability``, or a replica count): every
            transition returns only once that many replicas acknowledged it
            (WAIT on the same connection); see docs/cluster.md.
        encryption: Encryption at rest (``vr.Encryption(keys=[...])``): every
            payload, carry, result, output, attachment, progress value and
            resume input this client (or a worker on it) writes is encrypted,
            and read back with any of the keys; without the key a read shows
            ``vr.Encrypted``. See docs/security.md.
    """

    def __init__(
        self,
        redis: Any,
        *,
        namespace: str = "venturi",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        max_result_bytes: int = DEFAULT_MAX_RESULT,
        max_batch_jobs: int = DEFAULT_MAX_BATCH_JOBS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        clock: Callable[[], int] | None = None,
        url: str = "",
        durable: Durability | int | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        self.max_payload_bytes = checked_cap("max_payload_bytes", max_payload_bytes)
        self.max_result_bytes = checked_cap("max_result_bytes", max_result_bytes)
        self.max_batch_jobs = checked_cap("max_batch_jobs", max_batch_jobs, 10**9)
        self.max_batch_bytes = checked_cap("max_batch_bytes", max_batch_bytes, 1 << 40)
        if is_cluster(redis):
            require_cluster_support()  # a caller's own RedisCluster, on a redis-py too old for it
        # Durable mode wraps the connection: each EVALSHA goes out with a WAIT.
        self.durability = as_durability(durable)
        if self.durability is not None:
            redis = DurableRedis(redis, self.durability)
        self.redis = redis
        self.namespace = namespace
        self.url = url
        if encryption is not None and not isinstance(encryption, Encryption):
            raise ConfigurationError(
                f"encryption must be a vr.Encryption (or None), got {type(encryption).__name__}"
            )
        # None: nothing is sealed or opened (one `is None` check where values are packed).
        self.encryption = encryption
        # Every script call of this client goes out through its sender
        # (_store/sender.py); each queue's store (queue.store) builds them.
        # The enqueue lane (_transport/lane.py) is only made by from_url, where
        # the client owns its connections: aclose() is then the one place that
        # closes them.
        self.sender = Sender(redis, clock=clock)
        # The queues handed out, by name: at most names.QUEUES_KEPT of them (a
        # queue per tenant must not grow the client without bound).
        self._kept: Kept[Queue] = Kept()
        self._queues = self._kept.items  # read on every call: a plain dict's get
        QueueKeys.for_queue("probe", namespace)  # validates the namespace now
        # The queues this client recorded in the registry of queues (registry.py).
        self._recorded = Recorded(namespace)
        # Each queue's one reader of its event stream, for its followers and
        # waiters (tail.py), by the stream's key; made at the first of them.
        self._tails: dict[str, StreamTail] = {}

    @classmethod
    def from_url(cls, url: str | None = None, **options: Unpack[ClientOptions]) -> Client:
        """Connect to ``redis://``, ``rediss://``, ``unix://`` or ``memory://[name]``.

        ``url=None`` reads ``REDIS_URL``, else ``redis://127.0.0.1:6379/0``.
        The embedded in-process server (nothing survives the process) is
        only ever used when asked for by name, ``memory://``.

        Redis Cluster: ``redis+cluster://host:port[,host:port...]`` (or
        ``rediss+cluster://``), or any ``redis://`` URL with ``cluster=True``.
        Everything else is unchanged; see docs/cluster.md.

        Redis Sentinel: ``redis+sentinel://host:port[,host:port...]/SERVICE[/DB]``
        (or ``rediss+sentinel://``): the service's master, followed across
        failovers; see docs/operations.md.

        ``max_connections=N`` (or ``?max_connections=N`` in the URL, which
        wins): the most connections the client's pool opens, 20 by default.
        A call that finds them all in use waits for one (up to 10 s, then
        ``vr.PoolExhaustedError``); the enqueue lane's connection is one
        more. docs/deployment.md, "Connections each part holds".
        """
        url = url or default_url()
        redis = connect(
            url, cluster=options.pop("cluster", False), max_connections=options.pop("max_connections", None)
        )
        client = cls(redis, url=url, **cast("dict[str, Any]", options))  # the rest: __init__'s
        # The client owns this connection: the enqueue lane may take one of its
        # own (only over a plain pool; see Lane.for_redis).
        client.sender.lane = Lane.for_redis(client.redis)
        return client

    def queue(self, name: str = "default") -> Queue:
        """The queue called ``name``.

        The client keeps the queues it hands out, so asking again is a dict
        lookup; it keeps the last ``1024`` names made (a queue per tenant does
        not grow it without bound), and one it dropped is made again when
        asked for: an equal object, with nothing lost (a ``Queue`` holds no
        state of its own beyond its name's keys; docs/operations.md, "Many
        queues").
        """
        q = self._queues.get(name)
        if q is None:
            q = self._kept.make(name, self._new_queue)
        return q

    def _new_queue(self, name: str) -> Queue:
        return Queue(self, name)

    async def scale_total(self, queues: Sequence[str] = (), *, prefix: str | None = None) -> ScaleTotal:
        """The autoscaling signal summed over ``queues`` and the registered queues whose
        name starts with ``prefix`` (``""``: every one): the dashboard's ``GET /api/scale``.

        Raises:
            ConfigurationError: Neither given, a name that is no queue name, or more
                than 10,000 queues to sum.
        """
        from .scale import scale_queues, scale_total

        return await scale_total(self, await scale_queues(self, queues, prefix))

    @property
    def clock(self) -> Callable[[], int] | None:
        """The clock every script is given (None: Redis TIME); see the class docstring."""
        return self.sender.clock

    @clock.setter
    def clock(self, clock: Callable[[], int] | None) -> None:
        self.sender.clock = clock

    def _now_arg(self) -> str:
        """The ``now`` argument of every script: '' means Redis TIME."""
        return self.sender.now()

    async def aclose(self) -> None:
        """Close the connection pool (and the enqueue lane's and the event readers' connections)."""
        for tail in list(self._tails.values()):
            await tail.aclose()
        await self.sender.aclose()
        await self.redis.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Queue(QueueAdmin, QueueFeatures):
    """One named queue: enqueue tasks, read jobs and their journals.

    Get one from ``client.queue(name)`` or ``Queue.from_url(url, name=...)``.
    """

    client: Client  # the mixin's ClientLike, as this class makes it

    def __init__(self, client: Client, name: str = "default") -> None:
        self.client = client
        self.keys = QueueKeys.for_queue(name, client.namespace)
        self.name = name
        # Every script call of this queue: built, sent, parsed (_store/store.py).
        self.store = QueueStore(self.keys, client.sender)
        self._coalescer = Coalescer(self)

    @classmethod
    def from_url(
        cls, url: str | None = None, *, name: str = "default", **options: Unpack[ClientOptions]
    ) -> Queue:
        """Shorthand for ``Client.from_url(url, **options).queue(name)``."""
        return Client.from_url(url, **options).queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} at {redact_url(self.client.url) if self.client.url else 'redis'}>"

    # -- enqueue ---------------------------------------------------------------

    async def enqueue(self, task: Task[Any], **options: Unpack[EnqueueOptions]) -> str:
        """Enqueue one task and return its job id (a ULID).

        ``options`` are ``vr.EnqueueOptions`` (``delay``, ``priority``,
        ``lease``, ``max_failures``, ``timeout``, ``carry``, ``after``,
        ``at``, ...): each is described there. A bad one raises
        ``ConfigurationError`` (or ``TypeError``, for a name no option has)
        with nothing written.

        When the task has a dedup key and a pending job holds it, the task's
        ``merge`` decides, and the id returned is the job that holds the work.
        """
        if options:
            bad = unknown_option(options, ENQUEUE_OPTIONS, "enqueue")
            if bad is not None:
                raise bad
            after = options.pop("after", None)
            at = options.pop("at", None)
            if at is not None:
                at_ms = checked_at(at, options.get("delay", 0.0))
                options["delay"] = max(0, at_ms - await server_now_ms(self.client)) / 1000
            job = prepare(
                task, self.client.max_payload_bytes, self.client.encryption, **cast("PrepareOptions", options)
            )
            if after is not None:
                return await _flow.enqueue_after(self, task, job, after)
        else:
            job = prepare(task, self.client.max_payload_bytes, self.client.encryption)
        if self.client._recorded.due(self.name):  # checked here: no coroutine per enqueue
            await self.client._recorded.record(self.client.redis, self.name)  # registry.py
        holder = await self._coalescer.enqueue(job)
        if not holder:
            return job.id
        return await merge_into(self, task, job, holder)

    async def enqueue_many(
        self, tasks: Sequence[Task[Any]], **options: Unpack[EnqueueManyOptions]
    ) -> list[str]:
        """Enqueue many tasks in one round trip, all or nothing.

        ``options`` are ``vr.EnqueueManyOptions`` (``delay``, ``priority``,
        ``lease``, ``max_failures``, ``timeout``, ...), the same for every job.
        Every task is validated and encoded before anything is sent, so a bad
        task raises with nothing written. The jobs are then created by one
        MULTI/EXEC transaction (chunks of 500 jobs per script call inside it):
        Redis runs it whole or not at all, so an OOM refusal or a connection
        lost before the transaction reached Redis leaves nothing written, and
        an error raised from here (a ``redis.exceptions`` error) means the
        transaction did not run, or, for a connection dropped while it was in
        flight, that it ran whole or not at all (like a single ``enqueue``).
        Redis runs nothing else meanwhile, so a call takes at most
        ``Client(max_batch_jobs=...)`` tasks (10,000) and
        ``max_batch_bytes`` of encoded payloads (32 MiB): a larger one raises
        before anything is sent; split it into several calls.

        Returns the job ids in order. Tasks whose dedup key collides (with a
        pending job, or with an earlier task of the same batch) are merged
        afterwards, in order, as if enqueued one by one.

        Raises:
            ConfigurationError: More tasks than ``Client(max_batch_jobs=...)``
                (nothing encoded, nothing sent), or a bad option.
            PayloadTooLarge: A task's payload over ``max_payload_bytes``, or
                the call's over ``max_batch_bytes`` (nothing sent).
            PartialEnqueueError: Some tasks were enqueued and others not: a
                ``merge`` that raised (or lost its race too often) after the
                jobs were created, a script error inside the transaction
                (Redis does not roll back), or, in durable mode (where the
                chunks go one by one), a chunk that failed after others were
                applied. Its ``ids`` say exactly which tasks hold a job, its
                ``unknown`` which ones nobody can tell; the original error is
                its ``__cause__``.
        """
        bad = unknown_option(options, ENQUEUE_MANY_OPTIONS, "enqueue_many")
        if bad is not None:
            raise bad
        c = self.client
        jobs = prepare_many(
            tasks,
            c.max_payload_bytes,
            c.encryption,
            **options,
            max_jobs=c.max_batch_jobs,
            max_bytes=c.max_batch_bytes,
        )
        return await enqueue_prepared(self, tasks, jobs)

    async def enqueue_flow(self, parent: Task[Any], children: Sequence[Task[Any] | Flow]) -> Flow:
        """Enqueue ``children`` and ``parent`` waiting on all of them, in one atomic step.

        The parent is WAITING until every child has completed, then pending;
        in its run, ``await ctx.dependency_results()`` gives each child's
        result by id. A child given as a ``vr.Flow`` (an earlier
        ``enqueue_flow`` of this queue) is waited on through its parent, so
        flows nest into a tree. All jobs are written or none is
        (docs/workflows.md).

        Raises:
            ConfigurationError: A ``vr.Flow`` child is no job of this queue, or
                a task has a dedup key (nothing written).
        """
        return await _flow.enqueue_flow(self, parent, children)

    # -- reading ---------------------------------------------------------------

    async def get(self, job_id: str) -> JobInfo | None:
        """A snapshot of the job, or ``None`` if no such job exists (or was purged).

        ``waiting_on`` and ``dependents`` (workflows) are read in the same
        transaction as the hash.
        """
        from . import reads as _reads  # a reading: not imported at a worker's start (issue 42)

        return await _reads.get_job(self, job_id)

    async def journal(self, job_id: str) -> list[JournalEntry]:
        """The job's journal, oldest first (empty if the job is unknown)."""
        # What the job's hash says is not written to its stream (its
        # `enqueued` entry, each run's claim: lua/include/journal.lua); it is
        # put back from the hash, read in the same round trip (journal_from).
        pipe = self.client.redis.pipeline(transaction=True)
        pipe.xrange(self.keys.journal(job_id))
        pipe.hmget(self.keys.job(job_id), *JOURNAL_FIELDS)
        raw, job_fields = await pipe.execute()
        entries = journal_from(raw, job_fields)
        crypt = self.client.encryption
        return [JournalEntry.from_stream(entry_id, fields, crypt) for entry_id, fields in entries]

    # -- continuations -----------------------------------------------------------

    async def resume(self, job_id: str, value: Any = None) -> int:
        """Resume a suspended job with ``value`` (any pydantic-serializable value).

        The value is stored, the job moves to pending and a worker is woken.
        Returns 1, or 0 when ``job_id`` is not a suspended job of this queue
        (unknown, pending, running or finished).

        Raises:
            CorruptQueueError: The job's own data is corrupt (its key not a
                hash, its journal not a stream, no state, a bad priority);
                nothing was written.
        """
        raw = pack(value)
        if len(raw) > self.client.max_payload_bytes:
            raise PayloadTooLarge(
                f"resume value for job {job_id} is {len(raw)} bytes, over the cap of "
                f"{self.client.max_payload_bytes}"
            )
        if self.client.encryption is not None:  # after the cap's check, as at enqueue
            raw = self.client.encryption.seal(raw)
        return int((await self.store.resume(job_id, raw)).applied)
