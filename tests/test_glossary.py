"""docs/glossary.md names every job state and view of pending, with BullMQ's, Celery's and RQ's words."""

from __future__ import annotations

import re
from pathlib import Path

import venturi_redis as vr
from venturi_redis._producer.reads import VIEWS

GLOSSARY = Path(__file__).resolve().parent.parent / "docs" / "glossary.md"


def test_every_state_and_view_has_a_row_with_the_peers_words() -> None:
    rows = re.findall(r"^\| `([a-z]+)` \|(.*)\|$", GLOSSARY.read_text(), re.M)
    named = {name: cells.split("|") for name, cells in rows}
    assert set(named) == {s.value for s in vr.JobState} | set(VIEWS)
    for name, cells in named.items():
        assert len(cells) == 4 and all(c.strip() for c in cells), name  # ours, BullMQ, Celery, RQ
    readme = (GLOSSARY.parent.parent / "README.md").read_text()
    assert "`docs/glossary.md`" in readme
