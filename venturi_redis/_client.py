"""The producer side: ``Client`` (a connection) and ``Queue`` (one named queue).

Nothing here imports the worker: a web process that only enqueues stays light.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import anyio
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._backoff import to_ms
from ._codec import model_packer, pack, pack_model
from ._durable import Durability, DurableRedis, NotDurableError, as_durability
from ._enums import PRIORITIES_HIGH_FIRST, JobState, Priority
from ._errors import ConfigurationError, PartialEnqueueError, PayloadTooLarge, TaskDefinitionError
from ._ids import new_job_id, new_job_ids
from ._keys import QueueKeys, dedup_field
from ._outcome import UNSET
from ._records import ENQUEUED_FIELDS, JobInfo, JournalEntry, journal_from
from ._scripts import ScriptArg, ScriptSet, scripts
from ._task import Task

if TYPE_CHECKING:
    from ._ops import QueueStats

DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB of encoded payload (or carry) per job
_DEDUP_KEY_MAX = 1024
# Jobs per enqueue script call; the chunks of a batch go out in one MULTI/EXEC.
_ENQUEUE_CHUNK = 500


def _default_url() -> str:
    return os.environ.get("REDIS_URL") or "memory://"


class Client:
    """A connection to one Redis (or the embedded ``memory://`` server).

    Args:
        redis: A ``redis.asyncio.Redis`` (or fakeredis) client with
            ``decode_responses=False``.
        namespace: The first part of every key (``venturi`` by default).
        max_payload_bytes: Largest encoded payload or carry accepted, checked
            before anything is sent to Redis.
        clock: Milliseconds-since-epoch source passed to every script. ``None``
            (the default) lets each script read Redis ``TIME``, so every pod
            shares the server's clock and skew between pods cannot matter.
        durable: Durable mode (``vr.Durability``, or a replica count): every
            transition returns only once that many replicas acknowledged it
            (WAIT on the same connection); see docs/cluster.md.
    """

    def __init__(
        self,
        redis: Any,
        *,
        namespace: str = "venturi",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], int] | None = None,
        url: str = "",
        durable: Durability | int | None = None,
    ) -> None:
        if max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be >= 1, got {max_payload_bytes}")
        # Durable mode wraps the connection: each EVALSHA goes out with a WAIT.
        self.durability = as_durability(durable)
        if self.durability is not None:
            redis = DurableRedis(redis, self.durability)
        self.redis = redis
        self.namespace = namespace
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.url = url
        self.scripts: ScriptSet = scripts()
        self._queues: dict[str, Queue] = {}
        QueueKeys.for_queue("probe", namespace)  # validates the namespace now

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> Client:
        """Connect to ``redis://``, ``rediss://``, ``unix://`` or ``memory://[name]``.

        ``url=None`` reads ``REDIS_URL`` and falls back to ``memory://``, the
        embedded in-process server (nothing survives the process).

        Redis Cluster: ``redis+cluster://host:port[,host:port...]`` (or
        ``rediss+cluster://``), or any ``redis://`` URL with ``cluster=True``.
        Everything else is unchanged; see docs/cluster.md.
        """
        url = url or _default_url()
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        # Redis Cluster (docs/cluster.md): a RedisCluster client; each queue's
        # keys share the hash tag {queue}, so every script stays in one slot.
        if options.pop("cluster", False) or scheme.endswith("+cluster"):
            from ._cluster import cluster_redis

            return cls(cluster_redis(url), url=url, **options)
        if scheme == "memory":
            from ._memory import memory_redis

            return cls(memory_redis(url), url=url, **options)
        if scheme in ("redis", "rediss", "unix"):
            import redis.asyncio as aioredis

            # Every command waits at most 5 s for its reply: a connection that
            # went silent (a half-open TCP connection, a hung server) then fails
            # and is replaced instead of hanging a worker's claim loop forever.
            # redis-py >= 6 has this default; 5.x waits forever. A
            # ``?socket_timeout=`` in the URL wins.
            extra: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
            if scheme == "redis":
                from ._fastpack import fast_connection_class

                if (conn_cls := fast_connection_class()) is not None:
                    extra["connection_class"] = conn_cls
            return cls(aioredis.Redis.from_url(url, decode_responses=False, **extra), url=url, **options)
        raise ConfigurationError(
            f"unsupported URL {url!r}: use redis://host:port/db, rediss://, unix://, memory:// "
            "or redis+cluster://host:port"
        )

    def queue(self, name: str = "default") -> Queue:
        """The queue called ``name`` (one object per name per client)."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = Queue(self, name)
        return q

    def now_arg(self) -> str:
        """The ``now`` argument of every script: '' means Redis TIME."""
        return "" if self.clock is None else str(int(self.clock()))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.redis.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Prepared(NamedTuple):
    """One job, checked and encoded, ready for ``enqueue.lua``.

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

    def args(self) -> list[ScriptArg]:
        return [
            self.id,
            self.kind,
            self.priority.label,
            self.delay_ms,
            self.payload,
            self.carry,
            self.lease_ms,
            self.max_failures,
            self.dedup,
        ]


@dataclass(eq=False, slots=True)
class _Waiting:
    """One ``enqueue`` call waiting for (or leading) a shared script call."""

    job: _Prepared
    done: anyio.Event
    lead: bool = False  # this call sends the next batch
    sent: bool = False  # its job is in a batch on its way (it can no longer be withdrawn)
    settled: bool = False
    holder: str = ""
    error: Exception | None = None


class _Coalescer:
    """Concurrent single enqueues of one queue share script calls.

    A call made while no enqueue of this queue is in flight goes out at once,
    alone: a sequential producer pays nothing extra. Calls made while one is
    in flight wait, and the first of them then sends all of them (up to 500)
    as one ``enqueue.lua`` call: one round trip and one script for a burst of
    a web server's requests, with each call's own result (its job created, or
    the holder of its dedup key for it to merge into) and each call's own
    error. A call that sends a batch for the others is shielded from
    cancellation until the reply is in, because they depend on it; a call
    cancelled while it still waits is withdrawn, with nothing written.
    """

    __slots__ = ("_queue", "_sending", "_waiting")

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._sending = False
        self._waiting: deque[_Waiting] = deque()

    async def enqueue(self, job: _Prepared) -> str:
        """Enqueue ``job``; returns '' when it was created, else the holder of its dedup key."""
        if not self._sending:
            # Nothing in flight: this call goes out alone, at once. Calls made
            # meanwhile queue up, and the first of them is handed the lead.
            self._sending = True
            try:
                q = self._queue
                name, keys, args = q._enqueue_call([job])
                res = await q.client.scripts.call(q.client.redis, name, keys, args)
                return _text(res[1])
            finally:
                self._pass_lead()
        me = _Waiting(job, anyio.Event())
        self._waiting.append(me)
        try:
            await me.done.wait()
        except BaseException:
            if not me.sent:  # never left this process: withdraw it
                if me in self._waiting:
                    self._waiting.remove(me)
                if me.lead:
                    self._pass_lead()
            raise
        if me.lead:
            try:
                while not me.settled:
                    await self._send_batch()
            finally:
                self._pass_lead()
        if me.error is not None:
            raise me.error
        return me.holder

    async def _send_batch(self) -> None:
        batch = [self._waiting.popleft() for _ in range(min(len(self._waiting), _ENQUEUE_CHUNK))]
        for w in batch:
            w.sent = True
        q = self._queue
        name, keys, args = q._enqueue_call([w.job for w in batch])
        try:
            with anyio.CancelScope(shield=True):
                res = await q.client.scripts.call(q.client.redis, name, keys, args)
            for w, holder in zip(batch, res[1:], strict=True):
                w.holder = _text(holder)
        except Exception as exc:  # noqa: BLE001 - each call of the batch raises what it would have alone
            for w in batch:
                w.error = exc
        except BaseException:  # KeyboardInterrupt and the like, in the sender: the others must not hang
            for w in batch:
                w.error = RedisConnectionError(
                    "the enqueue call carrying this job was interrupted in another caller; "
                    "whether the job was created is unknown"
                )
            raise
        finally:
            for w in batch:
                w.settled = True
                w.done.set()

    def _pass_lead(self) -> None:
        if self._waiting:
            nxt = self._waiting[0]
            nxt.lead = True
            nxt.done.set()
        else:
            self._sending = False


class Queue:
    """One named queue: enqueue tasks, read jobs and their journals.

    Get one from ``client.queue(name)`` or ``Queue.from_url(url, name=...)``.
    """

    def __init__(self, client: Client, name: str = "default") -> None:
        self.client = client
        self.keys = QueueKeys.for_queue(name, client.namespace)
        self.name = name
        self._coalescer = _Coalescer(self)

    @classmethod
    def from_url(cls, url: str | None = None, *, name: str = "default", **options: Any) -> Queue:
        """Shorthand for ``Client.from_url(url, **options).queue(name)``."""
        return Client.from_url(url, **options).queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} at {self.client.url or 'redis'}>"

    # -- enqueue ---------------------------------------------------------------

    def _prepare(
        self,
        task: Task[Any],
        *,
        delay: float | timedelta,
        priority: Priority | int | str | None,
        lease: float | timedelta | None,
        max_failures: int | None,
        carry: BaseModel | None,
    ) -> _Prepared:
        if not isinstance(task, Task):
            raise TaskDefinitionError(f"enqueue expects a vr.Task instance, got {type(task).__name__}")
        kind = type(task).kind()
        payload = pack_model(task)
        cap = self.client.max_payload_bytes
        if len(payload) > cap:
            raise _payload_too_large(kind, len(payload), cap)
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
        prio = Priority.parse(priority) if priority is not None else Priority.parse(task.priority())
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
        elif isinstance(max_failures, int) and max_failures >= 1:
            maxf = str(max_failures)
        else:
            raise ConfigurationError(f"max_failures must be an int >= 1 or None, got {max_failures!r}")
        key = task.dedup_key()
        field = ""
        if key is not None:
            field = self._dedup_field(kind, key)
        return _Prepared(
            id=new_job_id(),
            kind=kind,
            priority=prio,
            delay_ms=to_ms(delay, "delay"),
            payload=payload,
            carry=carry_bytes,
            lease_ms=lease_ms,
            max_failures=maxf,
            dedup=field,
            explicit_priority=priority is not None,
        )

    def _prepare_many(
        self,
        tasks: Sequence[Task[Any]],
        *,
        delay: float | timedelta,
        priority: Priority | int | str | None,
        lease: float | timedelta | None,
        max_failures: int | None,
    ) -> list[_Prepared]:
        """``_prepare`` of each task (no carry), with the per-call work done once.

        The first task goes through ``_prepare`` itself, so the call's arguments
        are checked there, in its order, raising what ``enqueue`` would. The
        others reuse what it worked out and check only what is their own, in the
        same order: the type, KIND (once per class), payload size, priority and
        dedup key. Their ids come from one ``new_job_ids`` call, after the first.
        """
        if not tasks:
            return []
        first = self._prepare(
            tasks[0], delay=delay, priority=priority, lease=lease, max_failures=max_failures, carry=None
        )
        jobs = [first]
        kinds: dict[type[Task[Any]], str] = {}
        pack = model_packer()
        cap = self.client.max_payload_bytes
        prio, delay_ms, explicit = first.priority, first.delay_ms, first.explicit_priority
        for job_id, task in zip(new_job_ids(len(tasks) - 1), tasks[1:], strict=True):
            if not isinstance(task, Task):
                raise TaskDefinitionError(f"enqueue expects a vr.Task instance, got {type(task).__name__}")
            cls = type(task)
            kind = kinds.get(cls)
            if kind is None:
                kind = kinds[cls] = cls.kind()
            payload = pack(task)
            if len(payload) > cap:
                raise _payload_too_large(kind, len(payload), cap)
            if not explicit:
                prio = Priority.parse(task.priority())
            key = task.dedup_key()
            field = "" if key is None else self._dedup_field(kind, key)
            # Positional, in _Prepared's field order: keywords double the cost
            # of this line. The tests read every field back from Redis.
            jobs.append(
                _Prepared(
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
                )
            )
        return jobs

    @staticmethod
    def _dedup_field(kind: str, key: object) -> str:
        if not isinstance(key, str):
            raise TaskDefinitionError(f"{kind}.dedup_key() must return str or None, got {type(key).__name__}")
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ConfigurationError(f"{kind} dedup key is not valid UTF-8 text: {exc}") from None
        if not 1 <= size <= _DEDUP_KEY_MAX:
            raise ConfigurationError(
                f"{kind} dedup key must be 1 to {_DEDUP_KEY_MAX} bytes of UTF-8, "
                f"got {size} bytes; hash a longer key yourself"
            )
        return dedup_field(kind, key)

    def _enqueue_call(
        self,
        jobs: Sequence[_Prepared],
        dedup_mode: str = "nx",
        offload: Sequence[tuple[str, int]] = (),
    ) -> tuple[str, list[str], list[ScriptArg]]:
        keys: list[str] = [self.keys.dedup]
        args: list[ScriptArg] = [self.client.now_arg(), self.keys.wake, len(jobs), dedup_mode]
        for job in jobs:
            keys += [self.keys.job(job.id), self.keys.journal(job.id), self.keys.pending(job.priority)]
            args += job.args()
        # @vr.offload: one (token, retention ms) per job; the script writes each
        # job's pending snapshot in the same atomic step as the job.
        for token, retention_ms in offload:
            keys.append(self.keys.offload(token))
            args += [token, retention_ms]
        return ("enqueue", keys, args)

    async def _enqueue_offload(
        self,
        task: Task[Any],
        *,
        token: str,
        retention_ms: int,
        priority: Priority | int | str | None,
        lease: float | timedelta | None,
        max_failures: int | None,
    ) -> str:
        """Enqueue an ``@vr.offload`` call with its pending snapshot (see ``_offload.py``)."""
        job = self._prepare(
            task, delay=0.0, priority=priority, lease=lease, max_failures=max_failures, carry=None
        )
        if job.dedup:  # a merge would leave the snapshot describing no job
            raise TaskDefinitionError(f"{job.kind}: an offload task cannot have a dedup key")
        name, keys, args = self._enqueue_call([job], offload=[(token, retention_ms)])
        await self.client.scripts.call(self.client.redis, name, keys, args)
        return job.id

    async def enqueue(
        self,
        task: Task[Any],
        *,
        delay: float | timedelta = 0.0,
        priority: Priority | int | str | None = None,
        lease: float | timedelta | None = None,
        max_failures: int | None = UNSET,
        carry: BaseModel | None = None,
    ) -> str:
        """Enqueue one task and return its job id (a ULID).

        Args:
            task: The task (its KIND, payload, priority and dedup key).
            delay: Seconds (or a timedelta) before the job becomes eligible.
            priority: Overrides ``task.priority()``.
            lease: Lease for this job's runs, for work known to run long.
            max_failures: Overrides the worker's retry backstop; ``None`` disables it.
            carry: Initial carry (an instance of the task's carry model).

        When the task has a dedup key and a pending job holds it, the task's
        ``merge`` decides, and the id returned is the job that holds the work.
        """
        job = self._prepare(
            task, delay=delay, priority=priority, lease=lease, max_failures=max_failures, carry=carry
        )
        holder = await self._coalescer.enqueue(job)
        if not holder:
            return job.id
        from ._dedup import merge_into

        return await merge_into(self, task, job, holder)

    async def enqueue_many(
        self,
        tasks: Sequence[Task[Any]],
        *,
        delay: float | timedelta = 0.0,
        priority: Priority | int | str | None = None,
        lease: float | timedelta | None = None,
        max_failures: int | None = UNSET,
    ) -> list[str]:
        """Enqueue many tasks in one round trip, all or nothing.

        Every task is validated and encoded before anything is sent, so a bad
        task raises with nothing written. The jobs are then created by one
        MULTI/EXEC transaction (chunks of 500 jobs per script call inside it):
        Redis runs it whole or not at all, so an OOM refusal or a connection
        lost before the transaction reached Redis leaves nothing written, and
        an error raised from here (a ``redis.exceptions`` error) means the
        transaction did not run, or, for a connection dropped while it was in
        flight, that it ran whole or not at all (like a single ``enqueue``).
        Redis runs nothing else meanwhile: split very large batches yourself.

        Returns the job ids in order. Tasks whose dedup key collides (with a
        pending job, or with an earlier task of the same batch) are merged
        afterwards, in order, as if enqueued one by one.

        Raises:
            PartialEnqueueError: Some tasks were enqueued and others not: a
                ``merge`` that raised (or lost its race too often) after the
                jobs were created, a script error inside the transaction
                (Redis does not roll back), or, in durable mode (where the
                chunks go one by one), a chunk that failed after others were
                applied. Its ``ids`` say exactly which tasks hold a job, its
                ``unknown`` which ones nobody can tell; the original error is
                its ``__cause__``.
        """
        jobs = self._prepare_many(
            tasks, delay=delay, priority=priority, lease=lease, max_failures=max_failures
        )
        if not jobs:
            return []
        chunks = [jobs[i : i + _ENQUEUE_CHUNK] for i in range(0, len(jobs), _ENQUEUE_CHUNK)]
        calls = [self._enqueue_call(chunk) for chunk in chunks]
        scripts_, redis = self.client.scripts, self.client.redis
        replies: list[Any]
        if len(calls) == 1:
            try:
                replies = [await scripts_.call(redis, *calls[0])]
            except Exception as exc:  # noqa: BLE001 - sorted out below, like an error inside EXEC
                replies = [exc]
        else:
            replies = await scripts_.run_transaction(redis, calls)
        ids: list[str | None] = [None] * len(jobs)
        holders = [""] * len(jobs)
        unknown: list[int] = []
        failure: Exception | None = None
        to_probe: list[int] = []
        for c, reply in enumerate(replies):
            base = c * _ENQUEUE_CHUNK
            if isinstance(reply, Exception):
                failure = failure or reply
                if _lost_in_flight(reply):
                    unknown += range(base, base + len(chunks[c]))
                else:
                    to_probe += range(base, base + len(chunks[c]))
                continue
            for k, raw in enumerate(reply[1:]):
                holder = _text(raw)
                if holder:
                    holders[base + k] = holder
                else:
                    ids[base + k] = jobs[base + k].id
        if failure is not None:
            # A script that failed may have created some of its jobs before the
            # error (scripts do not roll back): ids are fresh, so a job hash
            # that exists is one this call wrote.
            unknown += await self._probe_created(jobs, to_probe, ids)
            self._raise_partial(ids, unknown, failure)
        collided = [i for i, h in enumerate(holders) if h]
        if collided:
            from ._dedup import merge_into

            for i in collided:
                try:
                    ids[i] = await merge_into(self, tasks[i], jobs[i], holders[i])
                except Exception as exc:  # noqa: BLE001 - re-raised, with what was written
                    self._raise_partial(ids, [], exc)
        return [job_id for job_id in ids if job_id is not None]

    async def _probe_created(
        self, jobs: Sequence[_Prepared], positions: list[int], ids: list[str | None]
    ) -> list[int]:
        """Fill ``ids`` for the jobs at ``positions`` that exist; returns the positions left unknown."""
        if not positions:
            return []
        pipe = self.client.redis.pipeline(transaction=False)
        for i in positions:
            pipe.exists(self.keys.job(jobs[i].id))
        try:
            found = await pipe.execute()
        except Exception:  # noqa: BLE001 - Redis gone too: nobody can tell
            return positions
        for i, exists in zip(positions, found, strict=True):
            if exists:
                ids[i] = jobs[i].id
        return []

    def _raise_partial(self, ids: list[str | None], unknown: list[int], cause: Exception) -> NoReturn:
        """Raise ``cause`` when the outcome is uniform (nothing written, or all unknown), else
        a ``PartialEnqueueError`` that says which tasks were enqueued."""
        if not unknown and all(job_id is None for job_id in ids):
            raise cause  # nothing written: exactly what a single enqueue would raise
        if len(unknown) == len(ids):
            raise cause  # one call lost in flight: all or nothing, like a single enqueue
        raise PartialEnqueueError(self.name, ids, unknown, cause) from cause

    # -- reading ---------------------------------------------------------------

    async def get(self, job_id: str) -> JobInfo | None:
        """A snapshot of the job, or ``None`` if no such job exists (or was purged)."""
        raw = await self.client.redis.hgetall(self.keys.job(job_id))
        if not raw:
            return None
        return JobInfo.from_hash(self.name, raw)

    async def journal(self, job_id: str) -> list[JournalEntry]:
        """The job's journal, oldest first (empty if the job is unknown)."""
        # A job nothing has touched since enqueue has no stream yet: its
        # `enqueued` entry is made from the hash (journal_from), read in the same
        # round trip.
        pipe = self.client.redis.pipeline(transaction=True)
        pipe.xrange(self.keys.journal(job_id))
        pipe.hmget(self.keys.job(job_id), *ENQUEUED_FIELDS)
        raw, job_fields = await pipe.execute()
        entries = journal_from(raw, job_fields)
        return [JournalEntry.from_stream(entry_id, fields) for entry_id, fields in entries]

    async def counts(self) -> dict[str, int]:
        """Jobs per state: ``pending:<level>`` for each priority, then the other sets."""
        pipe = self.client.redis.pipeline(transaction=False)
        for p in PRIORITIES_HIGH_FIRST:
            pipe.zcard(self.keys.pending(p))
        for key in (self.keys.running, self.keys.suspended, self.keys.completed, self.keys.dead):
            pipe.zcard(key)
        res = await pipe.execute()
        out = {f"pending:{p.label}": int(n) for p, n in zip(PRIORITIES_HIGH_FIRST, res[:4], strict=True)}
        out["pending"] = sum(res[:4])
        for state, n in zip(
            (JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETED, JobState.DEAD), res[4:], strict=True
        ):
            out[state.value] = int(n)
        return out

    async def is_drained(self) -> bool:
        """Nothing pending (delayed and retry-waiting included) and nothing running."""
        pipe = self.client.redis.pipeline(transaction=False)
        for p in PRIORITIES_HIGH_FIRST:
            pipe.zcard(self.keys.pending(p))
        pipe.zcard(self.keys.running)
        counts: list[int] = await pipe.execute()
        return sum(counts) == 0

    # -- continuations -----------------------------------------------------------

    async def resume(self, job_id: str, value: Any = None) -> int:
        """Resume a suspended job with ``value`` (any pydantic-serializable value).

        The value is stored, the job moves to pending and a worker is woken.
        Returns 1, or 0 when ``job_id`` is not a suspended job of this queue
        (unknown, pending, running or finished).
        """
        raw = pack(value)
        if len(raw) > self.client.max_payload_bytes:
            raise PayloadTooLarge(
                f"resume value for job {job_id} is {len(raw)} bytes, over the cap of "
                f"{self.client.max_payload_bytes}"
            )
        res = await self.client.scripts.call(
            self.client.redis,
            "resume",
            [self.keys.job(job_id), self.keys.journal(job_id), self.keys.suspended, self.keys.dedup],
            [job_id, self.client.now_arg(), raw, self.keys.prefix, self.keys.wake],
        )
        return int(res)

    # -- operations (issue 5): thin delegations to _ops.py; the CLI calls these -----

    async def stats(self) -> QueueStats:
        """Counts per state and priority, lag and completions in the last minute."""
        from . import _ops

        return await _ops.stats(self)

    async def list_jobs(
        self, *, state: JobState | str | None = None, kind: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """Jobs read from the index zsets, optionally of one state and KIND (see ``_ops.list_jobs``)."""
        from . import _ops

        return await _ops.list_jobs(self, state=state, kind=kind, limit=limit)

    async def retry(self, job_id: str) -> bool:
        """Move a dead job back to pending with its failures reset; False if it is not dead."""
        from . import _ops

        return await _ops.retry(self, job_id)

    async def retry_dead(self, *, kind: str | None = None, limit: int | None = None) -> list[str]:
        """Move dead jobs (all, or of one KIND, at most ``limit``) back to pending; returns their ids."""
        from . import _ops

        return await _ops.retry_dead(self, kind=kind, limit=limit)

    async def cancel(self, job_id: str) -> str:
        """Cancel a job: ``"cancelled"`` (it was pending or suspended), ``"requested"``
        (it is running: its handler is asked to stop and the run ends cancelled),
        ``"not_found"`` or ``"finished"`` (nothing done)."""
        from . import _ops

        result, _ = await _ops.cancel(self, job_id)
        return result

    async def pause(self) -> None:
        """Pause claims on this queue (atomic; running jobs finish, enqueues still land)."""
        from . import _ops

        await _ops.pause(self)

    async def resume_queue(self) -> None:
        """Let workers claim from this queue again (and wake them)."""
        from . import _ops

        await _ops.resume_queue(self)

    async def purge(self, state: str, *, older_than: float | timedelta = 0.0) -> int:
        """Remove finished jobs (``completed``, ``dead`` or ``cancelled``) and their journals."""
        from . import _ops

        return await _ops.purge(self, state, older_than=older_than)


def _lost_in_flight(exc: Exception) -> bool:
    """A call that failed with no reply from Redis: it may or may not have run."""
    if isinstance(exc, NotDurableError):
        return False  # applied: only the replicas' acknowledgement is missing
    return isinstance(exc, (RedisConnectionError, RedisTimeoutError))


def _payload_too_large(kind: str, size: int, cap: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{kind} payload is {size} bytes encoded, over the cap of {cap} "
        "(Client(max_payload_bytes=...)); store large data elsewhere and enqueue a reference"
    )


def _text(value: Any) -> str:
    if value is None or value is False:
        return ""
    return value.decode() if isinstance(value, bytes) else value
