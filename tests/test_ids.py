"""Job ids: ULIDs from our table-driven encoder, identical to python-ulid's."""

from __future__ import annotations

import base64
import os

import pytest
from ulid import ULID

from venturi_redis._model import ids as _ids
from venturi_redis._model.ids import _RAND_MAX, _encode, _encode_run, new_job_id, new_job_ids, ulid_ms


def _reference(ms: int, rand: int) -> str:
    return str(ULID.from_bytes(ms.to_bytes(6, "big") + rand.to_bytes(10, "big")))


def _parts(job_id: str) -> tuple[int, int]:
    raw = ULID.from_str(job_id).bytes
    return int.from_bytes(raw[:6], "big"), int.from_bytes(raw[6:], "big")


@pytest.mark.parametrize(
    ("ms", "rand"),
    [
        (0, 0),
        (0, 1),
        (1, 0),
        ((1 << 48) - 1, (1 << 80) - 1),
        (1_764_000_000_000, 1 << 79),
        (1_764_000_000_000, (1 << 30) - 1),
        (1_764_000_000_000, 1 << 30),
    ],
)
def test_encoding_matches_python_ulid_at_the_edges(ms: int, rand: int) -> None:
    assert _encode(ms, rand) == _reference(ms, rand)


def test_encoding_matches_python_ulid_and_base32_on_random_values() -> None:
    crockford = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    for _ in range(20_000):
        ms = int.from_bytes(os.urandom(6), "big")
        rand = int.from_bytes(os.urandom(10), "big")
        # The standard library's RFC 4648 encoder of the 128 bits shifted to fill 130.
        b32 = base64.b32encode((((ms << 80) | rand) << 30).to_bytes(20, "big"))[:26].translate(crockford)
        assert _encode(ms, rand) == _reference(ms, rand) == b32.decode()


@pytest.mark.parametrize(
    ("first", "count"),
    [(0, 1), (5, 300), ((1 << 30) - 7, 20), ((3 << 30) - 1, 2), (_RAND_MAX - 9, 10), (1 << 79, 2_000)],
)
def test_a_run_encodes_each_value(first: int, count: int) -> None:
    ms = 1_764_000_000_000
    assert _encode_run(ms, first, count) == [_reference(ms, first + i) for i in range(count)]


def test_new_ids_increase_and_parse() -> None:
    ids = [new_job_id() for _ in range(5_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 26 for i in ids)
    assert ULID.from_str(ids[-1]).milliseconds == ulid_ms(ids[-1])


def test_batches_and_single_ids_interleave_in_order() -> None:
    ids: list[str] = []
    for n in (1, 0, 7, 1, 1_000, 3, 1):
        ids += new_job_ids(n)
        ids.append(new_job_id())
    assert len(ids) == 7 + 1_013
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for job_id in ids:
        assert str(ULID.from_str(job_id)) == job_id


def test_a_batch_is_consecutive_values_of_one_millisecond() -> None:
    ids = new_job_ids(500)
    parts = [_parts(i) for i in ids]
    ms, first = parts[0]
    assert parts == [(ms, first + i) for i in range(500)]


def test_same_millisecond_counts_up_from_the_last_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock that stepped back (or a burst within one ms) continues from the last id.
    future = 1 << 47
    monkeypatch.setattr(_ids, "_last_ms", future)
    monkeypatch.setattr(_ids, "_last_rand", 41)
    assert _parts(new_job_id()) == (future, 42)
    assert [_parts(i) for i in new_job_ids(3)] == [(future, 43), (future, 44), (future, 45)]
    assert _parts(new_job_id()) == (future, 46)


@pytest.mark.parametrize("batch", [False, True])
def test_rand_overflow_borrows_the_next_millisecond(monkeypatch: pytest.MonkeyPatch, batch: bool) -> None:
    future = 1 << 47
    monkeypatch.setattr(_ids, "_last_ms", future)
    monkeypatch.setattr(_ids, "_last_rand", _RAND_MAX - 2)
    ids = new_job_ids(5) if batch else [new_job_id() for _ in range(5)]
    ids.append(new_job_id())
    parts = [_parts(i) for i in ids]
    assert parts[:2] == [(future, _RAND_MAX - 1), (future, _RAND_MAX)]
    ms, rand = parts[2]
    assert ms == future + 1 and rand >> 79 == 0
    assert parts[2:] == [(future + 1, rand + i) for i in range(4)]
    assert ids == sorted(ids)


def test_a_batch_that_exactly_fills_rand_does_not_roll_over(monkeypatch: pytest.MonkeyPatch) -> None:
    future = 1 << 47
    monkeypatch.setattr(_ids, "_last_ms", future)
    monkeypatch.setattr(_ids, "_last_rand", _RAND_MAX - 3)
    assert [_parts(i) for i in new_job_ids(3)] == [(future, _RAND_MAX - 2 + i) for i in range(3)]
    assert _parts(new_job_id())[0] == future + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_never_repeats_the_parents_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # Random bits are read from the OS in a pool of draws; a child forked with
    # that pool (and the last id) copied must start afresh, or parent and child
    # would make the same ids in the same millisecond (a preforking web server).
    new_job_id()  # the pool now holds unused draws
    future = 1 << 47
    monkeypatch.setattr(_ids.time, "time_ns", lambda: future * 1_000_000)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, " ".join([new_job_id(), *new_job_ids(3)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_job_id(), *new_job_ids(3)]
    assert len(child) == 4 and all(_parts(i)[0] == future for i in child + parent)
    assert not set(child) & set(parent)


def test_fresh_draws_come_from_the_pool_in_order_and_refill_it(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def urandom(n: int) -> bytes:
        reads.append(n)
        return b"".join(i.to_bytes(10, "big") for i in range(len(reads) * 1000, len(reads) * 1000 + n // 10))

    monkeypatch.setattr(_ids.os, "urandom", urandom)
    monkeypatch.setattr(_ids, "_pool", b"")
    monkeypatch.setattr(_ids, "_pool_at", 0)
    draws = [_ids._fresh_rand() for _ in range(70)]
    assert reads == [_ids._POOL_BYTES, _ids._POOL_BYTES]  # 64 draws per read
    assert draws == [i >> 1 for i in [*range(1000, 1064), *range(2000, 2006)]]
