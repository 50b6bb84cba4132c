"""Reading an offloaded call's result: ``OffloadHandle``, ``read_result``, ``resolve``.

The decorator that makes a function offloadable is ``offload.py``; the worker
half that runs it is ``_worker/offload.py``. This module needs only a
``Client``, so a web process that reads results stays light.

Result path, step by step:

1. ``fn.offload(client, ...)`` mints a token of 192 random bits, enqueues the
   job and writes a ``pending`` snapshot under ``venturi:{q}:offload:<token>``
   in the same script call (``lua/enqueue.lua``), so a read tells an unknown
   key from work in progress. The caller gets ``OffloadHandle.key``,
   ``"<queue>:<token>"``: a capability, returned to the caller only.
2. When the job settles (``complete``; ``dead``, the retry backstop and the
   reclaim backstop), the script that settles it rewrites the snapshot
   (``completed`` with the msgpack result, or ``failed`` with the raw error),
   sets its expiry (the retention) and publishes a redacted wake-up on
   ``venturi:{q}:offload:<token>:done`` (``lua/include/offload.lua``).
3. ``resolve`` subscribes (on a connection of its own, beside the client's
   pool), waits for the subscription to be confirmed, reads
   the snapshot, and only then waits for the wake-up: a job that settles at any
   moment is seen either by the read or by the subscription.
4. An operator's retry of a dead offload job (``lua/retry_dead.lua``) writes
   the ``pending`` snapshot again, without expiry, with the job's move back to
   pending: readers see the rerun coming and ``resolve`` waits for it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

import anyio
from pydantic import TypeAdapter, ValidationError

from .._model.backoff import to_ms
from .._model.codec import type_name, unpack_as
from .._model.errors import ConfigurationError, PayloadError, VenturiError
from .._model.sealing import Encryption, missing_key
from .._store.keys import QueueKeys, validate_name
from .._transport.errors import TRANSIENT, server_full
from .._transport.pool import side_redis

if TYPE_CHECKING:
    from .client import Client

T = TypeVar("T")

REDACTED = "terminal error"
"""What ``read_result_redacted`` (and the published wake-up) say instead of an error."""

TOKEN_BYTES = 24  # 192 random bits, 32 URL-safe characters (offload.py mints them)
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")
# Longest single pub/sub read. When it passes without a wake-up, resolve reads
# the snapshot once more: redis-py may reconnect and resubscribe a pub/sub
# connection without telling us, and a wake-up published while it was down is
# gone. The subscription is what makes resolve prompt; this re-read only
# bounds how late a lost wake-up can make it.
_WAIT_SLICE = 5.0

Status = Literal["completed", "failed", "pending"]


class OffloadNotFound(VenturiError, LookupError):
    """No snapshot exists under an offload key: never issued, or expired after its retention."""


@dataclass(frozen=True, slots=True)
class OffloadResult(Generic[T]):
    """Where an offloaded call stands.

    Attributes:
        status: ``"completed"``, ``"failed"`` or ``"pending"`` (queued, running,
            retrying, or ``resolve`` timed out).
        value: The function's return value, validated into its return type,
            when completed; else ``None``.
        error: Why it failed, when failed: the raw error from ``read_result``
            and ``resolve``, ``"terminal error"`` from ``read_result_redacted``.
        job_id: The job that ran (or will run) the call.
    """

    status: Status
    value: T | None = None
    error: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffloadHandle(Generic[T]):
    """What ``fn.offload(...)`` returns: where the result of one call will land.

    Attributes:
        key: ``"<queue>:<token>"``, the capability to read the result. Give it
            only to whoever may read the result; it is left out of ``repr``.
        job_id: The job's id (for ``queue.get`` and the journal).
        result_type: The type results are validated into.

    A key kept elsewhere (a session, a database row) becomes a typed handle
    again with ``fn.handle(key)``.
    """

    key: str = field(repr=False)
    job_id: str = ""
    result_type: Any = field(default=Any, repr=False, compare=False)


def _adapter(tp: Any) -> TypeAdapter[Any]:
    try:
        return _cached_adapter(tp)
    except TypeError:  # an unhashable annotation: build it every time
        return TypeAdapter(tp)


@functools.lru_cache(maxsize=256)
def _cached_adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _parse_key(client: Client, key: str) -> tuple[QueueKeys, str]:
    """The queue keys and token of a handle key; the key itself never goes in a message."""
    queue, sep, token = key.rpartition(":") if isinstance(key, str) else ("", "", "")
    if not sep or not _TOKEN_RE.fullmatch(token):
        raise ConfigurationError(
            "not an offload key: expected '<queue>:<token>' exactly as OffloadHandle.key gave it"
        )
    validate_name(queue)
    return QueueKeys.for_queue(queue, client.namespace), token


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _decode(
    raw: dict[bytes, bytes],
    result_type: Any,
    adapter: TypeAdapter[Any],
    *,
    redact: bool,
    encryption: Encryption | None,
) -> OffloadResult[Any]:
    """A snapshot as its reader sees it (``adapter``: ``result_type``'s). An encrypted value
    (the job's result, sealed by its worker) is opened with the reading client's
    ``encryption``; a typed value cannot be shown as ``vr.Encrypted``, so a missing key
    raises ``EncryptionKeyMissing``."""
    status = _text(raw.get(b"status"))
    job_id = _text(raw.get(b"job_id")) or None
    if status == "pending":
        return OffloadResult("pending", job_id=job_id)
    if status == "failed":
        return OffloadResult("failed", error=REDACTED if redact else _text(raw.get(b"error")), job_id=job_id)
    if status == "completed":
        blob = raw.get(b"value")
        if blob:
            if encryption is not None:
                blob = encryption.open(blob)
            elif (missing := missing_key(blob, None)) is not None:
                raise missing
            try:
                value = unpack_as(adapter, blob, "" if result_type is Any else type_name(result_type))
            except PayloadError as exc:
                # A result stored by an older model of the return type (docs/semantics.md,
                # "Changing a task's model while its jobs wait"): say whose, and the way out.
                raise PayloadError(
                    f"offload result of job {job_id} cannot be read: {exc}; an untyped read "
                    "(vr.read_result(client, handle.key)) returns the stored document"
                ) from exc
        else:  # the function returned None
            try:
                value = adapter.validate_python(None)
            except ValidationError as exc:
                raise PayloadError(f"offload result of job {job_id} is empty: {exc}") from exc
        return OffloadResult("completed", value=value, job_id=job_id)
    raise PayloadError(f"offload snapshot of job {job_id} has an unknown status {status!r}")


async def _read(client: Client, key: str, result_type: Any, *, redact: bool) -> OffloadResult[Any] | None:
    keys, token = _parse_key(client, key)
    raw = await client.redis.hgetall(keys.offload(token))
    if not raw:
        return None
    return _decode(raw, result_type, _adapter(result_type), redact=redact, encryption=client.encryption)


@overload
async def read_result(client: Client, handle: OffloadHandle[T], /) -> OffloadResult[T] | None: ...
@overload
async def read_result(client: Client, key: str, /, result_type: type[T]) -> OffloadResult[T] | None: ...
@overload
async def read_result(client: Client, key: str, /) -> OffloadResult[Any] | None: ...
async def read_result(
    client: Client, handle: OffloadHandle[Any] | str, /, result_type: Any = Any
) -> OffloadResult[Any] | None:
    """Read the authoritative snapshot once, without waiting; the raw error included.

    For server-side code that may see diagnostics. Returns ``None`` when no
    snapshot exists under the key (never issued, or expired).

    Raises:
        ConfigurationError: ``key`` is not an offload key.
        PayloadError: the stored value does not validate as ``result_type``.
    """
    if isinstance(handle, OffloadHandle):
        return await _read(client, handle.key, handle.result_type, redact=False)
    return await _read(client, handle, result_type, redact=False)


@overload
async def read_result_redacted(client: Client, handle: OffloadHandle[T], /) -> OffloadResult[T] | None: ...
@overload
async def read_result_redacted(
    client: Client, key: str, /, result_type: type[T]
) -> OffloadResult[T] | None: ...
@overload
async def read_result_redacted(client: Client, key: str, /) -> OffloadResult[Any] | None: ...
async def read_result_redacted(
    client: Client, handle: OffloadHandle[Any] | str, /, result_type: Any = Any
) -> OffloadResult[Any] | None:
    """Like ``read_result``, but a failure's error is always ``"terminal error"``.

    For a route that answers a browser holding the key: completed values and
    the pending state pass through; no diagnostic text ever does.
    """
    if isinstance(handle, OffloadHandle):
        return await _read(client, handle.key, handle.result_type, redact=True)
    return await _read(client, handle, result_type, redact=True)


async def resolve(
    client: Client,
    handle: OffloadHandle[T],
    *,
    # Not anyio.fail_after: a timeout is an answer here ("still pending"), not an error.
    timeout: float | timedelta | None,  # noqa: ASYNC109
) -> OffloadResult[T]:
    """Wait for an offloaded call to settle and return its authoritative result.

    Subscribes to the key's channel first, then reads the snapshot (returning
    at once if the call already settled), then waits for the wake-up and reads
    the snapshot again: no completion can fall between the read and the wait.

    Args:
        client: Any client of the Redis the job was enqueued on.
        handle: From ``fn.offload(...)`` or ``fn.handle(key)``.
        timeout: Seconds to wait; ``None`` waits as long as it takes. On
            timeout the result is ``pending``: nothing is cancelled.

    Raises:
        OffloadNotFound: no snapshot under the key (never issued, or expired).
    """
    return await _resolve(client, handle, timeout)


async def _nothing(stage: str) -> None:
    return None


async def _resolve(
    client: Client,
    handle: OffloadHandle[T],
    timeout: float | timedelta | None,  # noqa: ASYNC109
    hook: Callable[[str], Awaitable[None]] = _nothing,
) -> OffloadResult[T]:
    """``resolve``, with a hook called after each step so tests can inject races."""
    keys, token = _parse_key(client, handle.key)
    result_type = handle.result_type
    adapter = _adapter(result_type)
    snapshot, channel = keys.offload(token), keys.offload_channel(token)
    seconds = math.inf if timeout is None else to_ms(timeout, "timeout") / 1000
    deadline = time.monotonic() + seconds
    failures = 0
    last: OffloadResult[Any] = OffloadResult("pending")
    own = True
    while True:
        # The subscription on a connection of its own beside the client's pool
        # (pool.side_redis), where it can have one: a pooled one would stay
        # taken while it waits, and resolves as many as the pool's bound, each
        # waiting for another connection to read its snapshot, would stall.
        # Once Redis refused it at its maxclients, on the pool's after all.
        side = side_redis(client.redis) if own else None
        pubsub = (side if side is not None else client.redis).pubsub()
        try:
            await pubsub.subscribe(channel)
            # Wait for the server's confirmation: only then is the subscription
            # in place, so a settle published after it cannot be missed.
            while True:
                left = max(0.0, min(_WAIT_SLICE, deadline - time.monotonic()))
                msg = await pubsub.get_message(timeout=left)
                if msg is not None and msg["type"] in ("subscribe", b"subscribe"):
                    break
                if time.monotonic() >= deadline:
                    return last
            await hook("subscribed")
            raw = await client.redis.hgetall(snapshot)
            if not raw:
                raise OffloadNotFound(
                    f"no offload snapshot for job key in queue {keys.name!r}: the key was never "
                    "issued, or its result expired after the retention; offload the call again"
                )
            last = _decode(raw, result_type, adapter, redact=False, encryption=client.encryption)
            if last.status != "pending":
                return last
            await hook("read")
            failures = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return last
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(_WAIT_SLICE, left))
                if msg is None and time.monotonic() >= deadline:
                    return last
                # A wake-up (redacted: the snapshot is the authority), or a
                # quiet slice: read back either way.
                raw = await client.redis.hgetall(snapshot)
                if raw:
                    last = _decode(raw, result_type, adapter, redact=False, encryption=client.encryption)
                    if last.status != "pending":
                        return last
        except TRANSIENT as exc:
            # The subscription may have missed a wake-up while it was down:
            # subscribe again and read back again, as at the start.
            own = own and not (side is not None and server_full(exc))
            failures += 1
            if time.monotonic() >= deadline:
                return last
            await anyio.sleep(min(0.05 * 2**failures, 2.0, max(0.0, deadline - time.monotonic())))
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                if side is not None:
                    with contextlib.suppress(Exception):
                        await side.aclose()
