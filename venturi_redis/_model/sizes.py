"""How large a value, and how many jobs, one call may put in Redis (docs/guarantees.md, "Sizes and limits").

Redis takes no argument over ``proto-max-bulk-len`` (512 MB by default): it
answers a protocol error and closes the connection, failing every other call
pipelined on it (a worker's batch of completions with it). And it serves
nobody else while one script or transaction runs, so a value of many MB, or
an atomic call of many jobs, blocks every producer and worker of the server
for as long as Redis takes to copy it. Every value a job stores is therefore
capped where it is made:

* what a producer writes (a payload, a carry, a resume input): the client's
  ``max_payload_bytes``, raised as ``PayloadTooLarge`` before anything is sent;
* what a run writes: its carry and attachment under the same cap, its result
  or output under ``max_result_bytes``, a progress value under
  ``PROGRESS_BYTES``; a run whose value is over its cap fails with a note
  naming the cap (retried, then dead at the backstop), the value not written;
* text: a note keeps its first ``NOTE_CHARS`` characters (an exception of
  10 MB is a readable note, log line and journal entry, not 10 MB of each);
* calls of many jobs: ``enqueue_many`` takes at most ``max_batch_jobs`` tasks
  and ``max_batch_bytes`` of encoded payloads per call (it is one atomic
  transaction), ``enqueue_flow`` at most ``max_batch_bytes`` too.

Pure: the producer and the worker both import it.
"""

from __future__ import annotations

from .errors import ConfigurationError, PayloadTooLarge

# The highest cap: Redis takes no argument longer than proto-max-bulk-len
# (512 MB by default), and a stored value can be a little longer than the value
# capped (encryption adds 34 bytes; a dependency's result copy, its KIND).
MAX_VALUE_BYTES = 500 << 20
# Client(max_payload_bytes=...): a payload, a carry, a resume input, an attachment.
DEFAULT_MAX_PAYLOAD = 1 << 20
# Client(max_result_bytes=...): a run's result (Outcome.completed) or output (Outcome.suspend).
DEFAULT_MAX_RESULT = 8 << 20
# Client(max_batch_jobs=...): tasks per enqueue_many call. Redis runs the call's
# transaction whole, ~15 µs a job: 10,000 keep it near a tenth of a second
# (100,000 held Redis for 1.5 s; 400,000 outlasted the 5 s socket timeout, so
# the caller got an error for jobs that were all created).
DEFAULT_MAX_BATCH_JOBS = 10_000
# Client(max_batch_bytes=...): encoded payloads per enqueue_many or
# enqueue_flow call (Redis copies them at ~5 ms a MB while nothing else runs).
DEFAULT_MAX_BATCH_BYTES = 32 << 20
# A progress value (ctx.report_progress): it is also an event of the queue's
# stream, which keeps about 1,000, so the stream stays under ~64 MB.
PROGRESS_BYTES = 64 << 10
# Characters a note keeps (a handler's exception text, an outcome's note).
NOTE_CHARS = 4096


def bounded_note(text: str) -> str:
    """``text`` as a note keeps it: its first ``NOTE_CHARS`` characters, and how many were cut."""
    if len(text) <= NOTE_CHARS:
        return text
    return f"{text[:NOTE_CHARS]}... ({len(text) - NOTE_CHARS:,} more characters not kept)"


def checked_cap(name: str, value: object, top: int = MAX_VALUE_BYTES) -> int:
    """A ``Client`` size option, checked: a whole number from 1 to ``top``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        hint = " (Redis takes no value over proto-max-bulk-len, 512 MB)" if top == MAX_VALUE_BYTES else ""
        raise ConfigurationError(f"{name} must be an int from 1 to {top:,}{hint}, got {value!r}")
    return value


def over_cap(what: str, size: int, cap: int, option: str) -> PayloadTooLarge:
    """The error of a value over its cap: its size, the cap, the option that sets it, what to do."""
    return PayloadTooLarge(
        f"{what} is {size:,} bytes encoded, over the cap of {cap:,} (Client({option}=...)); "
        "store large data elsewhere (object storage, a database) and keep a reference in the job"
    )
