"""Every call of a Lua script: its KEYS, its ARGV, and what its reply means.

This module is the one owner of the scripts' calling conventions (BullMQ's
``scripts.ts`` is the model). Each script has a builder that returns a
``Call`` (the script's name, its KEYS, its ARGV) and, where the reply is more
than a plain value, a parser that turns it into a typed result. Nothing else
in the package assembles a script's keys or arguments or reads a raw reply,
so "where is the claim script called, with which keys" is answered here:
``claim`` below, and ``lua/claim.lua``'s header for what the script does
with them.

A ``Call`` is sent by the client's ``Sender`` (``sender.py``: the pool,
``Sender.call``; a pipeline, ``pipeline``; a transaction, ``transaction``; a
command inside the caller's own MULTI, ``in_multi``; the enqueue lane,
``call_on_lane``; a blocking connection, ``call_blocking``), and made by the
queue's ``QueueStore`` (``store.py``), one method per operation.

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
* A reply is a result (a refusal included: ``Transition``); an error the
  caller must handle comes back as a coded error reply, ``VR_<CODE> message``,
  turned into an exception by ``script_error``, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from .._model.codec import text
from .._model.enums import Priority
from .._model.errors import ConfigurationError, CorruptQueueError
from .keys import QueueKeys
from .prepare import Prepared

ScriptArg = str | bytes | int | float


def script_error(exc: ResponseError) -> Exception:
    """The exception a script's error reply stands for: ``exc`` itself unless coded.

    The codes, and what they mean for the caller:

    * ``VR_WRONGTYPE``: a queue-wide key (a pending, running or completed set)
      holds the wrong type; the script stopped before moving any job
      (``CorruptQueueError``: repair or delete the key).
    * ``VR_BADARG``: an argument the script cannot use (a NaN delay); nothing
      was written (``ConfigurationError``).
    * ``VR_CORRUPTJOB``: an operator's transition of one job (cancel, resume,
      a dedup merge) found the job's own data corrupt (lua/include/operator.lua);
      nothing was written (``CorruptQueueError`` naming the job).
    """
    code, _, rest = str(exc).partition(" ")
    if code == "VR_WRONGTYPE":
        return CorruptQueueError(f"{rest}: the script moved no job; repair or delete that key")
    if code == "VR_CORRUPTJOB":
        return corrupt_job(rest)
    if code == "VR_BADARG":
        return ConfigurationError(rest)
    return exc


def corrupt_job(what: str) -> CorruptQueueError:
    """The error of an operation refused because one job's own data is corrupt.

    ``what``: ``job <id>: <what is wrong>``, as the scripts say it.
    """
    return CorruptQueueError(
        f"{what}; nothing was written: repair the job's hash and journal, or delete them "
        "(docs/guarantees.md, 'Corrupt jobs are quarantined')"
    )


class Call(NamedTuple):
    """One script call: the script's name (its file in ``lua/``), KEYS and ARGV."""

    name: str
    keys: list[str]
    args: list[ScriptArg]


class Transition(NamedTuple):
    """The reply of a transition of one job (a RUNNING job's outcome, a cancel).

    ``applied``: the job moved. ``detail``: when applied, what the script
    says it did (retry: ``'pending'`` or ``'dead'``; cancel: ``'cancelled'``
    or ``'requested'``; else ''); when refused, why (the job is unknown, in
    another state, or the lease token is stale).
    """

    applied: bool
    detail: str


APPLIED = Transition(True, "")
# Largest delay in ms a script takes: Lua numbers are doubles, exact to 2**53.
_MAX_MS = 2**53


def transition(reply: Any) -> Transition:
    """``{1, ...}`` or ``{0, reason}``: the reply of pause, suspend, retry, dead, release, cancel, resume."""
    if int(reply[0]) == 1:
        return Transition(True, text(reply[1])) if len(reply) > 1 else APPLIED
    return Transition(False, text(reply[1]))


def _ending_keys(keys: QueueKeys) -> tuple[str, str, str, str]:
    """The last four KEYS of every script that ends a run (pause, suspend, retry,
    dead, release, cancel, reclaim): the queue's meta hash and event stream
    (events.lua), and the limits state and ready rotation a held slot goes back
    to (limits.lua)."""
    return (keys.meta, keys.events, keys.limits_state, keys.limits_ready)


# -- enqueue -------------------------------------------------------------------


# job_args.lua's per-job layout (tests/test_layouts.py checks the two agree).
JOB_ARGS = ("id", "kind", "priority", "delay_ms", "dedup", "payload", "m")


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
) -> Call:
    """merge.lua: apply a dedup merge ``decision`` to the pending job ``holder``.

    ``by``: the id the merging enqueue generated (journaled, so a lost EXEC
    reply can be told apart from a merge that did not happen).
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
        ],
        [now, keys.prefix, holder, decision, payload, carry_action, carry, new_priority.label, by],
    )


def merged(reply: Any) -> bool:
    """merge.lua's reply: whether the decision was applied (False: the job left pending)."""
    return reply is not None and int(reply) == 1


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
        call on the claim path.
        """
        raw = self.raw
        base = self.token_base
        lease_ms = self.default_lease_ms
        out: list[ClaimedJob] = []
        for k, i in enumerate(range(2, len(raw), _PER_JOB), 1):
            job_id, kind, payload, run, prio, created, eligible, extras, history = raw[i : i + _PER_JOB]
            if extras:
                lease, carry, failures, maxf, resume, tmo = extras
                out.append(
                    (
                        text(job_id),
                        text(kind),
                        payload or b"",
                        carry or b"",
                        int(run),
                        int(failures or 0),
                        f"{base}.{k}",
                        int(lease) if lease else lease_ms,
                        _priority(prio),
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
                        text(job_id),
                        text(kind),
                        payload or b"",
                        b"",
                        int(run),
                        0,
                        f"{base}.{k}",
                        lease_ms,
                        _priority(prio),
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
    return Call("extend", [keys.running], args)


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
        ],
        [now, keys.prefix, batch, max_failures],
    )


class Reclaimed(NamedTuple):
    requeued: int
    dead: int
    ids: list[str]


def reclaimed(reply: Any) -> Reclaimed:
    return Reclaimed(int(reply[0]), int(reply[1]), [text(x) for x in reply[2:]])


# -- a running job's outcome -------------------------------------------------------

# complete.lua's six values for one job: id, lease token, note, attachment,
# carry ('' = unchanged), result.
Completion = list[ScriptArg]


def completion(
    job_id: str, token: str, note: str, attachment: bytes, carry: bytes, result: bytes
) -> Completion:
    return [job_id, token, note, attachment, carry, result]


def complete(
    keys: QueueKeys, now: str, completions: Sequence[Completion], *, keep_ms: str = "", max_kept: str = ""
) -> Call:
    """complete.lua for one or more jobs of one queue (each checked on its own).

    ``keep_ms`` and ``max_kept``: the retention of completed jobs ('' = no
    such bound), trimmed in the same call (lua/include/retention.lua).
    """
    args: list[ScriptArg] = [now, keys.prefix, keep_ms, max_kept, len(completions)]
    for values in completions:
        args.extend(values)
    return Call(
        "complete",
        [
            keys.running,
            keys.completed,
            keys.meta,
        ],
        args,
    )


def completed(reply: Any) -> list[Transition]:
    """complete.lua's reply: per job, applied, or refused with its reason."""
    return [APPLIED if one == 1 else Transition(False, text(one)) for one in reply]


def pause(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    priority: Priority,
    delay_ms: int,
    note: str,
    attachment: bytes,
    carry: bytes,
) -> Call:
    """pause.lua: a RUNNING job goes back to pending ``delay_ms`` from now, not charged."""
    bad = bad_delay(delay_ms)
    if bad is not None:
        raise ConfigurationError(bad)
    return Call(
        "pause",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
        ],
        [now, keys.prefix, job_id, token, delay_ms, note, attachment, carry],
    )


def bad_delay(delay_ms: object) -> str | None:
    """Why ``delay_ms`` cannot be a pause's delay, or None when it can.

    A NaN or infinite delay (``vr.Outcome("pause", delay_ms=nan)``) never
    reaches Redis: the worker turns it into a failed run with this note.
    """
    if isinstance(delay_ms, int) and not isinstance(delay_ms, bool) and 0 <= delay_ms < _MAX_MS:
        return None
    return f"pause delay must be a whole number of ms from 0 to 2**53, got {delay_ms!r}"


def suspend(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    note: str,
    attachment: bytes,
    carry: bytes,
    output: bytes,
) -> Call:
    """suspend.lua: a RUNNING job waits, suspended, for ``resume``."""
    return Call(
        "suspend",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.suspended,
            *_ending_keys(keys),
            keys.wake,
        ],
        [now, keys.prefix, job_id, token, note, attachment, carry, output],
    )


def retry(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    priority: Priority,
    note: str,
    attachment: bytes,
    carry: bytes,
    base_ms: int,
    cap_ms: int,
    jitter: float,
    max_failures: str,
    error_type: str = "",
    traceback: str = "",
) -> Call:
    """retry.lua: a failed run goes back to pending after its backoff, or dies at the backstop.

    ``error_type`` and ``traceback`` (the raised exception's type and the tail
    of its traceback, '' for none) are kept in the run's ``failed`` journal entry.
    """
    return Call(
        "retry",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dead,
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
        ],
        [
            now,
            keys.prefix,
            job_id,
            token,
            note,
            attachment,
            carry,
            base_ms,
            cap_ms,
            repr(jitter),
            max_failures,
            error_type,
            traceback,
        ],
    )


def dead(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    note: str,
    attachment: bytes,
    carry: bytes,
    reason: str,
    error_type: str = "",
    traceback: str = "",
) -> Call:
    """dead.lua: a RUNNING job dies at once (``reason``: a ``DeadReason``, e.g. permanent, unknown_kind).

    ``error_type`` and ``traceback``: as for ``retry``, kept in the ``dead`` entry.
    """
    return Call(
        "dead",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.dead,
            *_ending_keys(keys),
            keys.wake,
        ],
        [now, keys.prefix, job_id, token, note, attachment, carry, reason, error_type, traceback],
    )


def release(
    keys: QueueKeys, now: str, *, job_id: str, token: str, priority: Priority, carry: bytes, note: str
) -> Call:
    """release.lua: a RUNNING job goes back to pending, not charged (a graceful shutdown)."""
    return Call(
        "release",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
        ],
        [now, keys.prefix, job_id, token, carry, note],
    )


def cancel(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    note: str,
    token: str = "",
    attachment: bytes = b"",
    carry: bytes = b"",
) -> Call:
    """cancel.lua: an operator's cancel (``token`` ''), or a worker ending its own run cancelled."""
    return Call(
        "cancel",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.suspended,
            keys.running,
            keys.cancelled,
            keys.dedup,
            *keys.pending_high_first,
            *_ending_keys(keys),
            keys.wake,
            keys.limits_parked,
        ],
        [now, keys.prefix, job_id, note, token, attachment, carry],
    )
