"""The Python blocks of README.md and docs/ marked runnable, run as a reader would paste them.

A block is runnable when the line right above its opening fence is
``<!-- runnable -->``: it is written to a file of its own and run by this
virtualenv's Python in a fresh process, once against a real redis-server
(``REDIS_URL`` set) and once with ``REDIS_URL`` unset. A block that raises, or
exits non-zero, fails the suite; so does a page that marks nothing runnable
while a test here expects it to. Every page a page names (``docs/NAME.md``,
``[...](NAME.md)``) must exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK_RE = re.compile(r"^<!-- runnable -->\n```python\n(?P<body>.*?)^```", re.S | re.M)


def runnable_blocks() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for page in PAGES:
        for i, m in enumerate(_BLOCK_RE.finditer(page.read_text()), start=1):
            out.append((f"{page.relative_to(ROOT)}#{i}", m["body"]))
    return out


BLOCKS = runnable_blocks()


def test_readme_has_a_runnable_taste() -> None:
    assert any(name.startswith("README.md#") for name, _ in BLOCKS)


def run_block(tmp_path: Path, body: str, redis_url: str | None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "block.py"
    script.write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("where", ["redis", "unset"])
@pytest.mark.parametrize(("name", "body"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_runnable_block_runs(
    tmp_path: Path, redis_server: RedisServer, name: str, body: str, where: str
) -> None:
    res = run_block(tmp_path, body, redis_server.url if where == "redis" else None)
    assert res.returncode == 0, f"{name} failed:\n{res.stderr}"


def test_the_taste_prints_the_jobs_journal(tmp_path: Path, redis_server: RedisServer) -> None:
    taste = next(body for name, body in BLOCKS if name == "README.md#1")
    res = run_block(tmp_path, taste, redis_server.url)
    assert res.returncode == 0, res.stderr
    first, *journal = res.stdout.splitlines()
    assert re.fullmatch(r"crawl \w{26}: completed after 3 runs, \{'pages': 3, 'agent': 'taste/1.0'\}", first)
    events = [line.split()[1] for line in journal]
    assert events == ["enqueued", "claimed", "paused", "claimed", "paused", "claimed", "completed"]


def test_every_docs_page_named_exists() -> None:
    """A reader follows ``docs/NAME.md`` and ``[...](NAME.md)``: each names a page that exists."""
    named = set()
    for page in PAGES:
        text = page.read_text()
        named.update(re.findall(r"\bdocs/([\w-]+\.md)\b", text))
        if page.parent.name == "docs":
            named.update(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)", text))
    assert named, "no page names found: the patterns above are stale"
    assert sorted(name for name in named if not (ROOT / "docs" / name).is_file()) == []
