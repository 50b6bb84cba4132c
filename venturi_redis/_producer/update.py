"""``queue.update``: change a pending job in place, in one script (lua/update.lua).

Every argument is checked here before anything is sent, as ``enqueue`` checks
its own (``_store/prepare.py``): a refused call writes nothing. The script
then refuses, with nothing written, a job that is not pending (``False``), a
task of another KIND, and a dedup key another job holds (both
``ConfigurationError``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._model.backoff import to_ms
from .._model.codec import pack_model
from .._model.enums import Priority
from .._model.errors import ConfigurationError, PayloadTooLarge, TaskDefinitionError
from .._model.task import Task, task_kind
from .._store.checks import checked_at, checked_dedup_field
from .base import server_now_ms

if TYPE_CHECKING:
    from .base import QueueLike


async def update(
    queue: QueueLike,
    job_id: str,
    *,
    task: Task[Any] | None = None,
    priority: Priority | int | str | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
) -> bool:
    """See ``Queue.update``."""
    if task is None and priority is None and delay is None and at is None:
        raise ConfigurationError(f"update of job {job_id}: give task=, priority=, delay= or at=")
    kind, payload, field = "", b"", ""
    if task is not None:
        if not isinstance(task, Task):
            raise ConfigurationError(f"update expects a vr.Task instance, got {type(task).__name__}")
        try:
            kind = task_kind(type(task))
            payload = pack_model(task)
            key = task.dedup_key()
            field = "" if key is None else checked_dedup_field(kind, key)
        except TaskDefinitionError as exc:
            raise ConfigurationError(f"update of job {job_id}: {exc}") from None
        cap = queue.client.max_payload_bytes
        if len(payload) > cap:
            raise PayloadTooLarge(
                f"update of job {job_id}: {kind} payload is {len(payload)} bytes, over {cap}"
            )
        if queue.client.encryption is not None:  # after the cap's check, as at enqueue
            payload = queue.client.encryption.seal(payload)
    label = "" if priority is None else Priority.parse(priority).label
    delay_ms = ""
    if at is not None:
        at_ms = checked_at(at, 0 if delay is None else delay)
        delay_ms = str(max(0, at_ms - await server_now_ms(queue.client)))
    elif delay is not None:
        delay_ms = str(to_ms(delay, "delay"))
    got = await queue.store.update(
        job_id, kind=kind, payload=payload, dedup=field, priority=label, delay_ms=delay_ms
    )
    if got.refusal == "kind":
        raise ConfigurationError(
            f"job {job_id} is of KIND {got.detail!r}; update(task=...) needs a task of that KIND, "
            f"got {kind!r}: enqueue a new job instead"
        )
    if got.refusal == "ordered":
        raise ConfigurationError(
            f"job {job_id} has the order key {got.detail!r}; a task with a dedup key cannot replace "
            "its task (docs/semantics.md, 'Ordered keys'); nothing was changed"
        )
    if got.refusal == "held":
        raise ConfigurationError(
            f"job {job_id}: the new task's dedup key is held by job {got.detail}; "
            "nothing was changed (merge into that job with enqueue, or cancel it first)"
        )
    return got.applied
