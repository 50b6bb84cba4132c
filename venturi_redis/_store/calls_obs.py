"""The calls of the observability scripts (issue 30), beside ``calls.py`` (which is near its size
limit): the same conventions, one owner per script. ``progress.lua`` is called from here only.
"""

from __future__ import annotations

from typing import Any

from .calls import Call
from .keys import QueueKeys

# The event stream's switch when a queue's meta hash has no `events` field:
# on, capped at about this many entries (lua/include/events.lua's
# EVENTS_DEFAULT; tests/test_events.py checks they agree). On by default:
# docs/observability.md gives the cost (each script call that moves jobs
# writes one entry, however many jobs it moves).
EVENTS_DEFAULT = "1000"
# Cap of a queue's stream when switched on without one: the default one (an entry of
# one job ~100 B, docs/redis-layout.md "Memory per job").
EVENTS_MAXLEN = int(EVENTS_DEFAULT)

# The metrics history's switch when a queue's meta hash has no `history`
# field (lua/include/history.lua's HISTORY_DEFAULT; tests/test_history.py
# checks they agree): off, since it costs every transition of the queue
# (docs/observability.md "Metrics history" gives the figures).
HISTORY_DEFAULT = "0"


def progress(keys: QueueKeys, now: str, *, job_id: str, token: str, value: bytes) -> Call:
    """progress.lua: a RUNNING job's progress (msgpack ``value``), for its lease holder only."""
    return Call(
        "progress",
        [keys.job(job_id), keys.meta, keys.events, keys.journal_compact],
        [now, keys.prefix, job_id, token, value],
    )


def progressed(reply: Any) -> bool:
    """progress.lua's reply: written (False: the job is not running under this token)."""
    return int(reply) == 1
