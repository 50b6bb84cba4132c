"""One queue's store: every script call of the queue, built, sent, parsed and mapped.

BullMQ's ``Scripts`` class and River's driver are the models: a caller names
the operation (``store.claim(...)``, ``store.end_run(...)``), never a script,
a key list, a connection path or a reply's shape. Each method:

1. builds the call with its one builder (``calls*.py``: KEYS, ARGV);
2. sends it by the path it takes (``sender.py``: the pool, the enqueue lane,
   a pipeline, a transaction, the caller's MULTI, a blocking connection);
3. parses the reply into a typed result, with the scripts' coded errors
   raised as the exceptions they stand for.

A worker's calls that share round trips (its claims and the transitions of
finished runs, ``_worker/completer.py``) are built here as ``Op``s, a call
with the parser of its reply, and sent together by ``send_ops``.

Every ``Queue`` has one (``queue.store``); the producer, the worker, the CLI
and the dashboard reach Redis's scripts through it only (an import-linter
contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from .._model.endings import Cancelled, Completed, Dead, Ending, Failed, Paused, Released, Suspended
from .._model.enums import Priority
from . import calls, calls_flow, calls_obs, calls_ops, calls_schedule
from .calls import (
    APPLIED,
    Call,
    ClaimedJob,
    ClaimReply,
    Completion,
    Extended,
    Reclaimed,
    ScriptArg,
    Transition,
    bad_delay,
    corrupt_job,
)
from .calls_flow import FlowJob, Policy
from .calls_obs import EVENTS_DEFAULT, EVENTS_MAXLEN, HISTORY_DEFAULT
from .calls_ops import FINISHED_STATES, CancelledPending, Purged, Retried
from .calls_schedule import Due, Fired
from .keys import QueueKeys
from .prepare import Prepared
from .sender import Sender

T = TypeVar("T")


class Op(NamedTuple, Generic[T]):
    """A call and the parser of its reply: what shares a round trip with others (``send_ops``)."""

    call: calls.Call
    parse: Callable[[Any], T]


def _same(reply: Any) -> Any:
    return reply


class Lease(NamedTuple):
    """What ends a run: the job, the token of the lease its run holds, and its priority."""

    job_id: str
    token: str
    priority: Priority


class RunState(NamedTuple):
    """A run's state as the ending saves it: its attachment and carry, encoded ('' = none / unchanged)."""

    attachment: bytes = b""
    carry: bytes = b""


NO_STATE = RunState()


class Retained(NamedTuple):
    """How long, and how many, finished jobs of each state stay ('' = no such bound), as the
    finishing scripts take it: they trim the oldest past it as they add (retention.lua)."""

    completed_ms: str = ""
    completed_max: str = ""
    dead_ms: str = ""
    dead_max: str = ""
    cancelled_ms: str = ""
    cancelled_max: str = ""


KEEP_ALL = Retained()


class EndingArgs(NamedTuple):
    """What the worker's settings add to an ending's call: the backoff, the backstop, retention."""

    base_ms: int
    cap_ms: int
    jitter: float
    max_failures: str  # a number, or 'none'
    retention: Retained = KEEP_ALL


async def send_ops(sender: Sender, ops: Sequence[Op[Any]]) -> list[Any]:
    """Send ``ops`` in one round trip: each op's parsed reply, or the exception its call raised."""
    replies = await sender.pipeline([op.call for op in ops], return_exceptions=True)
    out: list[Any] = []
    for op, reply in zip(ops, replies, strict=True):
        if isinstance(reply, BaseException):
            out.append(reply)
            continue
        try:
            out.append(op.parse(reply))
        except Exception as exc:  # noqa: BLE001 - a reply that does not parse is that op's error
            out.append(exc)
    return out


class QueueStore:
    """Every script call of one queue (see the module docstring)."""

    __slots__ = ("keys", "sender")

    def __init__(self, keys: QueueKeys, sender: Sender) -> None:
        self.keys = keys
        self.sender = sender

    # -- enqueue -----------------------------------------------------------------

    async def enqueue_one(self, job: Prepared) -> str:
        """Create ``job`` (on the enqueue lane when free): '' when created, else the pending
        job holding its dedup key."""
        call = calls.enqueue(self.keys, self.sender.now(), [job])
        return calls.enqueue_holder(await self.sender.call_on_lane(call))

    async def enqueue(self, jobs: Sequence[Prepared]) -> list[str]:
        """Create ``jobs`` in one call (on the lane when free): per job, '' or its dedup holder."""
        call = calls.enqueue(self.keys, self.sender.now(), jobs)
        return calls.enqueue_holders(await self.sender.call_on_lane(call))

    def enqueue_blocking(self, conn: Any, job: Prepared) -> str:
        """``enqueue_one`` from the caller's thread on ``conn``, a blocking client (``SyncClient``)."""
        call = calls.enqueue(self.keys, self.sender.now(), [job])
        return calls.enqueue_holder(self.sender.call_blocking(conn, call))

    async def enqueue_chunks(self, chunks: Sequence[Sequence[Prepared]]) -> list[list[str] | Exception]:
        """``enqueue_many``'s chunks, one call each, in one MULTI/EXEC when there are several.

        Per chunk: its holders, or the exception its call raised (a chunk that
        failed may have written some of its jobs: scripts do not roll back).
        """
        now = self.sender.now()
        batch = [calls.enqueue(self.keys, now, chunk) for chunk in chunks]
        replies: list[Any]
        if len(batch) == 1:
            try:
                replies = [await self.sender.call(batch[0])]
            except Exception as exc:  # noqa: BLE001 - the caller sorts it out, like an error inside EXEC
                replies = [exc]
        else:
            replies = await self.sender.transaction(batch)
        return [r if isinstance(r, Exception) else calls.enqueue_holders(r) for r in replies]

    async def enqueue_forced(self, job: Prepared) -> None:
        """Create ``job`` and point its dedup field at it whoever held it (``Merge.independent``)."""
        await self.sender.call(calls.enqueue(self.keys, self.sender.now(), [job], dedup_mode="force"))

    async def enqueue_pooled(self, job: Prepared) -> str:
        """``enqueue_one`` through the pool (a merge's retry of the atomic create)."""
        call = calls.enqueue(self.keys, self.sender.now(), [job])
        return calls.enqueue_holder(await self.sender.call(call))

    async def enqueue_offloaded(self, job: Prepared, token: str, retention_ms: int) -> None:
        """Create an ``@vr.offload`` job with its pending snapshot, in one step."""
        call = calls.enqueue(self.keys, self.sender.now(), [job], offload=[(token, retention_ms)])
        await self.sender.call(call)

    async def enqueue_flow(self, jobs: Sequence[calls_flow.FlowJob]) -> bool:
        """Create a workflow's jobs in one step; False for a resend (they existed, nothing written)."""
        call = calls_flow.enqueue_flow(self.keys, self.sender.now(), jobs)
        return calls_flow.flow_created(await self.sender.call(call))

    # -- dedup merges (the caller's MULTI under WATCH: _producer/dedup.py) -------------

    def merge_call(
        self,
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
    ) -> calls.Call:
        """merge.lua's call for ``holder``, for ``merge_watched`` (built once, applied again after a
        NOSCRIPT). Decision ``check``: whether a throttled holder out of pending still holds
        the key ``dedup``."""
        return calls.merge(
            self.keys,
            self.sender.now(),
            holder=holder,
            old_priority=old_priority,
            new_priority=new_priority,
            decision=decision,
            payload=payload,
            carry_action=carry_action,
            carry=carry,
            by=by,
            dedup=dedup,
            debounce_ms=debounce_ms,
        )

    async def merge_watched(self, pipe: Any, call: calls.Call) -> bool:
        """Apply a merge in ``pipe``'s MULTI (its WATCH already set): whether it was applied.

        Raises redis-py's ``WatchError`` when the watched job changed, and
        ``NoScriptError`` (after loading merge.lua) when the server did not
        have the script: nothing was applied, and the caller may apply the
        same call again.
        """
        from redis.exceptions import NoScriptError, ResponseError

        pipe.multi()
        self.sender.in_multi(pipe, call)
        try:
            (applied,) = await pipe.execute()
        except NoScriptError:
            await self.sender.load(call.name)
            raise
        except ResponseError as exc:
            mapped = self.sender.map_error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        return calls.merged(applied)

    # -- operators -------------------------------------------------------------------

    async def resume(self, job_id: str, value: bytes) -> Transition:
        """A SUSPENDED job to pending with ``value`` (msgpack) as its input."""
        call = calls_ops.resume(self.keys, self.sender.now(), job_id=job_id, value=value)
        return calls.transition(await self.sender.call(call))

    async def update(
        self, job_id: str, *, kind: str, payload: bytes, dedup: str, priority: str, delay_ms: str
    ) -> calls_ops.Updated:
        """A PENDING job changed in place (update.lua): its task (``kind`` '' = unchanged),
        priority and eligibility ('' = unchanged)."""
        call = calls_ops.update(
            self.keys,
            self.sender.now(),
            job_id=job_id,
            kind=kind,
            payload=payload,
            dedup=dedup,
            priority=priority,
            delay_ms=delay_ms,
        )
        return calls_ops.updated(await self.sender.call(call))

    async def cancel(self, job_id: str, note: str) -> Transition:
        """An operator's cancel: ``cancelled`` (pending or suspended) or ``requested`` (running)."""
        call = calls.cancel(self.keys, self.sender.now(), job_id=job_id, note=note)
        return calls.transition(await self.sender.call(call))

    async def order_pause(self, key: str, pause: bool) -> bool:
        """Pause or resume an order key (order_pause.lua): True when its pause changed."""
        call = calls_ops.order_pause(self.keys, self.sender.now(), key=key, pause=pause)
        return int(await self.sender.call(call)) == 1

    async def retry_dead(self, ids: Sequence[str], note: str) -> Retried:
        """Dead jobs back to pending, failures reset; the moved ids and the refused ones.

        On the lane when it is free: a redrive is one call after another, and
        the lane's round trip costs the client about half the pool's CPU
        (``_transport/lane.py``), CPU a live worker on the same cores needs.
        """
        call = calls_ops.retry_dead(self.keys, self.sender.now(), ids=ids, note=note)
        return calls_ops.retried(await self.sender.call_on_lane(call))

    async def purge(self, state: str, *, keep_ms: int | None, batch: int, most: int | None = None) -> Purged:
        """Remove up to ``batch`` of the oldest finished jobs of ``state`` that finished more than
        ``keep_ms`` ago or are beyond the ``most`` newest (None: no such bound)."""
        call = calls_ops.purge(
            self.keys, self.sender.now(), state=state, keep_ms=keep_ms, batch=batch, most=most
        )
        return calls_ops.purged(await self.sender.call(call))

    async def purge_ids(self, state: str, ids: Sequence[str]) -> int:
        """Remove the jobs ``ids`` the finished ``state``'s zset still holds: how many went."""
        call = calls_ops.purge(self.keys, self.sender.now(), state=state, keep_ms=None, batch=0, ids=ids)
        return calls_ops.purged(await self.sender.call(call)).removed

    async def cancel_many(self, ids: Sequence[str], note: str) -> list[Transition | Exception]:
        """An operator's cancel of each of ``ids``, one call each, in one round trip: per job its
        transition, or the error its call raised (``CorruptQueueError``: its own data is corrupt)."""
        now = self.sender.now()
        batch = [calls.cancel(self.keys, now, job_id=job_id, note=note) for job_id in ids]
        replies = await self.sender.pipeline(batch, return_exceptions=True)
        return [r if isinstance(r, Exception) else calls.transition(r) for r in replies]

    async def cancel_pending(self, ids: Sequence[str], note: str) -> CancelledPending:
        """An operator's cancel of ``ids``, pending jobs, in one call (a bulk cancel, on the lane
        when it is free, as a redrive's): those cancelled, those left to ``cancel_many``, the
        refused ones."""
        call = calls_ops.cancel_pending(self.keys, self.sender.now(), ids=ids, note=note)
        return calls_ops.cancelled_pending(await self.sender.call_on_lane(call))

    async def limit(
        self,
        *,
        action: str,
        kind: str,
        per_key: bool,
        concurrency: int = 0,
        rate_count: int = 0,
        rate_ms: int = 0,
    ) -> bool:
        """Set or clear a limit of ``kind``: True when one was set or cleared."""
        call = calls_ops.limit(
            self.keys,
            self.sender.now(),
            action=action,
            kind=kind,
            per_key=per_key,
            concurrency=concurrency,
            rate_count=rate_count,
            rate_ms=rate_ms,
        )
        return int(await self.sender.call(call)) == 1

    # -- schedules ---------------------------------------------------------------------

    async def schedule_upsert(
        self,
        *,
        schedule_id: str,
        fingerprint: str,
        next_at: int | None,
        anchor: int | None,
        definition: dict[str, calls.ScriptArg],
    ) -> calls_schedule.Upserted:
        call = calls_schedule.schedule_upsert(
            self.keys,
            self.sender.now(),
            schedule_id=schedule_id,
            fingerprint=fingerprint,
            next_at=next_at,
            anchor=anchor,
            definition=definition,
        )
        return calls_schedule.upserted(await self.sender.call(call))

    async def schedule_pause(
        self, *, schedule_id: str, pause: bool, version: str = "", next_at: int | None = None
    ) -> Transition:
        call = calls_schedule.schedule_pause(
            self.keys,
            self.sender.now(),
            schedule_id=schedule_id,
            pause=pause,
            version=version,
            next_at=next_at,
        )
        return calls.transition(await self.sender.call(call))

    async def schedule_due(self, *, limit: int) -> Due:
        return calls_schedule.due(
            await self.sender.call(calls_schedule.schedule_due(self.keys, self.sender.now(), limit=limit))
        )

    async def schedule_fire(
        self,
        *,
        schedule_id: str,
        job_id: str,
        version: str = "",
        fire_at: int | None = None,
        next_at: int | None = None,
        fires: int = 1,
        fault: str = "",
    ) -> Fired:
        """Fire a due schedule (or, ``fire_at`` None, trigger one job now); ``fault``: what the
        caller found corrupt in its stored timing ('' for nothing): the script pauses it instead."""
        call = calls_schedule.schedule_fire(
            self.keys,
            self.sender.now(),
            schedule_id=schedule_id,
            job_id=job_id,
            version=version,
            fire_at=fire_at,
            next_at=next_at,
            fires=fires,
            fault=fault,
        )
        return calls_schedule.fired(await self.sender.call(call))

    # -- the worker: claims and upkeep ---------------------------------------------------

    def claim_op(
        self, *, count: int, worker: str, token_base: str, default_lease_ms: int, stop_key: str | None = None
    ) -> Op[ClaimReply]:
        """A claim of up to ``count`` jobs for ``worker``, to send (``claim``, ``send_ops``, ``packed``)."""
        call = calls.claim(
            self.keys,
            self.sender.now(),
            count=count,
            worker=worker,
            token_base=token_base,
            default_lease_ms=default_lease_ms,
            stop_key=stop_key,
        )
        return Op(
            call,
            functools.partial(calls.claim_reply, token_base=token_base, default_lease_ms=default_lease_ms),
        )

    async def claim(self, *, count: int, worker: str, token_base: str, default_lease_ms: int) -> ClaimReply:
        op = self.claim_op(
            count=count, worker=worker, token_base=token_base, default_lease_ms=default_lease_ms
        )
        return op.parse(await self.sender.call(op.call))

    async def extend(self, leases: Sequence[tuple[str, str, int]]) -> Extended:
        """Renew the leases ``(job id, token, lease ms)``: those lost, and those an operator cancelled."""
        return calls.extended(await self.sender.call(calls.extend(self.keys, self.sender.now(), leases)))

    def reclaim_op(self, *, batch: int, max_failures: str) -> Op[Reclaimed]:
        """A reclaim of up to ``batch`` jobs whose lease expired, to send with others (``send_ops``)."""
        call = calls.reclaim(self.keys, self.sender.now(), batch=batch, max_failures=max_failures)
        return Op(call, calls.reclaimed)

    async def reclaim(self, *, batch: int, max_failures: str) -> Reclaimed:
        """Take back up to ``batch`` jobs whose lease expired."""
        return await self.send(self.reclaim_op(batch=batch, max_failures=max_failures))

    async def progress(self, job_id: str, token: str, value: bytes) -> bool:
        """A running job's progress, for its lease holder only: whether it was written."""
        call = calls_obs.progress(self.keys, self.sender.now(), job_id=job_id, token=token, value=value)
        return calls_obs.progressed(await self.sender.call(call))

    # -- the worker: a run's ending --------------------------------------------------------

    @staticmethod
    def completion(job_id: str, token: str, ending: Completed, state: RunState) -> Completion:
        """One job's values in a (batched) completion call (``complete_op``)."""
        return calls.completion(job_id, token, ending.note, state.attachment, state.carry, ending.result)

    def complete_op(
        self, completions: Sequence[Completion], retention: Retained = KEEP_ALL
    ) -> Op[list[Transition]]:
        """Complete many runs of this queue in one call, each checked on its own; the
        completed jobs past ``retention`` are trimmed in the same call."""
        call = calls.complete(
            self.keys,
            self.sender.now(),
            completions,
            keep_ms=retention.completed_ms,
            max_kept=retention.completed_max,
        )
        return Op(call, calls.completed)

    def end_run(self, lease: Lease, ending: Ending, state: RunState, args: EndingArgs) -> Op[Transition]:
        """The call that writes ``ending`` for the run holding ``lease`` (a completion alone too)."""
        k, now, job_id, token = self.keys, self.sender.now(), lease.job_id, lease.token
        call: calls.Call
        if isinstance(ending, Completed):
            one = self.complete_op([self.completion(job_id, token, ending, state)], args.retention)
            return Op(one.call, lambda reply: calls.completed(reply)[0])
        if isinstance(ending, Paused):
            call = calls.pause(
                k,
                now,
                job_id=job_id,
                token=token,
                priority=lease.priority,
                delay_ms=ending.delay_ms,
                note=ending.note,
                attachment=state.attachment,
                carry=state.carry,
            )
        elif isinstance(ending, Suspended):
            call = calls.suspend(
                k,
                now,
                job_id=job_id,
                token=token,
                note=ending.note,
                attachment=state.attachment,
                carry=state.carry,
                output=ending.output,
            )
        elif isinstance(ending, Failed):
            call = calls.retry(
                k,
                now,
                job_id=job_id,
                token=token,
                priority=lease.priority,
                note=ending.note,
                attachment=state.attachment,
                carry=state.carry,
                base_ms=args.base_ms,
                cap_ms=args.cap_ms,
                jitter=args.jitter,
                max_failures=args.max_failures,
                error_type=ending.error_type,
                traceback=ending.traceback,
            )
        elif isinstance(ending, Dead):
            call = calls.dead(
                k,
                now,
                job_id=job_id,
                token=token,
                note=ending.note,
                attachment=state.attachment,
                carry=state.carry,
                reason=ending.reason.value,
                error_type=ending.error_type,
                traceback=ending.traceback,
            )
        elif isinstance(ending, Cancelled):
            call = calls.cancel(
                k,
                now,
                job_id=job_id,
                note=ending.note,
                token=token,
                attachment=state.attachment,
                carry=state.carry,
            )
        elif isinstance(ending, Released):
            call = calls.release(
                k,
                now,
                job_id=job_id,
                token=token,
                priority=lease.priority,
                carry=state.carry,
                note=ending.note,
            )
        else:  # pragma: no cover - every Ending is handled above
            raise TypeError(f"not a run ending: {ending!r}")
        return Op(call, calls.transition)

    async def send(self, op: Op[T]) -> T:
        """Send one op through the pool: its parsed reply."""
        return op.parse(await self.sender.call(op.call))


__all__ = [
    "APPLIED",
    "NO_STATE",
    "Call",
    "ClaimReply",
    "ClaimedJob",
    "Completion",
    "EVENTS_DEFAULT",
    "EVENTS_MAXLEN",
    "FINISHED_STATES",
    "FlowJob",
    "HISTORY_DEFAULT",
    "Policy",
    "Due",
    "KEEP_ALL",
    "EndingArgs",
    "Extended",
    "Fired",
    "Purged",
    "Reclaimed",
    "Retained",
    "Retried",
    "ScriptArg",
    "Transition",
    "bad_delay",
    "corrupt_job",
    "Lease",
    "Op",
    "QueueStore",
    "RunState",
    "send_ops",
]
