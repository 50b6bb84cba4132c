"""Job ids: ULIDs, monotonic within one process.

A claim breaks ties between jobs of equal eligibility by id, so ids made in
the same millisecond by one process must sort in the order they were made
(``enqueue_many`` keeps its order). Across processes, ids of the same
millisecond sort arbitrarily, which is the best any clock-based id can do.
"""

from __future__ import annotations

import base64
import os
import threading
import time

from ulid import ULID

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_RAND_MAX = (1 << 80) - 1
# RFC 4648 base32 letters to Crockford's (ULID's) alphabet, digit for digit.
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def _encode(ms: int, rand: int) -> str:
    """The 26-character ULID of (ms, rand), by the standard library's base32 encoder.

    A ULID is its 128 bits as 26 base32 digits (130 bits, two leading zero
    bits). Shifted left by 30 bits, the 128 bits fill 20 bytes from bit 2 on,
    so the first 26 digits of their RFC 4648 encoding are the ULID's digits,
    in the standard alphabet. That encoder works on whole 5-byte groups and is
    several times faster than python-ulid's digit-by-digit one; ``test_ids``
    checks that both agree.
    """
    value = ((ms << 80) | rand) << 30
    return base64.b32encode(value.to_bytes(20, "big"))[:26].translate(_TO_CROCKFORD).decode()


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
    return _encode(ms, rand)


def ulid_ms(job_id: str) -> int:
    """The millisecond timestamp embedded in a ULID."""
    return ULID.from_str(job_id).milliseconds
