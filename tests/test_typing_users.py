"""Users' code type-checks: tests/typing/, examples/ and the docs' programs, mypy --strict and pyright strict.

The package itself passes ``mypy --strict`` (``make typecheck``); this is the
other side, the code a user writes as README.md, docs/ and examples/ show it.
tests/typing/ holds that code with ``assert_type`` on what the public API gives
back, and negative lines that must stay errors: each carries mypy's ignore
with its code and pyright's with its rule, and an ignore no longer needed is
an error for both (mypy's ``warn_unused_ignores``, part of ``--strict``;
pyright's ``reportUnnecessaryTypeIgnoreComment``, tests/typing/pyrightconfig.json),
so a type that loosens to ``Any`` fails here. The complete programs of
README.md and docs/ (the blocks tests/test_docs_runnable.py runs) are checked
too, each written to a file of its own.

Both run with their own settings, not the package's ``[tool.mypy]``, as a
user's project would: mypy with ``--config-file=`` (none read) and its flags
below, pyright as basedpyright (the PyPI package that bundles Node, so CI
installs it from PyPI alone) in pyright's strict mode, what VS Code's Pylance
shows in strict mode. examples/django is left out: Django ships no types.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs_runnable import runnable_blocks

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TARGETS = [str(p.relative_to(ROOT)) for p in (*sorted(TYPING.glob("*.py")), *EXAMPLES)]
# Runnable blocks left out, with why: they type-check nothing of ours.
UNCHECKED_BLOCKS = {
    "docs/observability.md#2": "OpenTelemetry's SDK spans (optional parents, attributes), walked as a test",
}

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


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """TARGETS and the docs' runnable blocks, each a file named after its page and place."""
    where = tmp_path_factory.mktemp("docs_blocks")
    files = list(TARGETS)
    for name, body in runnable_blocks():
        if name not in UNCHECKED_BLOCKS:
            path = where / f"doc_{re.sub(r'[^A-Za-z0-9]+', '_', name)}.py"
            path.write_text(body)
            files.append(str(path))
    return files


def test_the_files_are_there(targets: list[str]) -> None:
    # A glob that found nothing would make both checks below pass on nothing.
    names = {Path(t).name for t in targets}
    assert {"taste.py", "bookmarks.py", "doc_README_md_1.py", "doc_docs_design_md_1.py"} <= names, names
    blocks = {name for name, _ in runnable_blocks()}
    assert set(UNCHECKED_BLOCKS) <= blocks, "a block left out is no longer there: update UNCHECKED_BLOCKS"


def test_mypy_strict(tmp_path: Path, targets: list[str]) -> None:
    done = run([*MYPY, f"--cache-dir={tmp_path / 'mypy'}", *targets])
    assert done.returncode == 0, f"mypy --strict found errors in users' code:\n{done.stdout}{done.stderr}"


def test_pyright_strict(targets: list[str]) -> None:
    done = run([*PYRIGHT, *targets])
    assert done.returncode == 0, f"pyright (strict) found errors in users' code:\n{done.stdout}{done.stderr}"
    assert "0 errors" in done.stdout, done.stdout
