"""Job ids: ULIDs, monotonic within one process.

A claim breaks ties between jobs of equal eligibility by id, so ids made in
the same millisecond by one process must sort in the order they were made
(``enqueue_many`` keeps its order). Across processes, ids of the same
millisecond sort arbitrarily, which is the best any clock-based id can do.
"""

from __future__ import annotations

import os
import threading
import time

from ulid import ULID

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_RAND_MAX = (1 << 80) - 1


def new_job_id() -> str:
    """A new ULID string, greater than every id this process made before."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            # Same (or a stepped-back) millisecond: count up from the last id.
            ms = _last_ms
            rand = _last_rand + 1
            if rand > _RAND_MAX:  # 2**80 ids in one ms: borrow the next ms
                ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
        else:
            # Keep the top bit clear so a run of increments never overflows.
            rand = int.from_bytes(os.urandom(10), "big") >> 1
        _last_ms, _last_rand = ms, rand
    return str(ULID.from_bytes(ms.to_bytes(6, "big") + rand.to_bytes(10, "big")))


def ulid_ms(job_id: str) -> int:
    """The millisecond timestamp embedded in a ULID."""
    return ULID.from_str(job_id).milliseconds
