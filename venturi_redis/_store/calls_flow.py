"""The call of ``lua/enqueue_flow.lua``: jobs that wait for other jobs (workflows).

A sibling of ``calls.py`` (which would pass ~600 lines with it), owning this
one script's KEYS, ARGV and reply the same way. The finish scripts (complete,
dead, retry, reclaim, cancel) need no workflow argument: a finishing job's
dependents are found from its hash and the queue's prefix
(``lua/include/graph.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from .calls import Call, ScriptArg, job_args
from .keys import QueueKeys
from .prepare import Prepared

Policy = Literal["fail", "ignore"]


class FlowJob(NamedTuple):
    """One job of an ``enqueue_flow`` call: the job, its failure policy, the ids it waits on."""

    job: Prepared
    policy: Policy
    after: tuple[str, ...]


def enqueue_flow(keys: QueueKeys, now: str, jobs: Sequence[FlowJob]) -> Call:
    """enqueue_flow.lua for ``jobs``, each after every job it waits on that is in the call."""
    args: list[ScriptArg] = [now, keys.prefix, len(jobs)]
    for job, policy, after in jobs:
        args += job_args(job)
        args += [policy, len(after), *after]
    return Call(
        "enqueue_flow",
        [keys.waiting, keys.wake, *keys.pending_high_first, keys.meta, keys.journal_compact],
        args,
    )


def flow_created(reply: Any) -> bool:
    """enqueue_flow.lua's reply: False for a resend (the jobs existed; nothing written)."""
    return int(reply[1]) > 0
