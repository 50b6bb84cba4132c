"""Encryption at rest: ``vr.Encryption``, and the envelope an encrypted value is stored in.

A client given ``encryption=vr.Encryption(keys=[...])`` seals every
payload-like value it writes (payloads, carries, results, outputs,
attachments, progress, resume input; offload snapshots hold the sealed
result) and opens them where it reads them; the store and the Lua scripts
only ever see opaque bytes. docs/security.md is the user's guide.

The envelope (version 1), 34 bytes over the plain value::

    0xC1 0x01 | key id (4 bytes) | nonce (12 bytes) | AES-256-GCM ciphertext + tag (16 bytes)

``0xC1`` is the one byte msgpack never uses, so an envelope never parses as a
plain value and a plain value (written before encryption was turned on) never
looks like an envelope: both can be told apart without a key. The key id is
the first 4 bytes of the key's SHA-256, so a reader knows which key a value
needs, and says which one it lacks. The 6-byte header is the cipher's
associated data: a header edited to point at another key fails to decrypt.

``cryptography`` is imported only when an ``Encryption`` is made (the extra
``venturi-redis[crypto]``): ``import venturi_redis`` never loads it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError, EncryptionKeyMissing, PayloadError

MAGIC = b"\xc1"  # msgpack's "never used" byte
HEADER_V1 = b"\xc1\x01"
_KEY_ID = 4
_NONCE = 12
_TAG = 16
_HEAD = len(HEADER_V1) + _KEY_ID
_BODY = _HEAD + _NONCE
OVERHEAD = _BODY + _TAG
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class Encrypted:
    """A stored value this client cannot read: it is encrypted under key ``key_id``.

    What ``queue.get()``, ``venturi job show`` and the dashboard show in place of
    a payload, carry, result, output, attachment or progress value when the
    client holds no key for it (no ``encryption=`` at all, or not that key).
    Its text is ``<encrypted: key id ab12cd34>``.
    """

    key_id: str

    def __str__(self) -> str:
        return f"<encrypted: key id {self.key_id}>"

    __repr__ = __str__


def key_id_of(key: bytes) -> str:
    """The id a key's values carry: the first 4 bytes of its SHA-256, as 8 hex digits."""
    return hashlib.sha256(key).digest()[:_KEY_ID].hex()


def sealed_key_id(raw: bytes) -> str | None:
    """The key id of an envelope (``raw`` as stored), or None for anything else."""
    if raw[:2] == HEADER_V1 and len(raw) >= OVERHEAD:
        return raw[2:_HEAD].hex()
    return None


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ConfigurationError(
            "encryption at rest needs the 'cryptography' package: pip install 'venturi-redis[crypto]'"
        ) from exc
    return AESGCM


class Encryption:
    """Encryption at rest of every payload-like value a client writes (docs/security.md).

    ``Client.from_url(url, encryption=vr.Encryption(keys=[key, ...]))``. Each
    key is 32 random bytes (AES-256-GCM; ``vr.Encryption.new_key()`` makes
    one). The first key encrypts; every key decrypts: to rotate, put a new key
    first and keep the old ones until no stored value needs them. Values
    written before encryption was turned on stay readable.

    Args:
        keys: The keys, newest first: ``bytes`` of exactly 32 bytes each,
            at least one, no two alike.

    Raises:
        ConfigurationError: A key that is not 32 bytes, an empty or
            duplicated list, or ``cryptography`` not installed
            (``pip install 'venturi-redis[crypto]'``).
    """

    __slots__ = ("_by_id", "_encrypt", "_head", "_openers", "key_ids")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if isinstance(keys, (bytes, bytearray, str)) or not isinstance(keys, Sequence):
            raise ConfigurationError(
                f"Encryption(keys=...) takes a list of 32-byte keys, newest first, got {type(keys).__name__}"
            )
        if not keys:
            raise ConfigurationError("Encryption(keys=...) needs at least one key (the first one encrypts)")
        checked: list[bytes] = []
        for i, key in enumerate(keys):
            if not isinstance(key, (bytes, bytearray)):
                hint = " (decode it first, e.g. base64.b64decode(text))" if isinstance(key, str) else ""
                raise ConfigurationError(f"encryption key {i} must be bytes, got {type(key).__name__}{hint}")
            if len(key) != KEY_BYTES:
                raise ConfigurationError(
                    f"encryption key {i} must be {KEY_BYTES} bytes (AES-256), got {len(key)}: "
                    "make one with vr.Encryption.new_key()"
                )
            key = bytes(key)
            if key in checked:
                raise ConfigurationError(f"encryption key {i} repeats key {checked.index(key)}")
            checked.append(key)
        ids = [hashlib.sha256(k).digest()[:_KEY_ID] for k in checked]
        if len(set(ids)) != len(ids):  # two distinct keys, one 32-bit id: about 1 in 4e9
            raise ConfigurationError("two encryption keys share a key id; replace one of them")
        aesgcm = _aesgcm()
        self._by_id: dict[bytes, Any] = {kid: aesgcm(k) for kid, k in zip(ids, checked, strict=True)}
        self._head = HEADER_V1 + ids[0]
        self._encrypt: Callable[[bytes, bytes, bytes], bytes] = self._by_id[ids[0]].encrypt
        # A version-1 header (6 bytes, also the associated data) to its key's decrypt:
        # one slice and one lookup tell an envelope under a held key from anything else.
        self._openers: dict[bytes, Callable[[bytes, bytes, bytes], bytes]] = {
            HEADER_V1 + kid: aead.decrypt for kid, aead in self._by_id.items()
        }
        #: The keys' ids, as values carry them (8 hex digits), the encrypting key's first.
        self.key_ids: tuple[str, ...] = tuple(kid.hex() for kid in ids)

    @staticmethod
    def new_key() -> bytes:
        """A new random 32-byte key (``os.urandom``); store it as a secret, e.g. base64."""
        return os.urandom(KEY_BYTES)

    def __repr__(self) -> str:
        return f"Encryption(key ids {', '.join(self.key_ids)})"

    def seal(self, plain: bytes) -> bytes:
        """``plain`` encrypted under the first key, in its envelope."""
        return self._sealed(os.urandom(_NONCE), plain)  # a fresh random nonce (docs/security.md says why)

    def _sealed(self, nonce: bytes, plain: bytes) -> bytes:
        """The envelope of ``plain`` under the first key and ``nonce`` (``seal`` and ``Sealer``'s)."""
        head = self._head
        return head + nonce + self._encrypt(nonce, plain, head)

    def sealer(self, n: int) -> Sealer:
        """A ``seal`` for up to ``n`` values of one call, their nonces drawn from the kernel now.

        One ``os.urandom(12 * n)`` here, cut in 12-byte slices, one per value
        sealed: the same kernel random numbers as one draw per ``seal``, in one
        system call. For the values of one synchronous stretch of work (a bulk
        enqueue's preparation): make it there and drop it, never keep it for
        a later call (docs/security.md, "What is encrypted").
        """
        return Sealer(self._sealed, os.urandom(_NONCE * n))

    def seal_many(self, plains: Sequence[bytes]) -> list[bytes]:
        """Each of ``plains`` sealed as ``seal`` seals it, the call's nonces drawn at once (``sealer``)."""
        seal = self.sealer(len(plains)).seal
        return [seal(plain) for plain in plains]

    def holds(self, raw: bytes) -> bool:
        """Whether ``raw`` is an envelope under one of these keys."""
        return raw[:2] == HEADER_V1 and raw[2:_HEAD] in self._by_id

    def open(self, raw: bytes) -> bytes:
        """The plain value of ``raw``; a value that is no envelope is returned as it is.

        Raises:
            EncryptionKeyMissing: Encrypted under a key this object does not hold.
            PayloadError: An envelope that does not decrypt (damaged, or edited).
        """
        head = raw[:_HEAD]
        decrypt = self._openers.get(head)
        if decrypt is None:
            return self._open_other(raw)
        try:
            return decrypt(raw[_HEAD:_BODY], raw[_BODY:], head)
        except Exception as exc:  # noqa: BLE001 - cryptography's InvalidTag (imported lazily): damaged or edited
            if len(raw) < OVERHEAD:
                raise PayloadError(f"stored value is a truncated envelope ({len(raw)} bytes)") from None
            raise PayloadError(
                f"stored value under key id {head[2:].hex()} does not decrypt (damaged or edited): "
                f"{type(exc).__name__}"
            ) from None

    def _open_other(self, raw: bytes) -> bytes:
        """``open`` of a value that is no version-1 envelope under a key held here."""
        if raw[:1] != MAGIC:
            return raw  # written before encryption was turned on (or never sealed)
        kid = sealed_key_id(raw)
        if kid is None:
            raise PayloadError(f"stored value is an envelope of an unknown version ({len(raw)} bytes)")
        raise EncryptionKeyMissing(kid, self.key_ids)


class Sealer:
    """``Encryption.seal`` for the values of one call, its nonces drawn at once (``Encryption.sealer``).

    Each ``seal`` takes the next 12 bytes of the draw; asked for more values
    than it was made for, it raises rather than reuse or draw again.
    """

    __slots__ = ("_at", "_nonces", "_sealed")

    def __init__(self, sealed: Callable[[bytes, bytes], bytes], nonces: bytes) -> None:
        self._sealed, self._nonces, self._at = sealed, nonces, 0

    def seal(self, plain: bytes) -> bytes:
        """``plain`` encrypted under the first key, in its envelope, under the next nonce of the draw."""
        at = self._at
        nonce = self._nonces[at : at + _NONCE]
        if len(nonce) != _NONCE:
            raise RuntimeError(f"a Sealer for {len(self._nonces) // _NONCE} values asked to seal one more")
        self._at = at + _NONCE
        return self._sealed(nonce, plain)


def missing_key(raw: bytes, encryption: Encryption | None) -> EncryptionKeyMissing | None:
    """Why ``raw`` cannot be read here, when the reason is a key this side lacks (else None)."""
    kid = sealed_key_id(raw)
    if kid is None or (encryption is not None and encryption.holds(raw)):
        return None
    return EncryptionKeyMissing(kid, () if encryption is None else encryption.key_ids)
