"""How a worker claims batch jobs: the next claim overlaps the last one's completions, bounded.

While its claims bring batch jobs only, a runner sends each claim at once on
a round trip of its own, instead of in the completer's next pipeline (where
it would wait for the batches of the last claim to run and for their
completions to be written). The jobs it has ahead (claimed and waiting for
a slot, or ended with their ending not yet written) stay within
``MAX_AHEAD``, and each keeps its lease while it waits; a forming batch's
jobs wait for their batch, which still fills to its ``BATCH_SIZE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from venturi_redis._worker import outbox as outbox_module
from venturi_redis._worker.batch import MAX_AHEAD, MAX_CLAIM
from venturi_redis._worker.runner import _Runner

pytestmark = pytest.mark.anyio


class Item(vr.Task):
    KIND: ClassVar[str] = "batch.item"
    n: int


class Items(Item, vr.BatchHandler[Any]):
    BATCH_SIZE: ClassVar[int] = 100

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Item]], state: Any) -> None:
        return None


def _slow_completions(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The outbox's pipelines reach Redis ``seconds`` late (the claims do not go through them)."""
    real = outbox_module.send_ops

    async def slow(sender: Any, ops: Any) -> list[Any]:
        await anyio.sleep(seconds)
        return await real(sender, ops)

    monkeypatch.setattr(outbox_module, "send_ops", slow)


def _watch_claims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Per claim reply: (jobs the runner held before it, jobs it holds after its dispatch)."""
    seen: list[tuple[int, int]] = []
    real = _Runner._dispatch

    def dispatch(self: _Runner, jobs: list[Any], now: int = 0) -> None:
        before = len(self.active)
        real(self, jobs, now)
        seen.append((before, len(self.active)))

    monkeypatch.setattr(_Runner, "_dispatch", dispatch)
    return seen


async def test_the_next_claim_does_not_wait_for_the_last_ones_completions(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_completions(monkeypatch, 0.05)
    seen = _watch_claims(monkeypatch)
    n = 4 * MAX_CLAIM
    ids = await queue.enqueue_many([Item(n=i) for i in range(n)])
    await drain(queue, Items, concurrency=10)
    assert (await queue.counts())["completed"] == n
    # A claim came back while the jobs of an earlier one were still on the
    # books (ended, their completions not yet written): it overlapped them.
    assert any(before > 0 for before, _ in seen), seen
    assert await events(queue, ids[-1]) == ["enqueued", "claimed", "completed"]


async def test_a_batch_drain_keeps_its_jobs_ahead_bounded(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Completions written far slower than claims come back: without a bound,
    # the claims would take the whole queue ahead of the writes.
    _slow_completions(monkeypatch, 0.1)
    seen = _watch_claims(monkeypatch)
    n = 3 * MAX_AHEAD
    await queue.enqueue_many([Item(n=i) for i in range(n)])
    await drain(queue, Items, concurrency=100)
    assert (await queue.counts())["completed"] == n
    # The no-op batches run after the dispatch: every job held then is ahead.
    assert max(after for _, after in seen) <= MAX_AHEAD, seen


# Not on the memory backend: its scripts run in this process, and a claim or a
# completion of 500 jobs holds the event loop long enough that a 1 s lease
# runs out before the keeper's next renewal (so on main too, batch or not).
@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_jobs_claimed_ahead_keep_their_leases(queue: vr.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each completion pipeline waits longer than a lease: the jobs waiting
    # for it, and those claimed meanwhile, are renewed, never reclaimed.
    _slow_completions(monkeypatch, 1.5)
    n = 2 * MAX_CLAIM
    ids = await queue.enqueue_many([Item(n=i) for i in range(n)])
    await drain(queue, Items, concurrency=10, lease=1.0, reclaim_interval=0.05)
    assert (await queue.counts())["completed"] == n
    for job_id in ids[:: MAX_CLAIM // 5]:
        journal = await events(queue, job_id)
        assert journal == ["enqueued", "claimed", "completed"], journal


async def test_a_serving_worker_claims_again_once_the_completions_are_written(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside until_idle nothing pokes the claim loop when an ending is
    # written: past the bound it looks again on its own, and the queue drains.
    _slow_completions(monkeypatch, 0.1)
    seen = _watch_claims(monkeypatch)
    n = 2 * MAX_AHEAD
    await queue.enqueue_many([Item(n=i) for i in range(n)])
    worker = make_worker(queue, Items, concurrency=100)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            while (await queue.counts())["completed"] < n:
                await anyio.sleep(0.05)
        worker.shutdown()
    assert max(after for _, after in seen) <= MAX_AHEAD, seen


class Big(vr.Task):
    KIND: ClassVar[str] = "batch.big"
    n: int


class BigBatches(Big, vr.BatchHandler[dict[str, Any]]):
    BATCH_SIZE: ClassVar[int] = 4 * MAX_CLAIM  # more than MAX_AHEAD: filled over several claims
    BATCH_WAIT: ClassVar[float] = 5.0

    @classmethod
    async def handle_batch(cls, items: Sequence[vr.BatchItem[Big]], state: dict[str, Any]) -> None:
        state.setdefault("sizes", []).append(len(items))
        return None


async def test_a_batch_larger_than_the_bound_still_fills(queue: vr.Queue) -> None:
    # The jobs of a forming batch are not "ahead": they wait for their batch,
    # which fills over several claims of at most MAX_CLAIM each.
    n = BigBatches.BATCH_SIZE
    await queue.enqueue_many([Big(n=i) for i in range(n)])
    state: dict[str, Any] = {}
    await drain(queue, BigBatches, state=state, concurrency=2)
    assert state["sizes"] == [n]


async def test_a_claim_larger_than_the_bound_goes_when_nothing_is_ahead(queue: vr.Queue) -> None:
    # concurrency 3,100: a claim's batch_size (half of it) is above MAX_AHEAD.
    concurrency = 2 * MAX_AHEAD + 100
    n = 3 * MAX_CLAIM
    await queue.enqueue_many([Item(n=i) for i in range(n)])
    await drain(queue, Items, concurrency=concurrency)
    assert (await queue.counts())["completed"] == n
