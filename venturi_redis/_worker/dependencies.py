"""``ctx.dependency_results()``: the results of the jobs a workflow job waited on.

Each dependency's result was copied, as it completed, to the waiting job's
``depresults:<id>`` hash (``lua/include/graph.lua``): one field per
dependency, its value the dependency's KIND, a newline, then its msgpack
result (nothing for ``None``). So retention may have purged the dependencies
long ago; this reads one hash of the job's own.

It reads it by pages (``HSCAN``), each aiming at ``PAGE_BYTES``: a fan-in of
many children with sizeable results is a hash of hundreds of MB, which one
``HGETALL`` made Redis copy while it served nobody else (2,000 results of
50 KB: 267 ms). A hash of a few small results is still one call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._model.codec import text, type_name, unpack, unpack_as
from .._model.errors import EncryptionKeyMissing, PayloadError
from .._model.sealing import Encryption, missing_key

if TYPE_CHECKING:
    from .._producer.client import Queue

# Bytes of results one read aims at: the page's COUNT follows the sizes seen so far.
PAGE_BYTES = 8 << 20


class UnreadableResult(PayloadError):
    """A dependency's stored result does not decode, or does not validate as the result type
    its task declares now (its model changed since the dependency completed).

    No retry changes a stored copy: raised out of the handler of ``job_id`` (the waiting
    job), it ends that job's run dead at once, reason ``invalid_payload``
    (``execute.error_ending``), where an ordinary error would be retried for hours.
    """

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


def decode_result(
    kind: str, blob: bytes, registry: dict[str, type[Any]], encryption: Encryption | None = None
) -> Any:
    """One dependency's result: typed when its task declares a result type (an offload's
    return annotation), else the decoded msgpack document; ``None`` when it returned none.
    An encrypted result is opened with ``encryption`` (a missing key raises
    ``EncryptionKeyMissing``: the handler's run fails, and is retried)."""
    if not blob:
        return None
    if encryption is not None:
        blob = encryption.open(blob)
    elif (missing := missing_key(blob, None)) is not None:
        raise missing
    handler = registry.get(kind)
    entry = getattr(handler, "__venturi_offload__", None)
    if entry is not None:
        return unpack_as(entry._result_adapter, blob, type_name(entry.result_type))
    return unpack(blob)


async def read_dependency_results(
    queue: Queue, job_id: str, registry: dict[str, type[Any]]
) -> dict[str, Any]:
    raw = await _read_pages(queue.client.redis, queue.keys.depresults(job_id))
    out: dict[str, Any] = {}
    for field, value in sorted(raw.items()):
        kind, _, blob = value.partition(b"\n")
        dep = text(field)
        try:
            out[dep] = decode_result(text(kind), blob, registry, queue.client.encryption)
        except EncryptionKeyMissing:
            raise  # another worker, or this one given the key, can read it: a failed run
        except PayloadError as exc:
            raise UnreadableResult(
                f"the result of dependency {dep} ({text(kind)}) cannot be read: {exc}", job_id
            ) from exc
    return out


async def _read_pages(redis: Any, key: str) -> dict[bytes, bytes]:
    """The whole hash ``key``, read by ``HSCAN`` pages of about ``PAGE_BYTES`` each.

    The first page asks for 10 fields (at most 10 results at the cap); each
    next one for as many as the sizes seen so far fit in ``PAGE_BYTES``
    (1 to 1,000). A field returned twice (the hash rehashed between pages)
    is the same field: the dict keeps one.
    """
    out: dict[bytes, bytes] = {}
    cursor, count = 0, 10
    while True:
        cursor, page = await redis.hscan(key, cursor, count=count)
        out.update(page)
        size = sum(len(value) for value in page.values())
        if size:
            count = max(1, min(1_000, len(page) * PAGE_BYTES // size))
        if not cursor:
            return out
