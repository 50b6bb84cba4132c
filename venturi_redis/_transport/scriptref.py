"""What the transport's own runners (the enqueue lane, the blocking connection) need of a script."""

from __future__ import annotations

from typing import Protocol

# A script argument as redis-py packs it.
ScriptArg = str | bytes | int | float


class ScriptRef(Protocol):
    """A loaded script: its SHA1 (for ``EVALSHA``) and its source (for ``EVAL`` after ``NOSCRIPT``)."""

    @property
    def sha(self) -> str: ...

    @property
    def source(self) -> str: ...
