"""Loads the Lua scripts in ``lua/`` and runs them by EVALSHA.

Each file in ``lua/`` is one atomic transition. A line ``-- @include NAME``
splices ``lua/include/NAME`` in its place; an include is expanded once per
script however often it is named (first mention wins, so order is the order
of first mention), and a cycle is an error. The includes are small, one
concern each (the clock, the keys, the journal, the lease...), so a reader
finds a helper by its concern. Of an include, a script keeps only the
top-level ``local`` definitions it uses, directly or through another kept
one (``prune``): Redis runs a script's whole body on every call, so every
helper left in would be a closure made and collected per call for nothing
(benchmarks/README.md: -7.4% Redis instructions on a single enqueue, -2.4% on
claim + complete at batch 1, when the pruner came in).
The expanded source is what Redis sees and what the SHA is computed from.

The calls themselves (each script's KEYS, ARGV and reply) are built and read
in ``calls*.py``, sent by ``sender.py`` and owned by ``store.py``; this module
only loads the scripts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

_INCLUDE_RE = re.compile(r"^--\s*@include\s+(\S+)\s*$")
# A top-level definition of an include: `local function name(` or `local name =`.
_DEFINITION_RE = re.compile(r"^local\s+(?:function\s+)?([A-Za-z_]\w*)")


def _lua_dir() -> Path:
    """The ``lua`` directory: inside the installed wheel, or at the repo root."""
    packaged = resources.files("venturi_redis") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "lua"


def expand(source: str, read_include: Callable[[str], str], *, name: str = "<script>") -> str:
    """Splice ``-- @include`` lines, each include once, rejecting cycles; then ``prune``."""
    seen: set[str] = set()
    # Each piece: (include name, or None for the script's own lines; its lines).
    pieces: list[tuple[str | None, list[str]]] = []

    def walk(text: str, stack: tuple[str, ...]) -> None:
        own = stack[-1] if len(stack) > 1 else None
        lines: list[str] = []
        for line in text.splitlines():
            m = _INCLUDE_RE.match(line.strip())
            if not m:
                lines.append(line)
                continue
            inc = m.group(1)
            if inc in stack:
                chain = " -> ".join((*stack, inc))
                raise ValueError(f"include cycle in {name}: {chain}")
            if inc in seen:
                continue
            seen.add(inc)
            pieces.append((own, lines))
            pieces.append((None, [f"-- begin include {inc}"]))
            walk(read_include(inc), (*stack, inc))
            pieces.append((None, [f"-- end include {inc}"]))
            lines = []
        pieces.append((own, lines))

    walk(source, (name,))
    return "\n".join(prune(pieces)) + "\n"


# One token of a Lua line: a name, a string (its escapes skipped; an unclosed one
# runs to the end of the line) or a ``--`` comment to the end of the line. The
# strings' loops are unrolled (a run of plain characters at a time): a third
# less time over all of lua/ than one character at a time.
_TOKEN_RE = re.compile(r"""[A-Za-z_]\w*|"[^"\\\n]*(?:\\.?[^"\\\n]*)*"?|'[^'\\\n]*(?:\\.?[^'\\\n]*)*'?|--.*""")


def _code_names(text: str) -> set[str]:
    """The identifiers of Lua lines (``text``, joined by newlines) outside their strings and comments.

    One regex pass over all the lines at once (no token crosses a newline:
    a string left unclosed runs to the end of its line, as a ``--`` comment
    does). A loop over the characters here, with every script expanded when
    the first client was made, was 38% of a worker's start-up
    (benchmarks/README.md, "Worker start-up to its first claim", issue 42);
    with a pass per line, a cold claim.lua took 7.8 ms of CPU to expand, 4.3
    now (enqueue.lua 2.9 -> 2.4: a producer's first enqueue). Not cached line by line
    (all of ``lua/``'s lines held ~3 MB); an include's units are
    (``_include_units``, ~0.9 MB once every script is expanded).
    """
    return {t for t in _TOKEN_RE.findall(text) if t[0] not in "\"'-"}


@cache
def _include_units(lines: tuple[str, ...]) -> tuple[tuple[str | None, tuple[str, ...], frozenset[str]], ...]:
    """A run of an include's lines split into ``prune``'s units, each with the names its code uses.

    Cached by the lines themselves: an include recurs in many scripts, and a
    worker expands its scripts one by one as it first sends them (issue 42).
    """
    units: list[tuple[str | None, list[str]]] = []  # (defined name or None, lines)
    current: tuple[str | None, list[str]] = (None, [])
    comments: list[str] = []
    for line in lines:
        m = _DEFINITION_RE.match(line)
        if m:
            units.append(current)
            current = (m.group(1), [*comments, line])
            comments = []
        elif line.startswith("--") or not line.strip():
            comments.append(line)
        else:
            current[1].extend(comments)
            current[1].append(line)
            comments = []
    current[1].extend(comments)
    units.append(current)
    return tuple((n, tuple(ls), frozenset(_code_names("\n".join(ls)))) for n, ls in units)


def prune(pieces: list[tuple[str | None, list[str]]]) -> list[str]:
    """Keep, of the includes' top-level definitions, those the script's own lines need.

    ``pieces`` are runs of lines, each tagged with the include it comes from
    (None: the script's own). An include's lines split into units, each a
    top-level ``local`` definition at column 0 with the comment lines right
    above it; lines before an include's first definition are kept as they
    are. A unit is kept when its name is used by the script's own code or by
    a kept unit; the rest go, leaving a ``-- (not used here: NAME)`` line.
    """
    # (defined name or None, lines, the names the lines' code uses)
    units: list[tuple[str | None, Sequence[str], Set[str]]] = []
    for origin, lines in pieces:
        if origin is None:
            units.append((None, lines, _code_names("\n".join(lines))))
        else:
            units.extend(_include_units(tuple(lines)))
    defined = {n for n, _, _ in units if n is not None}
    uses = [names & defined for _, _, names in units]
    wanted: set[str] = set()
    todo = [u for (n, _, _), u in zip(units, uses, strict=True) if n is None]
    by_name = {n: u for (n, _, _), u in zip(units, uses, strict=True) if n is not None}
    while todo:
        for used in todo.pop():
            if used not in wanted:
                wanted.add(used)
                todo.append(by_name[used])
    out: list[str] = []
    for n, kept, _ in units:
        if n is None or n in wanted:
            out.extend(kept)
        else:
            out.append(f"-- (not used here: {n})")
    return out


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
    """Every script of ``lua/``, by name (the file name without ``.lua``).

    A script is read and expanded the first time it is asked for, not when
    the set is made: a worker's start-up needs three of the scripts, and
    expanding all of them was most of its time in this module (issue 42).
    An include that is missing or a cycle raises then, for that script.
    """

    def __init__(self, directory: Path | None = None) -> None:
        root = directory or _lua_dir()
        self._include_dir = root / "include"
        self._paths = {path.stem: path for path in sorted(root.glob("*.lua"))}
        self._scripts: dict[str, Script] = {}
        if not self._paths:
            raise FileNotFoundError(f"no Lua scripts found in {root}")

    def _read_include(self, inc: str) -> str:
        path = self._include_dir / inc
        if not path.is_file():
            raise FileNotFoundError(f"Lua include {inc!r} not found in {self._include_dir}")
        return path.read_text()

    def __getitem__(self, name: str) -> Script:
        try:
            return self._scripts[name]
        except KeyError:
            pass
        path = self._paths[name]  # an unknown name is a KeyError, as before
        # Two threads may both build it: the same source, the same SHA, either kept.
        script = Script.build(name, expand(path.read_text(), self._read_include, name=path.name))
        self._scripts[name] = script
        return script

    def names(self) -> list[str]:
        return sorted(self._paths)


_default: ScriptSet | None = None


def scripts() -> ScriptSet:
    """The process-wide script set (loaded from disk once)."""
    global _default
    if _default is None:
        _default = ScriptSet()
    return _default
