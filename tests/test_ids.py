"""Job ids: ULIDs from our base32-based encoder, identical to python-ulid's."""

from __future__ import annotations

import os

import pytest
from ulid import ULID

from venturi_redis._ids import _encode, new_job_id, ulid_ms


def _reference(ms: int, rand: int) -> str:
    return str(ULID.from_bytes(ms.to_bytes(6, "big") + rand.to_bytes(10, "big")))


@pytest.mark.parametrize(
    ("ms", "rand"),
    [(0, 0), (0, 1), (1, 0), ((1 << 48) - 1, (1 << 80) - 1), (1_764_000_000_000, 1 << 79)],
)
def test_encoding_matches_python_ulid_at_the_edges(ms: int, rand: int) -> None:
    assert _encode(ms, rand) == _reference(ms, rand)


def test_encoding_matches_python_ulid_on_random_values() -> None:
    for _ in range(20_000):
        ms = int.from_bytes(os.urandom(6), "big")
        rand = int.from_bytes(os.urandom(10), "big")
        assert _encode(ms, rand) == _reference(ms, rand)


def test_new_ids_increase_and_parse() -> None:
    ids = [new_job_id() for _ in range(5_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 26 for i in ids)
    assert ULID.from_str(ids[-1]).milliseconds == ulid_ms(ids[-1])
