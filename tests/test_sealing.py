"""The envelope and its nonces (venturi_redis/_model/sealing.py), without Redis: values
written by earlier releases still open, no nonce repeats (many seals, threads, a forked
child), and every way an envelope can fail to open says why."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import venturi_redis as vr
from venturi_redis._model.sealing import _BODY, _HEAD, HEADER_V1, OVERHEAD, key_id_of, sealed_key_id

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))

# Sealed by main at 4f64dc7, before open() was reworked for speed:
# Encryption(keys=[KEY_A]).seal(b"\x81\xa1a\x01"). Values already stored must keep opening.
WRITTEN_BEFORE = bytes.fromhex("c101630dcd2997868d791ad635f53d086df6b86ce373ce452b28837fd1d7e9d27f357abfacb2")


def _nonce(envelope: bytes) -> bytes:
    return envelope[_HEAD:_BODY]


def test_a_value_sealed_by_the_earlier_release_opens() -> None:
    enc = vr.Encryption(keys=[KEY_B, KEY_A])  # under its old key, after a rotation
    assert enc.open(WRITTEN_BEFORE) == b"\x81\xa1a\x01"
    assert vr.Encryption(keys=[KEY_A]).open(WRITTEN_BEFORE) == b"\x81\xa1a\x01"


def test_the_envelope_layout_is_unchanged() -> None:
    enc = vr.Encryption(keys=[KEY_A])
    plain = b"\x92\x01\x02" * 100
    sealed = enc.seal(plain)
    assert len(sealed) == len(plain) + OVERHEAD == len(plain) + 34
    assert sealed[:_HEAD] == HEADER_V1 + bytes.fromhex(key_id_of(KEY_A))
    # Opened with the cipher alone: header as associated data, nonce, ciphertext and tag.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert AESGCM(KEY_A).decrypt(sealed[_HEAD:_BODY], sealed[_BODY:], sealed[:_HEAD]) == plain


def test_no_nonce_repeats_over_many_seals_and_keys() -> None:
    a, b = vr.Encryption(keys=[KEY_A]), vr.Encryption(keys=[KEY_B, KEY_A])
    nonces = [_nonce(enc.seal(b"x")) for _ in range(50_000) for enc in (a, b)]
    assert len(set(nonces)) == len(nonces)


def test_no_nonce_repeats_across_threads() -> None:
    enc = vr.Encryption(keys=[KEY_A])
    out: list[list[bytes]] = [[] for _ in range(4)]

    def seal_many(i: int) -> None:
        out[i].extend(_nonce(enc.seal(b"x")) for _ in range(20_000))

    threads = [threading.Thread(target=seal_many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [n for part in out for n in part]
    assert len(every) == 80_000 and len(set(every)) == 80_000


def _counted_urandom(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every ``os.urandom`` draw from now on, as it returned it (the real kernel bytes)."""
    draws: list[bytes] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        draws.append(real(n))
        return draws[-1]

    monkeypatch.setattr(os, "urandom", urandom)
    return draws


def test_seal_many_draws_its_nonces_at_its_call_and_keeps_none(monkeypatch: pytest.MonkeyPatch) -> None:
    enc = vr.Encryption(keys=[KEY_B, KEY_A])  # seals under KEY_B, the first
    plains = [b"\x92\x01" + bytes([i]) * i for i in range(200)]
    draws = _counted_urandom(monkeypatch)
    first = enc.seal_many(plains)
    second = enc.seal_many(plains)
    # One draw of 12 bytes a value per call, each at its call, cut in order: the
    # second call draws its own, nothing of the first's is left for it.
    assert [len(d) for d in draws] == [12 * 200, 12 * 200]
    assert [_nonce(s) for s in first] == [draws[0][i : i + 12] for i in range(0, 2400, 12)]
    assert [_nonce(s) for s in second] == [draws[1][i : i + 12] for i in range(0, 2400, 12)]
    nonces = [_nonce(s) for s in first + second]
    assert len(set(nonces)) == 400
    assert {sealed_key_id(s) for s in first + second} == {key_id_of(KEY_B)}
    assert [enc.open(s) for s in first] == plains == [enc.open(s) for s in second]
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    for plain, sealed in zip(plains, first, strict=True):
        assert len(sealed) == len(plain) + OVERHEAD
        assert AESGCM(KEY_B).decrypt(sealed[_HEAD:_BODY], sealed[_BODY:], sealed[:_HEAD]) == plain
    assert enc.seal_many([]) == []


def test_a_sealer_seals_no_more_values_than_it_drew_for() -> None:
    enc = vr.Encryption(keys=[KEY_A])
    sealer = enc.sealer(2)
    sealed = [sealer.seal(b"a"), sealer.seal(b"b")]
    assert [enc.open(s) for s in sealed] == [b"a", b"b"] and _nonce(sealed[0]) != _nonce(sealed[1])
    with pytest.raises(RuntimeError, match="for 2 values asked to seal one more"):
        sealer.seal(b"c")  # never a nonce reused, nor one drawn behind the caller's back
    with pytest.raises(RuntimeError):
        enc.sealer(0).seal(b"x")


# A nonce drawn from state in the process's memory (a counter, a buffer of random
# bytes kept between calls) would repeat in a forked child unless re-drawn there:
# os.urandom at each seal, or at each bulk call for that call's values, never does.
_FORK = """
import os, sys
import venturi_redis as vr
enc = vr.Encryption(keys=[bytes(range(32))])
nonce = lambda: enc.seal(b"x")[6:18]
bulk = lambda: [s[6:18] for s in enc.seal_many([b"x"] * 10)]
before = [nonce() for _ in range(50)] + [n for _ in range(5) for n in bulk()]
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: seals as the parent does next, sends its nonces back
    os.close(read)
    os.write(write, b"".join(nonce() for _ in range(500)) + b"".join(n for _ in range(50) for n in bulk()))
    os._exit(0)
os.close(write)
blob = b""
while chunk := os.read(read, 65536):
    blob += chunk
os.waitpid(pid, 0)
after = [nonce() for _ in range(500)] + [n for _ in range(50) for n in bulk()]
sys.stdout.write(" ".join(n.hex() for n in before + after) + "\\n" + blob.hex())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_never_continues_its_parents_nonces() -> None:
    # In a process of its own: forking pytest's (threads, open servers) is what not to do.
    out = subprocess.run([sys.executable, "-c", _FORK], check=True, capture_output=True, text=True).stdout
    parent_line, child_hex = out.split("\n")
    parent = [bytes.fromhex(h) for h in parent_line.split()]
    blob = bytes.fromhex(child_hex)
    child = [blob[i : i + 12] for i in range(0, len(blob), 12)]
    assert len(parent) == 1100 and len(child) == 1000
    assert len(set(parent + child)) == 2100


def test_every_envelope_that_does_not_open_says_why() -> None:
    enc = vr.Encryption(keys=[KEY_A])
    sealed = enc.seal(b"\x81\xa1a\x01")
    assert enc.open(b"\x81\xa1a\x01") == b"\x81\xa1a\x01"  # plain: written before encryption
    assert enc.open(b"") == b""
    with pytest.raises(vr.PayloadError, match="truncated envelope"):
        enc.open(sealed[: OVERHEAD - 1])
    with pytest.raises(vr.PayloadError, match="truncated envelope"):
        enc.open(sealed[:_HEAD])
    with pytest.raises(vr.PayloadError, match=f"key id {key_id_of(KEY_A)} does not decrypt"):
        enc.open(sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(vr.PayloadError, match="does not decrypt"):
        enc.open(sealed[:_HEAD] + bytes([sealed[_HEAD] ^ 1]) + sealed[_HEAD + 1 :])  # nonce edited
    with pytest.raises(vr.PayloadError, match="unknown version"):
        enc.open(b"\xc1\x02" + sealed[2:])
    with pytest.raises(vr.PayloadError, match="unknown version"):
        enc.open(b"\xc1")
    with pytest.raises(vr.EncryptionKeyMissing, match=key_id_of(KEY_B)):
        enc.open(vr.Encryption(keys=[KEY_B]).seal(b"x"))
    assert enc.holds(sealed) and not enc.holds(b"\x81") and not vr.Encryption(keys=[KEY_B]).holds(sealed)
