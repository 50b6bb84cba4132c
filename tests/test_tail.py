"""The shared reader of a queue's event stream (``_producer/tail.py``): a follower that joins
behind the reader reads the gap itself, and loses nothing the reader hands out meanwhile."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from venturi_redis._producer.tail import StreamTail

pytestmark = pytest.mark.anyio


class SlowRange:
    """A client whose XRANGE answers only when the test lets it, with the entries it holds."""

    def __init__(self, entries: list[tuple[str, dict[bytes, bytes]]]) -> None:
        self.entries = entries
        self.asked: list[tuple[str, str]] = []
        self.go = anyio.Event()

    async def xrange(self, key: str, lo: str, hi: str, count: int) -> list[Any]:
        self.asked.append((lo, hi))
        await self.go.wait()
        self.go = anyio.Event()
        after = _sid(lo.removeprefix("("))
        return [(i.encode(), f) for i, f in self.entries if after < _sid(i) <= _sid(hi)][:count]


def _sid(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def entry(n: int) -> tuple[str, dict[bytes, bytes]]:
    return f"{n}-0", {b"event": b"enqueued", b"job": f"j{n}".encode()}


async def test_a_follower_reading_its_gap_keeps_what_the_reader_hands_out_meanwhile() -> None:
    # The CI failure on redis-py 5.0.1 under load (test_events' resumed consumer): the
    # reader handed out entries 4 and 5 while the follower's XRANGE of its gap (up to 3)
    # ran; the follower then took its short reply for "caught up", and 4 and 5 were lost.
    redis = SlowRange([entry(n) for n in range(1, 6)])
    tail = StreamTail(redis, "events")
    tail.position = "3-0"  # a reader running ahead of the follower
    tail._task = object()  # type: ignore[assignment]  # it runs (the test hands out for it)
    got: list[str] = []
    batches = tail.follow("2-0")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                async for batch in batches:
                    got.extend(entry_id for entry_id, _ in batch)
                    if got[-1] == "5-0":
                        return

            tg.start_soon(take)
            while not redis.asked:
                await anyio.lowlevel.checkpoint()
            assert redis.asked == [("(2-0", "3-0")]
            tail._hand_out([entry(4), entry(5)])  # the reader's next batch, mid-XRANGE
            redis.go.set()
            while len(redis.asked) < 2 and got[-1:] != ["5-0"]:
                await anyio.lowlevel.checkpoint()
            redis.go.set()
    await batches.aclose()
    assert got == ["3-0", "4-0", "5-0"]
