"""Every call of a Lua script: its KEYS, its ARGV, and what its reply means.

This module is the one owner of the scripts' calling conventions (BullMQ's
``scripts.ts`` is the model). Each script has a builder that returns a
``Call`` (the script's name, its KEYS, its ARGV) and, where the reply is more
than a plain value, a parser that turns it into a typed result. Nothing else
in the package assembles a script's keys or arguments or reads a raw reply,
so "where is the claim script called, with which keys" is answered here:
``claim`` below, and ``lua/claim.lua``'s header for what the script does
with them.

A ``Call`` is sent by the client's ``Sender`` (``sender.py``: the pool, a
pipeline, a transaction, the caller's own MULTI under WATCH, the enqueue
lane, a blocking connection), always through the queue's ``QueueStore``
(``store.py``), which pairs each call with its parser.

The builders live in this module and its siblings: ``calls_base.py`` (the
``Call`` and ``Transition`` types, the coded errors), here (enqueue, merge,
the claim and the worker's upkeep), ``calls_ending.py`` (a run's endings),
``calls_flow.py``, ``calls_ops.py``, ``calls_obs.py`` and
``calls_schedule.py``. This module re-exports the first and the second, so
``calls.complete`` and ``calls.Call`` are where they always were.

The conventions every script follows (CONTRIBUTING.md, "Lua"):

* ARGV[1] is ``now`` (the caller's clock, ``Sender.now()``: '' for
  Redis TIME, else integer ms) and ARGV[2] the queue's key prefix, in every
  script; the script's own arguments follow from ARGV[3].
* Every key known before the call is in KEYS (queue-wide keys first, then
  the job's). Keys of jobs a script discovers as it runs (claim, reclaim,
  purge, extend, retry_dead, complete) are built from the prefix by
  ``lua/include/keys.lua``, and no key is built from a value read out of a
  hash: a script that reads a job's priority takes the four pending sets in
  KEYS, CRITICAL first, and the field picks one.
* The slot guard: every script but ``enqueue`` declares the queue's scratch
  key ``journal-compact`` (``keys.journal_compact``), absent between calls,
  as its last key (before claim's optional stop list). While a Redis Cluster
  moves the queue's slot, Redis then refuses the call with ``TRYAGAIN`` or
  ``ASK`` before it runs, instead of letting it meet a job's key that moved
  after its first writes (lua/include/keys.lua says more; docs/cluster.md,
  "Moving a queue's slot"). ``enqueue`` declares the new job's hash, missing
  on the source until the move ends, which guards it the same way.
* A reply is a result (a refusal included: ``Transition``); an error the
  caller must handle comes back as a coded error reply, ``VR_<CODE> message``,
  turned into an exception by ``script_error``, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .._model.codec import text
from .._model.enums import Priority
from .calls_base import (
    APPLIED,
    Call,
    ScriptArg,
    Transition,
    _ending_keys,
    corrupt_job,
    script_error,
    transition,
)
from .calls_ending import (
    Completion,
    bad_delay,
    cancel,
    complete,
    completed,
    completion,
    dead,
    pause,
    release,
    retry,
    suspend,
)
from .keys import QueueKeys
from .prepare import Prepared

# -- enqueue -------------------------------------------------------------------


# job_args.lua's per-job layout (tests/test_layouts.py checks the two agree).
JOB_ARGS = ("id", "kind", "priority", "delay_ms", "dedup", "payload", "m")
# enqueue.lua's general ARGV for one job without optional fields or offload: five, then JOB_ARGS.
_ONE_PLAIN_JOB = 5 + len(JOB_ARGS)


def job_args(job: Prepared) -> list[ScriptArg]:
    """One job's values in enqueue.lua's and enqueue_flow.lua's ARGV (``JOB_ARGS``, then its
    optional hash fields as name, value pairs: ``Prepared.optional``)."""
    pairs = job.optional()
    return [
        job.id,
        job.kind,
        job.priority.label,
        job.delay_ms,
        job.dedup,
        job.payload,
        len(pairs) // 2,
        *pairs,
    ]


def enqueue(
    keys: QueueKeys,
    now: str,
    jobs: Sequence[Prepared],
    *,
    dedup_mode: str = "nx",
    offload: Sequence[tuple[str, int]] = (),
) -> Call:
    """enqueue.lua for ``jobs`` (of one queue). ``dedup_mode``: 'nx' or 'force'.

    ``offload``: one (snapshot token, retention ms) per job for ``@vr.offload``;
    the script writes each job's pending snapshot with the job.
    """
    call_keys: list[str] = [keys.dedup, keys.wake, keys.meta]
    args: list[ScriptArg] = [now, keys.prefix, len(jobs), dedup_mode, "1" if offload else ""]
    by_priority = keys.pending_by_priority
    for i, job in enumerate(jobs):
        call_keys += [keys.job(job.id), by_priority[job.priority]]
        args += job_args(job)
        if offload:
            args += offload[i]
    for token, _ in offload:
        call_keys.append(keys.offload(token))
    if len(args) == _ONE_PLAIN_JOB and dedup_mode == "nx":
        # One job with no optional field (m = 0, the last value) and no offload (its two
        # values would follow): enqueue.lua's short layout, now and the job's fixed
        # values. The script takes the prefix from the meta key, the rest is the defaults.
        args = [now, *args[5:-1]]
    return Call("enqueue", call_keys, args)


def enqueue_holders(reply: Any) -> list[str]:
    """Per job of an enqueue call: '' when created, else the id of the pending job holding its dedup field.

    A one-job call's reply is that one value (enqueue.lua), a many-job call's
    ``{now, r1, ..., rn}``.
    """
    if isinstance(reply, list):
        return [text(x) for x in reply[1:]]
    return [text(reply)]


def enqueue_holder(reply: Any) -> str:
    """``enqueue_holders`` of a one-job call."""
    return text(reply[1]) if isinstance(reply, list) else text(reply)


def merge(
    keys: QueueKeys,
    now: str,
    *,
    holder: str,
    old_priority: Priority,
    new_priority: Priority,
    decision: str,
    payload: bytes,
    carry_action: str,
    carry: bytes,
    by: str,
    dedup: str = "",
    debounce_ms: str = "",
) -> Call:
    """merge.lua: apply a dedup merge ``decision`` to the pending job ``holder``.

    ``by``: the id the merging enqueue generated (journaled, so a lost EXEC
    reply can be told apart from a merge that did not happen). ``dedup``: the
    job's dedup field; ``debounce_ms``: the task's debounce ('' = none).
    Decision ``check``: whether a throttled ``holder`` out of pending still
    holds the key (merge.lua says how).
    """
    return Call(
        "merge",
        [
            keys.job(holder),
            keys.journal(holder),
            keys.pending_by_priority[old_priority],
            keys.pending_by_priority[new_priority],
            keys.wake,
            keys.meta,
            keys.events,
            keys.limits_parked,
            keys.dedup,
            keys.dedup_held,
            keys.retrying,
            keys.journal_compact,
        ],
        [
            now,
            keys.prefix,
            holder,
            decision,
            payload,
            carry_action,
            carry,
            new_priority.label,
            by,
            dedup,
            debounce_ms,
        ],
    )


def merged(reply: Any) -> bool:
    """merge.lua's reply: whether ``holder`` is the enqueue's answer: the decision was
    applied (1), or the key is held by the throttled job (2, decision ``check``).
    False: the job left pending, or no longer holds the key."""
    return reply is not None and int(reply) in (1, 2)


# -- claim and the worker's upkeep ----------------------------------------------


def claim(
    keys: QueueKeys,
    now: str,
    *,
    count: int,
    worker: str,
    token_base: str,
    default_lease_ms: int,
    stop_key: str | None = None,
) -> Call:
    """claim.lua: move up to ``count`` eligible jobs to running for ``worker``.

    ``stop_key``: the worker's stop list, when the claim rides behind its
    idle ``BLPOP`` (see the script's header).
    """
    call_keys = [
        *keys.pending_high_first,
        keys.running,
        keys.dedup,
        keys.meta,
        keys.wake,
        keys.cancelled,
        keys.dead,
        keys.journal_compact,
    ]
    if stop_key is not None:
        call_keys.append(stop_key)
    return Call("claim", call_keys, [now, keys.prefix, count, worker, token_base, default_lease_ms])


# One claimed job, decoded: id, kind, payload, carry, run_count, failures,
# lease token, lease ms, priority, max_failures, resume input, the journal
# before this claim (its XRANGE reply, possibly empty), run timeout in ms (0:
# the worker's), and the job's created_at, eligible_at (ms; '' when unknown):
# what the journal's `enqueued` entry says when the stream does not hold it
# (_model/records.py journal_from).
ClaimedJob = tuple[str, str, bytes, bytes, int, int, str, int, Priority, str, bytes, Any, int, Any, Any]

# What claim.lua returns per job (its header says it; tests/test_layouts.py
# checks the two agree by name), and the job's optional fields it returns as
# one value (false when the job has none of them).
CLAIM_FIELDS = (
    "id",
    "kind",
    "payload",
    "run_count",
    "priority",
    "created_at",
    "eligible_at",
    "extras",
    "history",
)
EXTRA_FIELDS = ("lease_ms", "carry", "failures", "max_failures", "resume_input", "timeout_ms")
_PER_JOB = len(CLAIM_FIELDS)

# A job hash's `priority` field, as claim.lua returns it (an empty one is NORMAL).
_PRIORITY_OF: dict[Any, Priority] = {p.label.encode(): p for p in Priority}
_PRIORITY_OF[b""] = _PRIORITY_OF[None] = _PRIORITY_OF[False] = Priority.NORMAL


def _priority(raw: Any) -> Priority:
    p = _PRIORITY_OF.get(raw)
    return p if p is not None else Priority.parse(text(raw))


class ClaimReply(NamedTuple):
    """claim.lua's reply: the script's clock, the next eligibility, the raw reply, and the
    call's lease token base and default lease (each job's token is ``base.k``)."""

    now: int
    # Earliest eligible_at still pending when the claim came back short (0:
    # none, -1: the queue is paused).
    next: int
    raw: list[Any]
    token_base: str = ""
    default_lease_ms: int = 0

    def jobs(self) -> list[ClaimedJob]:
        """The claimed jobs, in claim order (``CLAIM_FIELDS`` values each in the raw reply).

        A list, not a generator: a generator's resumption per job is a Python
        call on the claim path. Each field is taken from the reply by one
        slice per call (``zip``), not by a slice per job, and the common
        conversions are inline: this runs once per claimed job.
        """
        raw = self.raw
        base = self.token_base
        lease_ms = self.default_lease_ms
        priority_of = _PRIORITY_OF
        out: list[ClaimedJob] = []
        for k, (job_id, kind, payload, run, prio, created, eligible, extras, history) in enumerate(
            zip(
                raw[2::_PER_JOB],
                raw[3::_PER_JOB],
                raw[4::_PER_JOB],
                raw[5::_PER_JOB],
                raw[6::_PER_JOB],
                raw[7::_PER_JOB],
                raw[8::_PER_JOB],
                raw[9::_PER_JOB],
                raw[10::_PER_JOB],
                strict=True,
            ),
            1,
        ):
            priority = priority_of.get(prio)
            if priority is None:
                priority = _priority(prio)
            if extras:
                lease, carry, failures, maxf, resume, tmo = extras
                out.append(
                    (
                        job_id.decode() if job_id.__class__ is bytes else text(job_id),
                        kind.decode() if kind.__class__ is bytes else text(kind),
                        payload or b"",
                        carry or b"",
                        int(run),
                        int(failures or 0),
                        f"{base}.{k}",
                        int(lease) if lease else lease_ms,
                        priority,
                        text(maxf),
                        resume or b"",
                        history or [],
                        int(tmo or 0),
                        created,
                        eligible,
                    )
                )
            else:
                out.append(
                    (
                        job_id.decode() if job_id.__class__ is bytes else text(job_id),
                        kind.decode() if kind.__class__ is bytes else text(kind),
                        payload or b"",
                        b"",
                        int(run),
                        0,
                        f"{base}.{k}",
                        lease_ms,
                        priority,
                        "",
                        b"",
                        history or [],
                        0,
                        created,
                        eligible,
                    )
                )
        return out


def claim_reply(reply: Any, token_base: str = "", default_lease_ms: int = 0) -> ClaimReply:
    return ClaimReply(int(reply[0]), int(reply[1]), reply, token_base, default_lease_ms)


def extend(keys: QueueKeys, now: str, leases: Sequence[tuple[str, str, int]]) -> Call:
    """extend.lua: renew the leases ``(job id, token, lease ms)`` a worker holds."""
    args: list[ScriptArg] = [now, keys.prefix]
    for job_id, token, lease_ms in leases:
        args += [job_id, token, lease_ms]
    return Call("extend", [keys.running, keys.journal_compact], args)


class Extended(NamedTuple):
    """extend.lua's reply: leases no longer held, and held jobs an operator asked to cancel."""

    lost: list[str]
    cancel_requested: list[str]


def extended(reply: Any) -> Extended:
    lost, cancel = reply
    return Extended([text(x) for x in lost], [text(x) for x in cancel])


def reclaim(keys: QueueKeys, now: str, *, batch: int, max_failures: str) -> Call:
    """reclaim.lua: take back up to ``batch`` jobs whose lease expired.

    ``max_failures``: the worker's default backstop ('none' = off).
    """
    return Call(
        "reclaim",
        [
            keys.running,
            keys.dead,
            keys.dedup,
            keys.wake,
            *keys.pending_high_first,
            *_ending_keys(keys),
            keys.journal_compact,
        ],
        [now, keys.prefix, batch, max_failures],
    )


class Reclaimed(NamedTuple):
    requeued: int
    dead: int
    ids: list[str]
    # A part of the sweep past the expired leases (start deadlines, throttled
    # keys...) stopped at its cap: call again (reclaim.lua's header).
    more: bool = False


def reclaimed(reply: Any) -> Reclaimed:
    return Reclaimed(int(reply[0]), int(reply[1]), [text(x) for x in reply[3:]], reply[2] == 1)


# What this module defines, and what it re-exports from calls_base and calls_ending.
__all__ = [
    "APPLIED",
    "CLAIM_FIELDS",
    "Call",
    "ClaimReply",
    "ClaimedJob",
    "Completion",
    "EXTRA_FIELDS",
    "Extended",
    "JOB_ARGS",
    "Reclaimed",
    "ScriptArg",
    "Transition",
    "bad_delay",
    "cancel",
    "claim",
    "claim_reply",
    "complete",
    "completed",
    "completion",
    "corrupt_job",
    "dead",
    "enqueue",
    "enqueue_holder",
    "enqueue_holders",
    "extend",
    "extended",
    "job_args",
    "merge",
    "merged",
    "pause",
    "reclaim",
    "reclaimed",
    "release",
    "retry",
    "script_error",
    "suspend",
    "transition",
]
