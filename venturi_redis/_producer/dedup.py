"""The dedup merge path: an optimistic WATCH / MULTI loop on the candidate job.

``enqueue`` first tries the atomic create-if-the-key-is-free script. When a
pending job already holds ``(KIND, dedup_key)``, this module:

1. WATCHes that job's hash (only that hash, so unrelated enqueues never
   conflict), reads it and its journal;
2. calls the task's own ``merge`` with a typed ``Pending`` view of the job;
3. applies the decision with ``merge.lua`` inside MULTI/EXEC.

If the job changed in between (claimed, merged by another producer, paused
back) EXEC fails with a WatchError and the loop re-reads, with a short jittered
backoff, up to a bound; then a MergeConflictError names the key. A ``merge``
that raises aborts the enqueue with its own exception and nothing written.

A connection lost after EXEC was sent is not a lost race: the merge may have
been applied, its reply lost. redis-py reports it as a WatchError too (the
WATCH died with the connection). The ``merged`` journal entry names the id
the merging enqueue generated (``by``), so the loop looks for it before
deciding again: a merge is applied at most once per enqueue call. A late EXEC
(a reply timed out while the server still held the command) is covered too:
its WATCH stays alive on the server until that connection is closed, so it
fails if anything wrote the hash first, and if it lands first, the loop's next
EXEC fails instead and the read after it finds the entry.

Round trips, on a single Redis and ``memory://``: WATCH and the two reads go
out in one write on the connection that later sends MULTI/EXEC
(``_watch_and_read``), so a merge costs three: the enqueue script that finds
the holder, WATCH + reads, MULTI/EVALSHA/EXEC. Redis runs one connection's
commands in order, so the WATCH still precedes the reads and any later change
to the hash fails the EXEC. Redis Cluster keeps redis-py's own path, one round
trip per WATCH and read (five in all): its transaction pipeline keeps the
WATCH state (slot, node, connection) in private attributes. What the one-write
WATCH relies on in redis-py is in ``_transport/redispy.py``.
"""

from __future__ import annotations

import contextlib
import logging
import random
from typing import TYPE_CHECKING, Any

import anyio
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, ResponseError, WatchError

from .._model.codec import pack_model, text, unpack, unpack_model
from .._model.enums import JobState, Priority
from .._model.errors import MergeConflictError, PayloadError, PayloadTooLarge, TaskDefinitionError
from .._model.records import ENQUEUED_FIELDS, LazyJournal, journal_from
from .._model.redact import document_secrets, scrub
from .._model.sealing import missing_key
from .._model.task import Merge, Pending, Task
from .._store.store import Call, corrupt_job
from .._transport.redispy import forget_watch, pin_connection, pipeline_reply, watch_lost_with_connection

if TYPE_CHECKING:
    from .._store.prepare import Prepared
    from .base import QueueLike

MAX_MERGE_ATTEMPTS = 64


log = logging.getLogger("venturi_redis.dedup")
# Task.merge itself: a task class that keeps it replaces the pending job, whatever it holds.
_DEFAULT_MERGE = Task.merge


class _ReplyLost:
    """An attempt's EXEC went out and its connection failed: applied or not, unknown."""


REPLY_LOST = _ReplyLost()


async def merge_into(queue: QueueLike, task: Task[Any], job: Prepared, holder: str) -> str:
    """Resolve a dedup collision for ``job``; returns the id that holds the work."""
    client = queue.client
    unsure = False  # an EXEC of ours may have been applied without our seeing it
    for attempt in range(MAX_MERGE_ATTEMPTS):
        if not holder:
            # The key was free when we looked: try the atomic create again.
            holder = await queue.store.enqueue_pooled(job)
            if not holder:
                return job.id
        result = await _try_merge(queue, task, job, holder, unsure=unsure)
        if isinstance(result, str):
            return result
        if result is REPLY_LOST:
            # Read the same job again at once, not the index: the job may have
            # left it since (claimed), and its journal still says whether our
            # merge went in (_try_merge checks that first when unsure).
            unsure = True
            continue
        # Lost the race: back off briefly (jittered, so contenders spread out).
        await anyio.sleep(random.uniform(0, min(0.0005 * 2**attempt, 0.05)))
        holder = text(await client.redis.hget(queue.keys.dedup, job.dedup))
    raise MergeConflictError(
        f"queue {queue.name}: gave up merging {job.kind} with dedup field {job.dedup!r} after "
        f"{MAX_MERGE_ATTEMPTS} conflicting attempts; the key is under heavy contention, retry later"
    )


def _merged_by(entries: list[Any], by: str) -> bool:
    """Whether XRANGE ``entries`` of a journal hold a ``merged`` entry made by enqueue ``by``."""
    mark = by.encode()
    return any(f.get(b"event") == b"merged" and f.get(b"by") == mark for _, f in entries)


def _reply_lost(exc: WatchError) -> bool:
    """Whether redis-py raised ``exc`` for a connection that failed while watching.

    How redis-py tells it is in the fence (``watch_lost_with_connection``).
    """
    return watch_lost_with_connection(exc)


async def _try_merge(
    queue: QueueLike, task: Task[Any], job: Prepared, holder: str, *, unsure: bool = False
) -> str | _ReplyLost | None:
    """One optimistic attempt: the resulting job id, None to retry, or REPLY_LOST.

    ``unsure``: an earlier attempt's EXEC may have been applied; the journal
    read here is checked for it before anything is decided again.
    """
    client = queue.client
    keys = queue.keys
    job_key = keys.job(holder)
    task_cls = type(task)
    async with client.redis.pipeline(transaction=True) as pipe:
        try:
            try:
                raw, entries = await _watch_and_read(
                    pipe, job_key, ("HGETALL", job_key), ("XRANGE", keys.journal(holder), "-", "+")
                )
            except ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    raise
                raise corrupt_job(f"job {holder}: {await _wrong_type(queue, holder)}") from None
            if unsure and _merged_by(entries, job.id):
                return holder  # our earlier EXEC went in after all
            if raw and (problem := _corrupt(raw)):
                # Its own data is corrupt: refused, nothing written (not read
                # again and again as if it had left pending under us, until a
                # misleading MergeConflictError). The operator repairs it
                # (docs/guarantees.md, "Corrupt jobs are quarantined").
                raise corrupt_job(f"job {holder}: {problem}")
            if not raw or raw.get(b"state") != b"pending":
                if not raw or b"dedup_window" in raw:
                    # A throttled holder (docs/dedup.md) may still hold the key
                    # while it runs and through its window: merge.lua decides on
                    # Redis's clock, and frees an entry it no longer holds (a
                    # holder whose hash is gone too).
                    merge_call = queue.store.merge_call(
                        holder=holder,
                        old_priority=Priority.NORMAL,
                        new_priority=Priority.NORMAL,
                        decision="check",
                        payload=b"",
                        carry_action="keep",
                        carry=b"",
                        by=job.id,
                        dedup=job.dedup,
                    )
                    applied = await queue.store.merge_watched(pipe, merge_call)
                    return holder if applied else None
                return None  # claimed under us: the index has moved on
            if text(raw.get(b"dedup")) != job.dedup:
                return None  # replaced under us: the index has moved on
            # No stream yet for a job untouched since enqueue: journal_from
            # gives its `enqueued` entry from the hash just read.
            journal = LazyJournal(
                journal_from(entries, [raw.get(name.encode()) for name in ENQUEUED_FIELDS]),
                encryption=client.encryption,
            )
            # The merge decides here, client-side, under WATCH: it opens what it
            # reads (a client without the key raises EncryptionKeyMissing) and
            # seals what it writes; the merge script sees opaque bytes.
            crypt = client.encryption
            raw_payload, raw_carry = raw[b"payload"], raw.get(b"carry")
            for blob in (raw_payload, raw_carry):
                if blob and (missing := missing_key(blob, crypt)) is not None:
                    raise missing
            if crypt is not None:
                raw_payload = crypt.open(raw_payload)
                raw_carry = crypt.open(raw_carry) if raw_carry else raw_carry
            carry_cls = task_cls.carry_type()
            decision: Merge[Any, Any]
            if task_cls.merge is _DEFAULT_MERGE:
                # Replace, whatever the job holds: nothing of it is read, so a job
                # enqueued by an older model of the task, which this one no longer
                # validates, is replaced too (docs/semantics.md, "Changing a task's
                # model while its jobs wait"), where reading it failed this enqueue.
                decision = Merge.replace()
            else:
                try:
                    existing = unpack_model(task_cls, raw_payload)
                    carry = unpack_model(carry_cls, raw_carry) if raw_carry else task_cls.default_carry()
                except PayloadError as exc:
                    # merge() cannot be shown the job. Not this enqueue's fault, and no
                    # retry of it changes stored bytes: the new job goes in beside it
                    # (nothing lost, nothing merged behind merge()'s back), and the old
                    # one goes dead (invalid_payload) on a worker that cannot read it either.
                    # A validator's message may quote the job's values: its secrets are masked.
                    secrets: list[str] = []
                    with contextlib.suppress(PayloadError):
                        secrets = document_secrets(task_cls, unpack(raw_payload))
                    log.warning(
                        "queue %s: pending job %s holds the dedup key of this %s job, and %s cannot "
                        "read it (%s); enqueued job %s beside it (as Merge.independent())",
                        queue.name,
                        holder,
                        job.kind,
                        task_cls.__qualname__,
                        scrub(str(exc), secrets),
                        job.id,
                    )
                    decision = Merge.independent()
                else:
                    pending: Pending[Any, Any] = Pending(
                        job_id=holder,
                        payload=existing,
                        carry=carry,
                        run_count=int(raw.get(b"run_count", 0)),
                        failures=int(raw.get(b"failures", 0)),
                        journal=journal,
                    )
                    decision = task.merge(pending)  # the user's code: its exceptions abort the enqueue
                    if not isinstance(decision, Merge):
                        raise TaskDefinitionError(
                            f"{task_cls.__qualname__}.merge() must return a vr.Merge, "
                            f"got {type(decision).__name__}"
                        )
            if decision.decision == "independent":
                await pipe.reset()
                await queue.store.enqueue_forced(job)
                return job.id
            old_prio = Priority.parse(text(raw.get(b"priority")) or "normal")
            new_prio, payload, carry_action, carry_bytes = old_prio, b"", "keep", b""
            if decision.decision == "replace":
                new_prio, payload, carry_action = job.priority, job.payload, "reset"
            elif decision.decision == "with":
                new_task = decision.task
                # Any Task class of the same KIND will do (a subclass may merge into
                # its base); the payload is stored under the job's KIND either way.
                if not isinstance(new_task, Task) or type(new_task).kind() != job.kind:
                    raise TaskDefinitionError(
                        f"Merge.with_ needs a task of KIND {job.kind!r}, got {type(new_task).__name__}"
                    )
                if not isinstance(decision.carry, carry_cls):
                    raise TaskDefinitionError(
                        f"Merge.with_ needs a carry of type {carry_cls.__name__}, "
                        f"got {type(decision.carry).__name__}"
                    )
                payload = pack_model(new_task)
                carry_bytes = pack_model(decision.carry)
                carry_action = "set"
                if max(len(payload), len(carry_bytes)) > client.max_payload_bytes:
                    cap = client.max_payload_bytes
                    raise PayloadTooLarge(
                        f"merged {job.kind} payload or carry is over the cap of {cap} bytes"
                    )
                if crypt is not None:
                    payload, carry_bytes = crypt.seal_many((payload, carry_bytes))
                new_prio = job.priority if job.explicit_priority else Priority.parse(new_task.priority())
            merge_call = queue.store.merge_call(
                holder=holder,
                old_priority=old_prio,
                new_priority=new_prio,
                decision=decision.decision,
                payload=payload,
                carry_action=carry_action,
                carry=carry_bytes,
                by=job.id,
                dedup=job.dedup,
                debounce_ms=str(timing[1]) if (timing := task_cls._vr_dedup_timing) and timing[1] else "",
            )
            applied = await queue.store.merge_watched(pipe, merge_call)
        except WatchError as exc:
            return REPLY_LOST if _reply_lost(exc) else None
        except NoScriptError:
            # The server lost (or never had) merge.lua: nothing was applied (the
            # store loaded it). Apply the same decision if the job is still as
            # we read it, so the task's merge() is not asked twice about one state.
            again = await _apply_again(queue, job_key, raw, merge_call)
            if isinstance(again, _ReplyLost) or again is None:
                return again
            applied = again
    return holder if applied else None


async def _apply_again(
    queue: QueueLike, job_key: str, raw: dict[bytes, bytes], call: Call
) -> bool | _ReplyLost | None:
    """Apply ``call`` in MULTI if the job hash still equals ``raw`` (whether it was applied);
    None if the job changed."""
    async with queue.client.redis.pipeline(transaction=True) as pipe:
        try:
            if await _watch_and_read(pipe, job_key, ("HGETALL", job_key)) != [raw]:
                return None
            return await queue.store.merge_watched(pipe, call)
        except WatchError as exc:
            return REPLY_LOST if _reply_lost(exc) else None


_PRIORITIES = ("critical", "high", "normal", "low")
_STATES = frozenset(s.value for s in JobState)


def _corrupt(raw: dict[bytes, bytes]) -> str | None:
    """What is wrong with a dedup holder's own hash (as the scripts say it), or None."""
    if b"state" not in raw:
        return "state field is missing"
    state = text(raw[b"state"])
    if state not in _STATES:
        return f'state field "{state[:64]}" is not a job state'
    if state != "pending":
        return None  # it left pending: the caller reads the index again
    priority = text(raw.get(b"priority"))
    if priority and priority not in _PRIORITIES:  # none: normal, as enqueue's default
        return f'priority field "{priority}" is not one of critical, high, normal, low'
    if b"payload" not in raw:
        return "payload field is missing"
    for name in (b"run_count", b"failures"):
        if not raw.get(name, b"0").isdigit():
            return f"{name.decode()} field is not a count"
    return None


async def _wrong_type(queue: QueueLike, holder: str) -> str:
    """Which of a job's two keys holds the wrong type (a read of both failed with WRONGTYPE)."""
    if text(await queue.client.redis.type(queue.keys.job(holder))) not in ("hash", "none"):
        return "job key is not a hash"
    return "journal key is not a stream"


async def _watch_and_read(pipe: Any, key: str, *reads: tuple[str, ...]) -> list[Any]:
    """WATCH ``key`` on ``pipe``'s connection, then send ``reads`` there; their parsed replies.

    On a ``redis.asyncio`` pipeline (a single Redis, ``memory://``) WATCH and the
    reads go out in one write: one round trip. ``pipe`` is left as ``watch()``
    leaves it, its connection pinned and ``watching`` set, so ``multi()`` and
    ``execute()`` follow on the same connection and ``reset()`` unwatches.
    """
    if not isinstance(pipe, Pipeline):
        # A cluster pipeline: redis-py runs each command as it comes.
        await pipe.watch(key)
        return [await pipe.execute_command(*read) for read in reads]
    conn = await pin_connection(pipe)
    try:
        await conn.send_packed_command(conn.pack_commands([("WATCH", key), *reads]))
        # The pipeline's own parse_response: redis-py's reply callbacks (a dict
        # for HGETALL), and WATCH's reply marks the pipeline as watching.
        await pipeline_reply(pipe, conn, "WATCH")
        return [await pipeline_reply(pipe, conn, read[0]) for read in reads]
    except BaseException:
        # A reply may be left unread (an error reply, a cancellation): the
        # connection must not go back to the pool as it is. Closing it also
        # ends the WATCH, so reset() has nothing to send.
        forget_watch(pipe)
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await conn.disconnect()
        raise
