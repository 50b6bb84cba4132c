"""Job ids: ULIDs, monotonic within one process.

A claim breaks ties between jobs of equal eligibility by id, so ids made in
the same millisecond by one process must sort in the order they were made
(``enqueue_many`` keeps its order). Across processes, ids of the same
millisecond sort arbitrarily, which is the best any clock-based id can do.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

from ulid import ULID

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_RAND_MAX = (1 << 80) - 1
_LOW30 = (1 << 30) - 1
# Crockford's base32 (ULID's digits), and every two-digit string indexed by the
# 10-bit value it spells: one lookup encodes two digits.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)


def _head(ms: int, rand_high: int) -> str:
    """The first 20 digits of a ULID: the 48-bit ms, then the top 50 bits of rand.

    A ULID is 26 base32 digits, most significant first: 10 for the ms (48 bits
    with two leading zero bits) and 16 for the 80 random bits. Both split evenly
    into 10-bit pairs, so the id is 13 table lookups on small ints; python-ulid
    goes digit by digit, and the standard library's base32 encoder (Python code
    until 3.13) is several times slower. ``test_ids`` checks all three agree.
    """
    p = _PAIRS
    return (
        p[ms >> 40]
        + p[(ms >> 30) & 1023]
        + p[(ms >> 20) & 1023]
        + p[(ms >> 10) & 1023]
        + p[ms & 1023]
        + p[rand_high >> 40]
        + p[(rand_high >> 30) & 1023]
        + p[(rand_high >> 20) & 1023]
        + p[(rand_high >> 10) & 1023]
        + p[rand_high & 1023]
    )


def _encode(ms: int, rand: int) -> str:
    """The 26-character ULID of (ms, rand)."""
    low = rand & _LOW30
    p = _PAIRS
    return _head(ms, rand >> 30) + p[low >> 20] + p[(low >> 10) & 1023] + p[low & 1023]


def _encode_run(ms: int, first: int, count: int) -> list[str]:
    """The ULIDs (ms, first), (ms, first + 1), ... ``count`` of them, in order.

    Consecutive ids share their first 20 digits until the low 30 bits of rand
    wrap, so those are encoded once per wrap and each id costs three lookups.
    """
    p = _PAIRS
    out: list[str] = []
    end = first + count
    while first < end:
        high, low = first >> 30, first & _LOW30
        stop = min(end, (high + 1) << 30)  # where the low bits wrap and the head changes
        head = _head(ms, high)
        out += [head + p[x >> 20] + p[(x >> 10) & 1023] + p[x & 1023] for x in range(low, low + stop - first)]
        first = stop
    return out


# Random bytes are read from the OS 64 draws at a time (one getrandom call, not
# one per millisecond of enqueues); the caller of _fresh_rand holds _lock.
_POOL_BYTES = 10 * 64
_pool = b""
_pool_at = 0


def _fresh_rand() -> int:
    global _pool, _pool_at
    at = _pool_at
    if at >= len(_pool):
        _pool, at = os.urandom(_POOL_BYTES), 0
    _pool_at = at + 10
    # Keep the top bit clear so a run of increments never overflows.
    return int.from_bytes(_pool[at : at + 10], "big") >> 1


def _after_fork_in_child() -> None:
    """A forked child starts afresh: it must not draw the parent's pooled bytes,
    nor count up from the parent's last id (both would repeat the parent's ids),
    nor inherit a lock another thread of the parent held at the fork."""
    global _lock, _last_ms, _last_rand, _pool, _pool_at
    _lock = threading.Lock()
    _last_ms, _last_rand = -1, 0
    _pool, _pool_at = b"", 0


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _next_locked(now_ms: int) -> tuple[int, int]:
    """The (ms, rand) of the next id, given the clock; the caller holds ``_lock``."""
    if now_ms > _last_ms:
        return now_ms, _fresh_rand()
    # Same (or a stepped-back) millisecond: count up from the last id.
    if _last_rand < _RAND_MAX:
        return _last_ms, _last_rand + 1
    return _last_ms + 1, _fresh_rand()  # 2**80 ids in one ms: borrow the next ms


def new_job_id() -> str:
    """A new ULID string, greater than every id this process made before."""
    global _last_ms, _last_rand
    with _lock:
        ms, rand = _next_locked(time.time_ns() // 1_000_000)
        _last_ms, _last_rand = ms, rand
    return _encode(ms, rand)


def new_job_ids(n: int) -> list[str]:
    """``n`` new ULID strings, increasing, each greater than every id made before.

    The same ids ``n`` calls of ``new_job_id`` would make within one millisecond
    (consecutive values of one random draw), for one lock, one clock read and
    one draw: ``enqueue_many`` takes its ids here.
    """
    global _last_ms, _last_rand
    if n <= 0:
        return []
    runs: list[tuple[int, int, int]] = []
    with _lock:
        ms, rand = _next_locked(time.time_ns() // 1_000_000)
        while rand + n - 1 > _RAND_MAX:  # the run would overflow rand: finish it, borrow the next ms
            take = _RAND_MAX - rand + 1
            runs.append((ms, rand, take))
            n -= take
            ms, rand = ms + 1, _fresh_rand()
        runs.append((ms, rand, n))
        _last_ms, _last_rand = ms, rand + n - 1
    if len(runs) == 1:
        return _encode_run(ms, rand, n)
    return [job_id for run in runs for job_id in _encode_run(*run)]


def ulid_ms(job_id: str) -> int:
    """The millisecond timestamp embedded in a ULID."""
    return ULID.from_str(job_id).milliseconds


def derived_job_id(ms: int, seed: bytes) -> str:
    """A ULID made from ``ms`` and a hash of ``seed``: the same inputs, the same id.

    A schedule's job for one fire time (``_producer/schedules.py``): two workers
    that fire the same fire time name the same job, so the second cannot make
    another (``lua/schedule_fire.lua``). It sorts by its fire time.
    """
    rand = int.from_bytes(hashlib.sha256(seed).digest()[:10], "big")
    return _encode(ms, rand)
