"""Command packing in C for the hot path.

redis-py's asyncio ``Connection.pack_command`` is pure Python (~10 µs for a
transition script's arguments); hiredis, already a dependency, packs the same
RESP bytes in ~1 µs. A worker draining thousands of jobs a second sends a few
commands per job, so this is measurable (see benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from redis.asyncio.connection import Connection

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    _hiredis_pack = None


class FastPackConnection(Connection):
    """A plain TCP connection whose commands are packed by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _hiredis_pack is None:
            return super().pack_command(*args)
        # redis-py passes some commands as one string ("CONFIG GET"); split it
        # the way its own packer does.
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [_hiredis_pack(args)]
        except TypeError:  # a type hiredis does not pack: let redis-py encode (or reject) it
            return super().pack_command(*args)

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(self.pack_command(*cmd)[0] for cmd in commands)]


def fast_connection_class() -> type[Connection] | None:
    """The connection class to use for ``redis://`` URLs, or None for redis-py's own."""
    return FastPackConnection if _hiredis_pack is not None else None
