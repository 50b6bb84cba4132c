"""Every Redis key venturi_redis uses is built here, and only here.

All keys of one queue share the hash tag ``{<queue>}`` so that a queue lives in
one Redis Cluster slot and every script and MULTI touches a single slot.

=================================  ======  ===========================================
key                                type    what it holds
=================================  ======  ===========================================
``venturi:{q}:job:<id>``           hash    one job: plain-text metadata, msgpack blobs
``venturi:{q}:journal:<id>``       stream  the job's journal: what its hash cannot say
``venturi:{q}:journal-compact``    stream  journal compaction's scratch, and the slot guard (keys.lua)
``venturi:{q}:pending:<level>``    zset    pending job ids scored by eligible_at (ms)
``venturi:{q}:retrying``           zset    pending ids whose last run failed, by eligible_at
``venturi:{q}:expiring``           zset    ids of jobs with a start deadline, by expires_at
``venturi:{q}:running``            zset    running job ids scored by lease expiry (ms)
``venturi:{q}:suspended``          zset    suspended job ids scored by suspension time
``venturi:{q}:completed``          zset    completed job ids scored by finish time
``venturi:{q}:dead``               zset    dead job ids scored by time of death
``venturi:{q}:cancelled``          zset    cancelled job ids scored by cancel time
``venturi:{q}:dedup``              hash    dedup field -> id of the pending job holding it
``venturi:{q}:dedup:held``         zset    throttled dedup fields, by when the reclaim looks again
``venturi:{q}:meta``               hash    queue-wide flags: paused, events, limits, retention
``venturi:{q}:events``             stream  the queue's events, capped (lua/include/events.lua)
``venturi:{q}:wake``               list    wake-up tokens: one per job made claimable
``venturi:{q}:wake:<worker>``      list    a worker's stop tokens (only while it stops)
``venturi:{q}:offload:<token>``    hash    an offload's result snapshot (``status``...)
``venturi:{q}:waiting``            zset    WAITING job ids (workflows) scored by enqueue time
``venturi:{q}:deps:<id>``          set     ids a waiting job still waits on
``venturi:{q}:dependents:<id>``    set     ids of the jobs that wait (or waited) on this job
``venturi:{q}:depresults:<id>``    hash    dependency id -> its KIND, newline, msgpack result
``venturi:{q}:graph:orphans``      set     finished ids whose dependents the reclaim tells
``venturi:{q}:workers``            zset    running worker names scored by registration expiry
``venturi:{q}:worker:<name>``      string  a running worker's record (JSON), expires unless renewed
``venturi:{q}:schedules``          set     every schedule id of the queue (paused and ended ones too)
``venturi:{q}:schedules:due``      zset    active schedule ids scored by their next fire time (ms)
``venturi:{q}:schedule:<id>``      hash    one schedule: its task, timing, next and last fire
``venturi:{q}:schedules:wake``     list    one token after a schedule was created or resumed
``venturi:{q}:limits``             hash    kind -> its limits (flow control, lua/include/limits.lua)
``venturi:{q}:limits:state``       hash    running counts per kind and key, rate windows
``venturi:{q}:limits:parked``      zset    jobs waiting on a limit, lex-ordered by kind, key, priority
``venturi:{q}:limits:ready``       zset    limited kinds/keys with parked jobs, by when they may run
``venturi:{q}:limits:rings``       zset    per-key rate rings left open, by when their window closes
``venturi:{q}:order:held``         hash    order key -> id of the job holding it (ordered keys)
``venturi:{q}:order:queue``        zset    jobs waiting on their order key, lex: key, 0xff, seq, id
``venturi:{q}:order:paused``       set     order keys an operator paused (``queue.pause_key``)
``venturi:{q}:order:seq``          string  the counter of ``order:queue``'s sequence numbers
``venturi:{q}:order:ended``        set     ordered jobs the claim ended, whose keys the reclaim lets go
``venturi:{q}:history:m:<s>``      hash    metrics history of the minute starting at <s> (epoch s):
                                           ``<kind>\t<counter>`` -> count (lua/include/history.lua)
``venturi:{q}:history:h:<s>``      hash    the same for the hour starting at <s>
=================================  ======  ===========================================

Pub/sub channel ``venturi:{q}:offload:<token>:done`` carries the redacted
wake-up published when an offload snapshot settles (completed or failed).

Two keys belong to no queue, and so carry no hash tag (each lives in the slot
of its own name, on whichever Cluster master owns it; nothing writes them
together with a queue's keys, so no script or MULTI ever spans both):

=================================  ======  ===========================================
``venturi:queues``                 zset    the registry: queue name -> when a process last
                                           recorded writing to it (ms, that process's clock)
``venturi:queues:rebuild``         string  ``venturi queues rebuild``'s progress (JSON): a SCAN
                                           cursor per node, so an interrupted run resumes
=================================  ======  ===========================================

``docs/redis-layout.md`` is the long form of this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .._model.enums import PRIORITIES_HIGH_FIRST, Priority
from .._model.errors import ConfigurationError

# Queue names become part of every key. They are restricted to characters that
# can neither break the hash tag (``{`` / ``}``) nor be mistaken for our own
# separators or glob patterns in a SCAN, so a name can never alias another queue.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
NAME_RULE = "1 to 128 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit"


# Most wake-up tokens a queue's wake list holds: lua/include/wake.lua's
# WAKE_CAP (tests/test_wake.py checks they agree).
WAKE_CAP = 1024


def validate_name(value: str, what: str = "queue name") -> str:
    """Return ``value`` if it is a valid queue name or key prefix, else raise."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ConfigurationError(f"invalid {what} {value!r}: use {NAME_RULE}")
    return value


def is_queue_name(value: str) -> bool:
    """Whether ``value`` is a valid queue name (``validate_name`` without the error)."""
    return bool(_NAME_RE.fullmatch(value))


def registry_key(namespace: str = "venturi") -> str:
    """The registry of queues (``_producer/registry.py`` writes it, ``discovery.py`` reads it).

    No hash tag: it is one key for every queue of the namespace, so it cannot
    live in any queue's slot, and ``{`` never appears in it, so it can never
    be taken for a queue's key (a queue name holds no ``{``, ``}`` or ``:``).
    """
    return f"{namespace}:queues"


def rebuild_key(namespace: str = "venturi") -> str:
    """The progress of ``venturi queues rebuild`` (``_producer/rebuild.py``): cursors per node."""
    return f"{namespace}:queues:rebuild"


def metrics_gauges_key(group: str, namespace: str = "venturi") -> str:
    """Which worker exports the queue gauges of a set of queues (``venturi worker
    --metrics-gauges elected``, ``_worker/metrics.py``): a string, the holder's id, with a
    TTL. ``group`` is a digest of the set's names, so pods serving the same queues share it."""
    return f"{namespace}:metrics:gauges:{group}"


def queue_keys_match(namespace: str = "venturi") -> str:
    """The SCAN pattern of every key of every queue of the namespace (the rebuild's one SCAN)."""
    return f"{namespace}:{{*}}:*"


def queue_of_key(key: str, namespace: str = "venturi") -> str | None:
    """The queue a key belongs to (``venturi:{q}:...`` -> ``q``), or None for any other key."""
    head = f"{namespace}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}:", len(head))
    name = key[len(head) : end] if end > 0 else ""
    return name if _NAME_RE.fullmatch(name) else None


def dedup_field(kind: str, key: str) -> str:
    """The dedup-index hash field for ``(kind, key)``.

    The kind is length-prefixed, so no choice of kind and key can produce the
    field of another pair, whatever characters either contains.
    """
    return f"{len(kind)}:{kind}:{key}"


def limit_field(key: str) -> str:
    """A limit key as a job's ``limit_key`` field holds it: ``<bytes>:<key>``.

    Length-prefixed, so a key holding a tab (the separator of the limit
    structures, docs/redis-layout.md) names no other key's entries.
    """
    return f"{len(key.encode('utf-8'))}:{key}"


def limit_key_of(field: bytes) -> str | None:
    """The limit key a ``limit_field`` (as bytes) holds: ``limit_field``'s inverse.

    ``b""`` is a job without a key (None). Anything else must be exactly
    ``<bytes>:<key>`` as ``limit_field`` writes it (no leading zero, the
    length exact, UTF-8), or ValueError: the limits structures' other fields
    after a kind's tab (a rate ring's ``#...``, the ``+`` and ``!`` flags, or
    an entity's ring ``<field>\t#...``) are no key, and are told apart by
    this, never by guessing.
    """
    if not field:
        return None
    size, sep, rest = field.partition(b":")
    if not sep or not size.isdigit() or (size[:1] == b"0" and len(size) > 1) or int(size) != len(rest):
        raise ValueError(f"not a limit key field: {field[:80]!r}")
    try:
        return rest.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"not a limit key field (not UTF-8): {field[:80]!r}") from None


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key names of one queue. Scripts derive job keys from ``prefix`` only.

    The queue-wide keys are plain attributes, formatted once here: a single
    enqueue reads three of them, and a property would format each per read.
    """

    name: str
    prefix: str  # "venturi:{name}:" -- passed to scripts that discover job ids
    running: str = field(init=False)
    suspended: str = field(init=False)
    completed: str = field(init=False)
    dead: str = field(init=False)
    cancelled: str = field(init=False)
    dedup: str = field(init=False)
    # Throttled dedup fields (lua/include/keys.lua dedup_held_key).
    dedup_held: str = field(init=False)
    meta: str = field(init=False)
    wake: str = field(init=False)
    events: str = field(init=False)
    waiting: str = field(init=False)
    # The pending jobs whose last run failed (lua/include/keys.lua retrying_key).
    retrying: str = field(init=False)
    # The jobs with a start deadline (lua/include/keys.lua feature_keys).
    expiring: str = field(init=False)
    limits: str = field(init=False)
    limits_state: str = field(init=False)
    limits_parked: str = field(init=False)
    limits_ready: str = field(init=False)
    # Per-key rate rings waiting for their window to close (lua/include/limits.lua rest).
    limits_rings: str = field(init=False)
    # Ordered keys (lua/include/keys.lua feature_keys, lua/include/order.lua).
    order_held: str = field(init=False)
    order_queue: str = field(init=False)
    order_paused: str = field(init=False)
    order_seq: str = field(init=False)
    order_ended: str = field(init=False)
    # The scratch key a journal is copied through at its exact size (keys.lua
    # journal_scratch_key), absent between script calls. Every script but
    # enqueue declares it, last (calls.py, "the slot guard"): while the
    # queue's Cluster slot moves, Redis then refuses the call before it runs.
    journal_compact: str = field(init=False)
    # Pending sets by priority, and from CRITICAL down to LOW (the order a claim scans them).
    pending_by_priority: dict[Priority, str] = field(init=False, compare=False, repr=False)
    pending_high_first: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        p = self.prefix
        for suffix in (
            "running",
            "suspended",
            "completed",
            "dead",
            "cancelled",
            "dedup",
            "meta",
            "wake",
            "events",
            "waiting",
            "retrying",
            "expiring",
        ):
            object.__setattr__(self, suffix, f"{p}{suffix}")
        object.__setattr__(self, "dedup_held", f"{p}dedup:held")
        object.__setattr__(self, "journal_compact", f"{p}journal-compact")
        for suffix in ("state", "parked", "ready", "rings"):
            object.__setattr__(self, f"limits_{suffix}", f"{p}limits:{suffix}")
        object.__setattr__(self, "limits", f"{p}limits")
        for suffix in ("held", "queue", "paused", "seq", "ended"):
            object.__setattr__(self, f"order_{suffix}", f"{p}order:{suffix}")
        by_priority = {prio: f"{p}pending:{prio.label}" for prio in Priority}
        object.__setattr__(self, "pending_by_priority", by_priority)
        object.__setattr__(self, "pending_high_first", tuple(by_priority[q] for q in PRIORITIES_HIGH_FIRST))

    @classmethod
    def for_queue(cls, name: str, namespace: str = "venturi") -> QueueKeys:
        validate_name(name)
        validate_name(namespace, "key namespace")
        return cls(name=name, prefix=f"{namespace}:{{{name}}}:")

    @property
    def presence(self) -> tuple[str, ...]:
        """The keys whose existence makes the queue exist: its indexes (every state,
        parked jobs), its meta hash, its workers, its schedules, its limits. A
        registered queue with none of them is gone (purged, expired) and is no
        longer listed; one ``EXISTS`` of them all is one command in one slot."""
        return (
            *self.pending_high_first,
            self.waiting,
            self.limits_parked,
            self.order_queue,
            self.running,
            self.suspended,
            self.completed,
            self.dead,
            self.cancelled,
            self.meta,
            self.workers,
            self.schedules,
            self.limits,
        )

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def journal(self, job_id: str) -> str:
        return f"{self.prefix}journal:{job_id}"

    # A job's place in a workflow (lua/include/keys.lua graph_keys derives the same names).
    def deps(self, job_id: str) -> str:
        return f"{self.prefix}deps:{job_id}"

    def dependents(self, job_id: str) -> str:
        return f"{self.prefix}dependents:{job_id}"

    def depresults(self, job_id: str) -> str:
        return f"{self.prefix}depresults:{job_id}"

    def pending(self, priority: Priority) -> str:
        return self.pending_by_priority[priority]

    def wake_stop(self, worker_id: str) -> str:
        """The list a worker pushes onto to interrupt its own idle ``BLPOP``."""
        return f"{self.prefix}wake:{worker_id}"

    # The workers consuming the queue (_worker/registry.py writes, _producer/reads.py reads).
    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    def worker(self, name: str) -> str:
        return f"{self.prefix}worker:{name}"

    # Schedules (_producer/schedules.py, lua/schedule_*.lua; docs/schedules.md).
    @property
    def schedules(self) -> str:
        return f"{self.prefix}schedules"

    @property
    def schedules_due(self) -> str:
        return f"{self.prefix}schedules:due"

    @property
    def schedules_wake(self) -> str:
        return f"{self.prefix}schedules:wake"

    def schedule(self, schedule_id: str) -> str:
        return f"{self.prefix}schedule:{schedule_id}"

    # The offload snapshot of a job enqueued by ``@vr.offload``. ``token`` is the
    # random part of the caller's handle key; lua/include/offload.lua derives the
    # same two names from the prefix and the job's ``offload`` field.
    def offload(self, token: str) -> str:
        return f"{self.prefix}offload:{token}"

    # The metrics history (lua/include/history.lua; keys.lua history_keys): the
    # minute's and the hour's hash starting at ``start_s`` (epoch seconds).
    def history_minute(self, start_s: int) -> str:
        return f"{self.prefix}history:m:{start_s}"

    def history_hour(self, start_s: int) -> str:
        return f"{self.prefix}history:h:{start_s}"

    @property
    def graph_orphans(self) -> str:
        """Finished jobs whose dependents the next reclaim sweep tells (keys.lua graph_orphans_key)."""
        return f"{self.prefix}graph:orphans"

    def offload_channel(self, token: str) -> str:
        return f"{self.prefix}offload:{token}:done"
