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
claim + complete at batch 1, when the pruner came in). A helper only a lib
uses (a function of the script's own with a ``-- @lib`` line, called on the
rare paths) is made inside it instead (-10% on claim + complete at batch 1,
session 22).
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


# One token of Lua lines: `..`, a field or method name after `.` or `:` (no use
# of a local: skipped), a name, a string (its escapes skipped; an unclosed one
# runs to the end of the line) or a ``--`` comment to the end of the line. The
# strings' loops are unrolled (a run of plain characters at a time): a third
# less time over all of lua/ than one character at a time. No token crosses a
# newline.
_TOKEN_RE = re.compile(
    r"""\.\.|[.:][ \t]*[A-Za-z_]\w*|[A-Za-z_]\w*"""
    r"""|"[^"\\\n]*(?:\\.?[^"\\\n]*)*"?|'[^'\\\n]*(?:\\.?[^'\\\n]*)*'?|--.*"""
)


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
    return {t for t in _TOKEN_RE.findall(text) if t[0] not in "\"'-.:"}


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


_LIB_RE = re.compile(r"^\s*--\s*@lib\b")
# Where a unit's lines are (prune): an include's, or the script's own outside every lib.
INCLUDE, TOP = -2, -1
_LIB_END_RE = re.compile(r"^end\b")


def prune(pieces: list[tuple[str | None, list[str]]]) -> list[str]:
    """Keep, of the includes' top-level definitions, those the script's own lines need.

    ``pieces`` are runs of lines, each tagged with the include it comes from
    (None: the script's own). An include's lines split into units, each a
    top-level ``local`` definition at column 0 with the comment lines right
    above it; lines before an include's first definition are kept as they
    are. A unit is kept when its name is used by the script's own code or by
    a kept unit; the rest go, leaving a ``-- (not used here: NAME)`` line.

    A lib: a function of the script's own whose body has a ``-- @lib`` line
    (to the next ``end`` at column 0), made only on the paths that need it
    (claim.lua's ``endings_lib``). A unit that only one lib needs is spliced
    into it at that line instead of at the top, so it is a closure made when
    the lib is, not on every call; it leaves ``-- (in the lib below: NAME)``.
    """
    # (defined name or None, lines, the names the lines' code uses, where):
    # where is INCLUDE for an include's lines, TOP for the script's own lines
    # outside every lib, else the number of the lib they are in.
    units: list[tuple[str | None, Sequence[str], Set[str], int]] = []
    lib, libs = TOP, 0
    for origin, lines in pieces:
        if origin is not None:
            units.extend((n, ls, names, INCLUDE) for n, ls, names in _include_units(tuple(lines)))
            continue
        run: list[str] = []
        for line in lines:
            if _LIB_RE.match(line) or (lib != TOP and _LIB_END_RE.match(line)):
                units.append((None, run, _code_names("\n".join(run)), lib))
                run = [line]
                lib, libs = (libs, libs + 1) if lib == TOP else (TOP, libs)
            else:
                run.append(line)
        units.append((None, run, _code_names("\n".join(run)), lib))
    defined = {u[0] for u in units if u[0] is not None}
    by_name = {n: names & defined for n, _, names, _ in units if n is not None}

    def needs(seeds: Set[str], have: Set[str]) -> set[str]:
        """``seeds`` and what they use, transitively, beyond ``have``."""
        out: set[str] = set()
        todo = [n for n in seeds if n not in have]
        while todo:
            name = todo.pop()
            if name not in out:
                out.add(name)
                todo.extend(u for u in by_name[name] if u not in have)
        return out

    seeds: dict[int, set[str]] = {k: set() for k in range(TOP, libs)}
    for n, _, names, k in units:
        if n is None:  # the lines every call runs (an include's before its first definition: TOP)
            seeds[TOP if k == INCLUDE else k] |= names & defined
    top = needs(seeds[TOP], set())
    while True:
        in_lib = [needs(seeds[k], top) for k in range(libs)]
        shared = {n for k, ns in enumerate(in_lib) for n in ns if any(n in o for o in in_lib[k + 1 :])}
        if not shared:
            break
        top |= needs(shared, top)  # needed by two libs: made at the top, once
    home = {n: k for k, ns in enumerate(in_lib) for n in ns}
    moved: list[list[str]] = [[] for _ in range(libs)]
    for n, kept, _, _ in units:
        if n is not None and n in home:
            moved[home[n]].extend(kept)
    out: list[str] = []
    for n, kept, _, k in units:
        if n is None:
            if k >= 0 and kept and _LIB_RE.match(kept[0]):
                out.append(kept[0])
                out.extend(moved[k])
                out.extend(kept[1:])
            else:
                out.extend(kept)
        elif n in top:
            out.extend(kept)
        elif n in home:
            out.append(f"-- (in the lib below: {n})")
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
