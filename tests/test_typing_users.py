"""Users' code type-checks: tests/typing/ and examples/ under mypy --strict and pyright's strict mode.

The package itself passes ``mypy --strict`` (``make typecheck``); this is the
other side, the code a user writes as README.md, docs/ and examples/ show it.
tests/typing/ holds that code with ``assert_type`` on what the public API gives
back, and negative lines that must stay errors: each carries mypy's ignore
with its code and pyright's with its rule, and an ignore no longer needed is
an error for both (mypy's ``warn_unused_ignores``, part of ``--strict``;
pyright's ``reportUnnecessaryTypeIgnoreComment``, tests/typing/pyrightconfig.json),
so a type that loosens to ``Any`` fails here.

Both run with their own settings, not the package's ``[tool.mypy]``, as a
user's project would: mypy with ``--config-file=`` (none read) and its flags
below, pyright as basedpyright (the PyPI package that bundles Node, so CI
installs it from PyPI alone) in pyright's strict mode, what VS Code's Pylance
shows in strict mode. examples/django is left out: Django ships no types.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TARGETS = [str(p.relative_to(ROOT)) for p in (*sorted(TYPING.glob("*.py")), *EXAMPLES)]

MYPY = [
    sys.executable,
    "-m",
    "mypy",
    "--config-file=",
    "--strict",
    "--python-version=3.11",
    "--enable-error-code=ignore-without-code",
    "--warn-unreachable",
    "--no-error-summary",
    "--hide-error-context",
]
PYRIGHT = [
    sys.executable,
    "-m",
    "basedpyright",
    "--project",
    str(TYPING / "pyrightconfig.json"),
    "--pythonpath",
    sys.executable,
]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False)


def test_the_files_are_there() -> None:
    # A glob that found nothing would make both checks below pass on nothing.
    names = {Path(t).name for t in TARGETS}
    assert {"taste.py", "bookmarks.py"} <= names, names


def test_mypy_strict(tmp_path: Path) -> None:
    done = run([*MYPY, f"--cache-dir={tmp_path / 'mypy'}", *TARGETS])
    assert done.returncode == 0, f"mypy --strict found errors in users' code:\n{done.stdout}{done.stderr}"


def test_pyright_strict() -> None:
    done = run([*PYRIGHT, *TARGETS])
    assert done.returncode == 0, f"pyright (strict) found errors in users' code:\n{done.stdout}{done.stderr}"
    assert "0 errors" in done.stdout, done.stdout
