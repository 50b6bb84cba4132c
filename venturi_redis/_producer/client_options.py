"""``vr.ClientOptions``: the keyword options of ``Client.from_url``, ``Queue.from_url`` and ``SyncClient``.

Declared once, as a TypedDict those take as ``**options``, so a checker (and
an editor's completion) knows each option and its type, and a misspelt one is
an error before it is a ``TypeError`` at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from .._model.sealing import Encryption
from .._transport.durable import Durability


class ClientOptions(TypedDict, total=False):
    """The options of ``Client.from_url`` (and ``Queue.from_url``, ``vr.SyncClient``), all optional.

    Attributes:
        namespace: The first part of every key (``venturi`` by default).
        max_payload_bytes: Largest encoded payload, carry, resume value or attachment (1 MiB).
        max_result_bytes: Largest encoded result or suspend output a run may store (8 MiB).
        max_batch_jobs: Most tasks one ``enqueue_many`` call takes (10,000).
        max_batch_bytes: Most encoded payload bytes one ``enqueue_many`` or ``enqueue_flow`` sends (32 MiB).
        clock: Milliseconds-since-epoch source passed to every script (None: Redis ``TIME``).
        durable: Durable mode: a ``vr.Durability``, or a replica count (docs/cluster.md).
        encryption: Encryption at rest, ``vr.Encryption(keys=[...])`` (docs/security.md).
        cluster: Treat a ``redis://`` / ``rediss://`` URL as a Redis Cluster seed.
        max_connections: The most connections the client's pool opens (20; the URL's
            ``?max_connections=N`` wins).

    ``vr.Client``'s docstring says more of each.
    """

    namespace: str
    max_payload_bytes: int
    max_result_bytes: int
    max_batch_jobs: int
    max_batch_bytes: int
    clock: Callable[[], int] | None
    durable: Durability | int | None
    encryption: Encryption | None
    cluster: bool
    max_connections: int | None
