"""The worker's health file (issue 33 item 2): touched while the loop runs, not while it is blocked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import make_worker

pytestmark = pytest.mark.anyio


def mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


class Block(vr.Task):
    KIND: ClassVar[str] = "block-the-loop"
    seconds: float


class BlockJob(Block, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        path: Path = state["path"]
        before = mtime(path)
        time.sleep(self.seconds)  # blocks the event loop, as a CPU-bound or stuck handler would
        state["while_blocked"] = mtime(path) == before
        return vr.Outcome.completed()


async def test_health_file_is_touched_while_running_and_not_while_blocked(
    queue: vr.Queue, tmp_path: Path
) -> None:
    path = tmp_path / "alive"
    state: dict[str, Any] = {"path": path}
    worker = make_worker(queue, BlockJob, lease=0.3, health_file=path, state=state)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            while not path.exists():
                await anyio.sleep(0.01)
            first = mtime(path)
            while mtime(path) == first:  # touched again on a later tick
                await anyio.sleep(0.01)
            await queue.enqueue(Block(seconds=0.5))  # 5 ticks with the loop blocked
            while "while_blocked" not in state:
                await anyio.sleep(0.01)
        worker.shutdown()
    assert state["while_blocked"] is True


def test_health_file_must_be_a_path() -> None:
    with pytest.raises(vr.ConfigurationError, match="health_file"):
        vr.Worker(vr.Client.from_url("memory://").queue("q"), health_file=42)  # type: ignore[arg-type]
