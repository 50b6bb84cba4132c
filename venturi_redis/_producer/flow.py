"""Workflows on the producer side: ``enqueue(task, after=...)`` and ``enqueue_flow``.

Both end in one call of ``lua/enqueue_flow.lua`` (``QueueStore.enqueue_flow``),
so what they write is written whole or not at all, and every dependency is
checked by the script before its first write. docs/workflows.md is the
user's guide; lua/include/graph.lua says how the graph is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._model.errors import ConfigurationError, TaskDefinitionError
from .._model.flow import Flow
from .._model.outcome import UNSET
from .._model.task import Task
from .._store.checks import batch_too_large
from .._store.prepare import Prepared, prepare
from .._store.store import FlowJob, Policy

if TYPE_CHECKING:
    from .base import QueueLike

# Most ids one job may wait on, and most children one enqueue_flow writes:
# the script runs as one atomic step, and Redis serves nothing else meanwhile.
MAX_FLOW_JOBS = 10_000


def policy_of(task: Task[Any]) -> Policy:
    value = task.on_dependency_failure()
    if value not in ("fail", "ignore"):
        raise TaskDefinitionError(
            f"{type(task).__qualname__}.on_dependency_failure() must return 'fail' or 'ignore', got {value!r}"
        )
    return value


def _no_dedup(job: Prepared) -> None:
    # A dedup merge folds a new job into a pending one; a job in a graph
    # cannot be folded without losing its links (or gaining the holder's),
    # so the two do not combine (docs/workflows.md, "Dedup").
    if job.dedup:
        raise ConfigurationError(
            f"{job.kind} has a dedup key: a task with dedup_key() cannot be part of a workflow "
            "(after= or enqueue_flow); return None from dedup_key() for these jobs"
        )
    # A job waits on its order key in enqueue order (docs/semantics.md,
    # "Ordered keys"); one that also waits on other jobs would hold its key
    # while WAITING, or lose its place: the two do not combine either.
    if job.order_key:
        raise ConfigurationError(
            f"{job.kind} has an order key: a task with order_key() cannot be part of a workflow "
            "(after= or enqueue_flow); return None from order_key() for these jobs"
        )


def checked_ids(after: object) -> tuple[str, ...]:
    """``after=`` as a tuple of distinct job ids, in the order given."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Sequence):
        raise ConfigurationError(f"after= takes a list of job ids, got {type(after).__name__}")
    out: dict[str, None] = {}
    for job_id in after:
        if not isinstance(job_id, str) or not job_id:
            raise ConfigurationError(f"after= takes job ids (non-empty str), got {job_id!r}")
        out[job_id] = None
    if len(out) > MAX_FLOW_JOBS:
        raise ConfigurationError(f"a job may wait on at most {MAX_FLOW_JOBS} jobs, got {len(out)}")
    return tuple(out)


async def _run(queue: QueueLike, jobs: list[FlowJob]) -> None:
    await queue.client._recorded.ensure(queue.client.redis, queue.name)  # registry.py
    await queue.store.enqueue_flow(jobs)


async def enqueue_after(queue: QueueLike, task: Task[Any], job: Prepared, after: object) -> str:
    """``queue.enqueue(task, after=...)`` once ``prepare`` has checked the task."""
    _no_dedup(job)
    ids = checked_ids(after)
    await _run(queue, [FlowJob(job, policy_of(task), ids)])
    return job.id


async def enqueue_flow(queue: QueueLike, parent: Task[Any], children: Sequence[Task[Any] | Flow]) -> Flow:
    """``queue.enqueue_flow``: the children, then the parent waiting on them, in one script call."""
    if isinstance(children, (str, bytes)) or not isinstance(children, Sequence):
        got = type(children).__name__
        raise ConfigurationError(f"children must be a list of tasks or vr.Flow, got {got}")
    # Counted before any child is encoded: a call of 100,000 is refused at once.
    tasks = sum(1 for child in children if not isinstance(child, Flow))
    if tasks > MAX_FLOW_JOBS:
        raise ConfigurationError(
            f"enqueue_flow takes at most {MAX_FLOW_JOBS:,} children, got {tasks:,}: the call is one "
            "script, which Redis runs whole while it serves nobody else; build a tree of flows "
            "instead (a vr.Flow child is waited on through its parent; docs/workflows.md)"
        )
    cap, crypt = queue.client.max_payload_bytes, queue.client.encryption
    most, total = queue.client.max_batch_bytes, 0
    # The call's nonces drawn at once, here: one per child and the parent (a
    # vr.Flow child leaves its own unused); the jobs are prepared without an await.
    seal = None if crypt is None else crypt.sealer(len(children) + 1)
    jobs: list[FlowJob] = []
    ids: list[str] = []
    for child in children:
        if isinstance(child, Flow):
            ids.append(child.parent_id)
            continue
        job = prepare(
            child, cap, encryption=seal, delay=0.0, priority=None, lease=None, max_failures=UNSET, carry=None
        )
        _no_dedup(job)
        total += len(job.payload)
        if total > most:
            raise batch_too_large("enqueue_flow", tasks + 1, most)
        jobs.append(FlowJob(job, policy_of(child), ()))
        ids.append(job.id)
    top = prepare(
        parent, cap, encryption=seal, delay=0.0, priority=None, lease=None, max_failures=UNSET, carry=None
    )
    _no_dedup(top)
    if total + len(top.payload) > most:
        raise batch_too_large("enqueue_flow", tasks + 1, most)
    waits = checked_ids(ids)
    jobs.append(FlowJob(top, policy_of(parent), waits))
    await _run(queue, jobs)
    return Flow(parent_id=top.id, children_ids=tuple(ids))
