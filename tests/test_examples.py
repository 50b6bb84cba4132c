"""Every file in examples/ runs in the suite, on the embedded memory:// default."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import venturi_redis as vr

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)


async def test_bookmarks_example() -> None:
    results = await load("bookmarks").main()
    by_url = {info.payload["url"]: info for info in results.values()}
    assert by_url["https://example.org/a?v=2"].state == vr.JobState.COMPLETED  # merged (Replace)
    assert by_url["https://example.org/gone"].state == vr.JobState.DEAD
    assert by_url["https://example.org/gone"].note == "resource gone"
    flaky = by_url["https://example.org/flaky"]
    assert (flaky.state, flaky.failures, flaky.run_count) == (vr.JobState.COMPLETED, 2, 3)


async def test_approval_example() -> None:
    results = await load("approval").main()
    by_doc = {info.payload["document_id"]: info for info in results.values()}
    assert {i.state for i in by_doc.values()} == {vr.JobState.COMPLETED}
    assert by_doc[101].result == {"approver": "carol", "approved": True, "reason": ""}
    assert by_doc[102].note == "rejected by dan: too long"
    assert all(i.run_count == 2 for i in by_doc.values())


async def test_report_example() -> None:
    mod = load("report")
    results = await mod.main()
    assert results["may"].status == "completed"
    assert results["may"].value == mod.Report(tenant_id=7, month=5, lines=57, total_cents=57 * 1999)
    assert results["bad"].status == "failed"
    assert results["bad"].error is not None and "month 13" in results["bad"].error
