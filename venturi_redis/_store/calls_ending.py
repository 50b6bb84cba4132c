"""The calls that end a run: complete (one or many jobs), pause, suspend, retry,
dead, release, cancel. Each checks the run's lease token in its script
(``lua/include/lease.lua``); ``QueueStore.end_run`` picks the one an ending needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._model.codec import text
from .._model.enums import Priority
from .._model.errors import ConfigurationError
from .calls_base import _MAX_MS, APPLIED, Call, ScriptArg, Transition, _ending_keys
from .keys import QueueKeys

# -- a running job's outcome -------------------------------------------------------

# complete.lua's six values for one job: id, lease token, note, attachment,
# carry ('' = unchanged), result.
Completion = list[ScriptArg]


def completion(
    job_id: str, token: str, note: str, attachment: bytes, carry: bytes, result: bytes
) -> Completion:
    return [job_id, token, note, attachment, carry, result]


def complete(
    keys: QueueKeys, now: str, completions: Sequence[Completion], *, keep_ms: str = "", max_kept: str = ""
) -> Call:
    """complete.lua for one or more jobs of one queue (each checked on its own).

    ``keep_ms`` and ``max_kept``: the retention of completed jobs ('' = no
    such bound), trimmed in the same call (lua/include/retention.lua).
    """
    args: list[ScriptArg] = [now, keys.prefix, keep_ms, max_kept, len(completions)]
    for values in completions:
        args.extend(values)
    return Call(
        "complete",
        [
            keys.running,
            keys.completed,
            keys.meta,
            keys.journal_compact,
        ],
        args,
    )


def completed(reply: Any) -> list[Transition]:
    """complete.lua's reply: per job, applied, or refused with its reason."""
    return [APPLIED if one == 1 else Transition(False, text(one)) for one in reply]


def pause(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    priority: Priority,
    delay_ms: int,
    note: str,
    attachment: bytes,
    carry: bytes,
) -> Call:
    """pause.lua: a RUNNING job goes back to pending ``delay_ms`` from now, not charged."""
    bad = bad_delay(delay_ms)
    if bad is not None:
        raise ConfigurationError(bad)
    return Call(
        "pause",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, token, delay_ms, note, attachment, carry],
    )


def bad_delay(delay_ms: object) -> str | None:
    """Why ``delay_ms`` cannot be a pause's delay, or None when it can.

    A NaN or infinite delay (``vr.Outcome("pause", delay_ms=nan)``) never
    reaches Redis: the worker turns it into a failed run with this note.
    """
    if isinstance(delay_ms, int) and not isinstance(delay_ms, bool) and 0 <= delay_ms < _MAX_MS:
        return None
    return f"pause delay must be a whole number of ms from 0 to 2**53, got {delay_ms!r}"


def suspend(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    note: str,
    attachment: bytes,
    carry: bytes,
    output: bytes,
) -> Call:
    """suspend.lua: a RUNNING job waits, suspended, for ``resume``."""
    return Call(
        "suspend",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.suspended,
            *_ending_keys(keys),
            keys.wake,
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, token, note, attachment, carry, output],
    )


def retry(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    priority: Priority,
    note: str,
    attachment: bytes,
    carry: bytes,
    base_ms: int,
    cap_ms: int,
    jitter: float,
    max_failures: str,
    error_type: str = "",
    traceback: str = "",
) -> Call:
    """retry.lua: a failed run goes back to pending after its backoff, or dies at the backstop.

    ``error_type`` and ``traceback`` (the raised exception's type and the tail
    of its traceback, '' for none) are kept in the run's ``failed`` journal entry.
    """
    return Call(
        "retry",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dead,
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
            keys.journal_compact,
        ],
        [
            now,
            keys.prefix,
            job_id,
            token,
            note,
            attachment,
            carry,
            base_ms,
            cap_ms,
            repr(jitter),
            max_failures,
            error_type,
            traceback,
        ],
    )


def dead(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    token: str,
    note: str,
    attachment: bytes,
    carry: bytes,
    reason: str,
    error_type: str = "",
    traceback: str = "",
) -> Call:
    """dead.lua: a RUNNING job dies at once (``reason``: a ``DeadReason``, e.g. permanent, unknown_kind).

    ``error_type`` and ``traceback``: as for ``retry``, kept in the ``dead`` entry.
    """
    return Call(
        "dead",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.dead,
            *_ending_keys(keys),
            keys.wake,
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, token, note, attachment, carry, reason, error_type, traceback],
    )


def release(
    keys: QueueKeys, now: str, *, job_id: str, token: str, priority: Priority, carry: bytes, note: str
) -> Call:
    """release.lua: a RUNNING job goes back to pending, not charged (a graceful shutdown)."""
    return Call(
        "release",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.running,
            keys.pending_by_priority[priority],
            keys.dedup,
            keys.wake,
            *_ending_keys(keys),
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, token, carry, note],
    )


def cancel(
    keys: QueueKeys,
    now: str,
    *,
    job_id: str,
    note: str,
    token: str = "",
    attachment: bytes = b"",
    carry: bytes = b"",
) -> Call:
    """cancel.lua: an operator's cancel (``token`` ''), or a worker ending its own run cancelled."""
    return Call(
        "cancel",
        [
            keys.job(job_id),
            keys.journal(job_id),
            keys.suspended,
            keys.running,
            keys.cancelled,
            keys.dedup,
            *keys.pending_high_first,
            *_ending_keys(keys),
            keys.wake,
            keys.limits_parked,
            keys.journal_compact,
        ],
        [now, keys.prefix, job_id, note, token, attachment, carry],
    )
