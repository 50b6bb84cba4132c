"""The calls' common types: a script call (``Call``), a transition's reply
(``Transition``), and the coded errors a script replies with (``script_error``).

See calls.py for the calling conventions every script follows.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

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

    An error a command inside the script raised is the exception Redis 7.0
    and later reply it as, on Redis 6.2 too (``_unwrapped``).
    """
    unwrapped = _unwrapped(exc)
    if unwrapped is not None:
        return unwrapped
    code, _, rest = str(exc).partition(" ")
    if code == "VR_WRONGTYPE":
        return CorruptQueueError(f"{rest}: the script moved no job; repair or delete that key")
    if code == "VR_CORRUPTJOB":
        return corrupt_job(rest)
    if code == "VR_BADARG":
        return ConfigurationError(rest)
    return exc


# Redis 6.2's reply for an error a command raised inside a script (7.0 and
# later reply the command's own error, its code first, which redis-py raises
# as its class): "Error running script (call to f_<sha>): @user_script:<line>:
# @user_script: <line>: -<CODE> <message>". A pipeline's error has redis-py's
# "Command # n (...) of pipeline caused error: " before it.
_WRAPPED = re.compile(
    r"Error running script \(call to f_(\w+)\): @user_script:(\d+): @user_script: \d+: -(\S+) (.*)", re.S
)
# The codes whose class the package or its callers rely on: a refusal at
# maxmemory (docs/guarantees.md: enqueue raises OutOfMemoryError and writes
# nothing), a write on a replica.
_UNWRAPPED: dict[str, type[ResponseError]] = {"OOM": OutOfMemoryError, "READONLY": ReadOnlyError}


def _unwrapped(exc: ResponseError) -> ResponseError | None:
    """A 6.2-wrapped error of a command the script ran, as 7.0+ raises it; None for any other.

    On 6.2 a script at maxmemory runs, and Redis refuses its first write
    (and only a first one: nothing was written), where 7.0 and later reply
    the same ``OOM`` error; only the reply's shape differs. The message is
    7.0's: the command's message, then ``script: <sha>, on @user_script:<line>.``
    """
    found = _WRAPPED.search(str(exc))
    if found is None or found.group(3) not in _UNWRAPPED:
        return None
    sha, line, code, message = found.groups()
    return _UNWRAPPED[code](f"{message} script: {sha}, on @user_script:{line}.")


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
    says it did (retry: ``'pending'`` or ``'dead'``, with ``delay_ms`` and
    ``failures`` as it wrote them; cancel: ``'cancelled'``
    or ``'requested'``; else ''); when refused, why (the job is unknown, in
    another state, or the lease token is stale).
    """

    applied: bool
    detail: str
    delay_ms: int = 0  # retry, back to pending: the delay the script chose (else 0)
    failures: int = 0  # retry: the failure count it wrote (else 0)


APPLIED = Transition(True, "")
# Largest delay in ms a script takes: Lua numbers are doubles, exact to 2**53.
_MAX_MS = 2**53


def transition(reply: Any) -> Transition:
    """``{1, ...}`` or ``{0, reason}``: the reply of pause, suspend, retry, dead, release, cancel, resume."""
    if int(reply[0]) == 1:
        if len(reply) > 3:  # retry.lua: {1, 'pending' or 'dead', delay_ms, failures}
            return Transition(True, text(reply[1]), int(reply[2]), int(reply[3]))
        return Transition(True, text(reply[1])) if len(reply) > 1 else APPLIED
    return Transition(False, text(reply[1]))


def _ending_keys(keys: QueueKeys) -> tuple[str, str, str, str]:
    """The last four KEYS of every script that ends a run (pause, suspend, retry,
    dead, release, cancel, reclaim): the queue's meta hash and event stream
    (events.lua), and the limits state and ready rotation a held slot goes back
    to (limits.lua)."""
    return (keys.meta, keys.events, keys.limits_state, keys.limits_ready)
