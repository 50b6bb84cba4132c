"""The calls' common types: a script call (``Call``), a transition's reply
(``Transition``), and the coded errors a script replies with (``script_error``).

See calls.py for the calling conventions every script follows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from .._model.codec import text
from .._model.errors import ConfigurationError, CorruptQueueError
from .keys import QueueKeys

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
