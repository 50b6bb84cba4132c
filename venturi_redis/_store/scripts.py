"""Loads the Lua scripts in ``lua/`` and runs them by EVALSHA.

Each file in ``lua/`` is one atomic transition. A line ``-- @include NAME``
splices ``lua/include/NAME`` in its place; an include is expanded once per
script however often it is named (first mention wins, so order is the order
of first mention), and a cycle is an error. The includes are small and each
holds one concern (the clock, the keys, the journal, the lease...): Redis
runs a script's whole body on every call, so a script includes only what it
uses, and an include that grew helpers few scripts need should be split.
The expanded source is what Redis sees and what the SHA is computed from.

The calls themselves (each script's KEYS, ARGV and reply) are built and read
in ``calls.py``; this module only runs them.

Scripts run by EVALSHA; a ``NOSCRIPT`` reply (a restarted server, a
``SCRIPT FLUSH``, a failover to a replica that never saw the script) runs the
source by EVAL, which also caches it again, so callers never notice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from .calls import ScriptArg as ScriptArg
from .calls import script_error

_INCLUDE_RE = re.compile(r"^--\s*@include\s+(\S+)\s*$")


def _lua_dir() -> Path:
    """The ``lua`` directory: inside the installed wheel, or at the repo root."""
    packaged = resources.files("venturi_redis") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "lua"


def expand(source: str, read_include: Callable[[str], str], *, name: str = "<script>") -> str:
    """Splice ``-- @include`` lines, each include once, rejecting cycles."""
    seen: set[str] = set()
    out: list[str] = []

    def walk(text: str, stack: tuple[str, ...]) -> None:
        for line in text.splitlines():
            m = _INCLUDE_RE.match(line.strip())
            if not m:
                out.append(line)
                continue
            inc = m.group(1)
            if inc in stack:
                chain = " -> ".join((*stack, inc))
                raise ValueError(f"include cycle in {name}: {chain}")
            if inc in seen:
                continue
            seen.add(inc)
            out.append(f"-- begin include {inc}")
            walk(read_include(inc), (*stack, inc))
            out.append(f"-- end include {inc}")

    walk(source, (name,))
    return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class Script:
    """One expanded script and its SHA1."""

    name: str
    source: str
    sha: str

    @classmethod
    def build(cls, name: str, source: str) -> Script:
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


class ScriptSet:
    """Every script of ``lua/``, by name (the file name without ``.lua``)."""

    def __init__(self, directory: Path | None = None) -> None:
        root = directory or _lua_dir()
        include_dir = root / "include"

        def read_include(inc: str) -> str:
            path = include_dir / inc
            if not path.is_file():
                raise FileNotFoundError(f"Lua include {inc!r} not found in {include_dir}")
            return path.read_text()

        self._scripts: dict[str, Script] = {}
        for path in sorted(root.glob("*.lua")):
            name = path.stem
            self._scripts[name] = Script.build(name, expand(path.read_text(), read_include, name=path.name))
        if not self._scripts:
            raise FileNotFoundError(f"no Lua scripts found in {root}")

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def names(self) -> list[str]:
        return sorted(self._scripts)

    async def call(self, redis: Any, name: str, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """EVALSHA the script; if the server has lost it, EVAL the source (which caches it)."""
        script = self._scripts[name]
        try:
            try:
                return await redis.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # EVAL, not SCRIPT LOAD then EVALSHA: a SCRIPT FLUSH (or a restart)
                # landing between those two would fail the call a second time.
                # NOSCRIPT means the script did not run, so running it now is safe.
                return await redis.eval(script.source, len(keys), *keys, *args)
        except ResponseError as exc:
            mapped = script_error(exc)
            if mapped is exc:
                raise
            raise mapped from None

    def command(self, name: str, keys: Sequence[str], args: Sequence[ScriptArg]) -> tuple[ScriptArg, ...]:
        """The EVALSHA command of a call, for a caller that packs its own commands.

        A NOSCRIPT reply is then the caller's to handle (the script did not run).
        """
        return ("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)

    def queue_call(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[ScriptArg]) -> None:
        """Add an EVALSHA to a pipeline (NOSCRIPT is the caller's to handle)."""
        pipe.execute_command(*self.command(name, keys, args))

    async def load(self, redis: Any, name: str) -> None:
        """SCRIPT LOAD one script: after a NOSCRIPT inside a caller's own MULTI."""
        await redis.script_load(self._scripts[name].source)

    async def run_pipeline(
        self,
        redis: Any,
        calls: Sequence[tuple[str, Sequence[str], Sequence[ScriptArg]]],
        *,
        transaction: bool = False,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Run several scripts in one round trip; NOSCRIPT replies are redone singly.

        A script that hit NOSCRIPT did not run at all, so running it again is safe.
        Other errors are raised after every call has been accounted for, or, with
        ``return_exceptions=True``, returned in place of that call's reply.
        """
        if getattr(redis, "durability", None) is not None:
            # Durable mode (_durable.DurableRedis): each script is followed by
            # WAIT on its own connection, so the calls go one by one.
            out: list[Any] = []
            for name, keys, args in calls:
                try:
                    out.append(await self.call(redis, name, keys, args))
                except Exception as exc:
                    if not return_exceptions:
                        raise
                    out.append(exc)
            return out
        pipe = redis.pipeline(transaction=transaction)
        for name, keys, args in calls:
            self.queue_call(pipe, name, keys, args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, res in enumerate(results):
            if isinstance(res, NoScriptError):
                name, keys, args = calls[i]
                try:
                    results[i] = await self.call(redis, name, keys, args)
                except Exception as exc:
                    if not return_exceptions:
                        raise
                    results[i] = exc
        results = [script_error(res) if isinstance(res, ResponseError) else res for res in results]
        if not return_exceptions:
            for res in results:
                if isinstance(res, Exception):
                    raise res
        return results

    async def run_transaction(
        self, redis: Any, calls: Sequence[tuple[str, Sequence[str], Sequence[ScriptArg]]]
    ) -> list[Any]:
        """Run several scripts of one slot as one MULTI/EXEC: Redis runs all or none.

        Returns each call's reply, or the error it raised inside EXEC (Redis
        does not roll back the calls around it). An error raised here (an
        EXECABORT, an OOM refusal while queuing, a dropped connection) means
        none ran, or, for a reply lost in flight, all or none.

        By EVAL, not EVALSHA: a NOSCRIPT is only reported inside EXEC, after
        the calls before it ran, so redoing it singly would split the batch.
        Durable mode (a WAIT after each script, on its own connection) cannot
        wrap a transaction: there the calls go one by one and stop at the
        first error, which takes its place in the list; the calls after it
        were not sent, and the list is that much shorter.
        """
        if getattr(redis, "durability", None) is not None:
            out: list[Any] = []
            for name, keys, args in calls:
                try:
                    out.append(await self.call(redis, name, keys, args))
                except Exception as exc:  # noqa: BLE001 - the caller sorts out what was applied
                    out.append(exc)
                    break
            return out
        # `async with`: a cluster transaction holds its connection until reset.
        async with redis.pipeline(transaction=True) as pipe:
            for name, keys, args in calls:
                pipe.execute_command("EVAL", self._scripts[name].source, len(keys), *keys, *args)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return [script_error(res) if isinstance(res, ResponseError) else res for res in results]


_default: ScriptSet | None = None


def scripts() -> ScriptSet:
    """The process-wide script set (loaded from disk once)."""
    global _default
    if _default is None:
        _default = ScriptSet()
    return _default
