"""What the Queue's helpers need of a client and a queue, as Protocols.

``coalesce``, ``dedup``, ``ops`` and ``batch`` work for ``Queue`` (in
``client.py``), which imports them; typing their arguments with these
Protocols instead of ``Client`` and ``Queue`` keeps the imports one way
(``client.py`` -> helpers -> this module), with no cycle hidden behind
``TYPE_CHECKING``. ``Client`` and ``Queue`` satisfy them structurally (mypy
checks it wherever a ``Queue`` is passed).

The two small reads the helpers share (the scripts' clock, a reply as text)
live here too, not in ``reads.py``, which a worker never imports (issue 42:
its start-up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .._model.sealing import Encryption
from .._store.keys import QueueKeys
from .._store.sender import Sender
from .._store.store import QueueStore
from .registry import Recorded


def _text(value: Any) -> str:
    if value is None or value is False:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def server_now_ms(client: ClientLike) -> int:
    """The clock the scripts use: the client's own, else Redis TIME."""
    if client.clock is not None:
        return int(client.clock())
    sec, usec = await client.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


class ClientLike(Protocol):
    """The parts of a ``Client`` the helpers use: the connection, its sender, the clock."""

    @property
    def redis(self) -> Any: ...

    @property
    def sender(self) -> Sender: ...

    @property
    def namespace(self) -> str: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def max_result_bytes(self) -> int: ...

    @property
    def max_batch_jobs(self) -> int: ...

    @property
    def max_batch_bytes(self) -> int: ...

    @property
    def clock(self) -> Callable[[], int] | None: ...

    @property
    def encryption(self) -> Encryption | None: ...  # encryption at rest (_model/sealing.py)

    @property
    def url(self) -> str: ...

    @property
    def _recorded(self) -> Recorded: ...  # what it recorded in the registry of queues (registry.py)

    @property
    def _tails(self) -> dict[str, Any]: ...  # each queue's event reader (tail.py), by stream key

    def _now_arg(self) -> str: ...


class QueueLike(Protocol):
    """The parts of a ``Queue`` the helpers use: its client, its keys, its store, its name."""

    @property
    def client(self) -> ClientLike: ...

    @property
    def keys(self) -> QueueKeys: ...

    @property
    def store(self) -> QueueStore: ...

    @property
    def name(self) -> str: ...
