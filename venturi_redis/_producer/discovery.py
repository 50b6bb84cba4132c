"""Finding queues and jobs by SCAN: which queues exist, which queue holds a job.

For the CLI, which is given a job id or nothing and must find the queue.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .._model.errors import ConfigurationError
from .reads import _text

if TYPE_CHECKING:
    from .base import ClientLike

_JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")


async def find_job_queue(client: ClientLike, job_id: str) -> str | None:
    """The queue holding job ``job_id``, by SCAN (walks the keyspace; give ``--queue`` when known)."""
    if not _JOB_ID_RE.fullmatch(job_id):
        raise ConfigurationError(f"{job_id!r} is not a job id (a ULID such as 01J9ZQ4K8V3M0S5B2N7XWYQ1RT)")
    pattern = f"{client.namespace}:{{*}}:job:{job_id}"
    async for key in client.redis.scan_iter(match=pattern, count=1000):
        return _queue_of(_text(key), client.namespace)
    return None


# Index keys that make a queue exist: a queue with only a schedule has only
# its `schedules:due` zset (and hashes and sets the SCANs do not look at).
_SUFFIXES = (
    "pending:",
    "running",
    "suspended",
    "completed",
    "dead",
    "cancelled",
    "meta",
    "workers",
    "waiting",
    "schedules:due",
)


def _queue_of(key: str, namespace: str) -> str | None:
    head = f"{namespace}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}:", len(head))
    return key[len(head) : end] if end > 0 else None


async def discover_queues(client: ClientLike) -> list[str]:
    """Names of the queues with any index zset, a meta hash, registered workers or a schedule.

    Two SCANs of the keyspace, filtered by the server (``TYPE zset`` skips the
    job hashes and journals), so only index keys cross the wire.
    """
    names: set[str] = set()
    pattern = f"{client.namespace}:{{*}}:*"
    scans = [
        client.redis.scan_iter(match=pattern, count=1000, _type="zset"),
        client.redis.scan_iter(match=f"{client.namespace}:{{*}}:meta", count=1000),
    ]
    for scan in scans:
        async for raw in scan:
            key = _text(raw)
            name = _queue_of(key, client.namespace)
            if name is None:
                continue
            rest = key[len(client.namespace) + len(name) + 4 :]
            if rest.startswith(_SUFFIXES):
                names.add(name)
    return sorted(names)


async def discover_schedule_queues(client: ClientLike) -> list[str]:
    """Names of the queues with schedules (their ``schedules`` set), by one SCAN."""
    names: set[str] = set()
    pattern = f"{client.namespace}:{{*}}:schedules"
    async for raw in client.redis.scan_iter(match=pattern, count=1000, _type="set"):
        name = _queue_of(_text(raw), client.namespace)
        if name is not None:
            names.add(name)
    return sorted(names)
