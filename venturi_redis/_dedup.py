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
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import anyio
from redis.exceptions import NoScriptError, WatchError

from ._codec import pack_model, text, unpack_model
from ._enums import Priority
from ._errors import MergeConflictError, PayloadTooLarge, TaskDefinitionError
from ._records import ENQUEUED_FIELDS, LazyJournal, journal_from
from ._task import Merge, Pending, Task

if TYPE_CHECKING:
    from ._client import Queue
    from ._prepare import Prepared

MAX_MERGE_ATTEMPTS = 64


async def merge_into(queue: Queue, task: Task[Any], job: Prepared, holder: str) -> str:
    """Resolve a dedup collision for ``job``; returns the id that holds the work."""
    client = queue.client
    for attempt in range(MAX_MERGE_ATTEMPTS):
        if not holder:
            # The key was free when we looked: try the atomic create again.
            name, keys, args = queue._enqueue_call([job])
            reply = await client.scripts.call(client.redis, name, keys, args)
            holder = text(reply[1])
            if not holder:
                return job.id
        result = await _try_merge(queue, task, job, holder)
        if result is not None:
            return result
        # Lost the race: back off briefly (jittered, so contenders spread out).
        await anyio.sleep(random.uniform(0, min(0.0005 * 2**attempt, 0.05)))
        holder = text(await client.redis.hget(queue.keys.dedup, job.dedup))
    raise MergeConflictError(
        f"queue {queue.name}: gave up merging {job.kind} with dedup field {job.dedup!r} after "
        f"{MAX_MERGE_ATTEMPTS} conflicting attempts; the key is under heavy contention, retry later"
    )


async def _try_merge(queue: Queue, task: Task[Any], job: Prepared, holder: str) -> str | None:
    """One optimistic attempt. Returns the resulting job id, or None to retry."""
    client = queue.client
    keys = queue.keys
    job_key = keys.job(holder)
    task_cls = type(task)
    async with client.redis.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(job_key)
            raw = await pipe.hgetall(job_key)
            if not raw or raw.get(b"state") != b"pending" or text(raw.get(b"dedup")) != job.dedup:
                return None  # claimed or replaced under us: the index has moved on
            # No stream yet for a job untouched since enqueue: journal_from
            # gives its `enqueued` entry from the hash just read.
            journal = LazyJournal(
                journal_from(
                    await pipe.xrange(keys.journal(holder)),
                    [raw.get(name.encode()) for name in ENQUEUED_FIELDS],
                )
            )
            existing = unpack_model(task_cls, raw[b"payload"])
            carry_cls = task_cls.carry_type()
            carry = unpack_model(carry_cls, raw[b"carry"]) if raw.get(b"carry") else task_cls.default_carry()
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
                    f"{task_cls.__qualname__}.merge() must return a vr.Merge, got {type(decision).__name__}"
                )
            if decision.decision == "independent":
                await pipe.reset()
                name, k, args = queue._enqueue_call([job], dedup_mode="force")
                await client.scripts.call(client.redis, name, k, args)
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
                new_prio = job.priority if job.explicit_priority else Priority.parse(new_task.priority())
            command = (
                "EVALSHA",
                client.scripts["merge"].sha,
                4,
                job_key,
                keys.journal(holder),
                keys.pending(old_prio),
                keys.pending(new_prio),
                holder,
                client.now_arg(),
                decision.decision,
                payload,
                carry_action,
                carry_bytes,
                new_prio.label,
                keys.wake,
            )
            pipe.multi()
            pipe.execute_command(*command)
            (applied,) = await pipe.execute()
        except WatchError:
            return None
        except NoScriptError:
            # The server lost (or never had) merge.lua: nothing was applied. Load
            # it and apply the same decision if the job is still as we read it,
            # so the task's merge() is not asked twice about one state.
            await client.redis.script_load(client.scripts["merge"].source)
            applied = await _apply_again(queue, job_key, raw, command)
    return holder if applied is not None and int(applied) == 1 else None


async def _apply_again(queue: Queue, job_key: str, raw: dict[bytes, bytes], command: tuple[Any, ...]) -> Any:
    """Run ``command`` in MULTI if the job hash still equals ``raw``; None if it changed."""
    async with queue.client.redis.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(job_key)
            if await pipe.hgetall(job_key) != raw:
                return None
            pipe.multi()
            pipe.execute_command(*command)
            (applied,) = await pipe.execute()
        except WatchError:
            return None
    return applied
