"""The worker's inbox (inbox.py): claimed jobs reach the slot tasks.

A put into an empty inbox wakes one slot; a slot that takes a job and leaves
others schedules a spread that wakes a slot per job left. These tests hold the
guarantees that shape must keep: a handler that waits never holds up the
jobs behind it, and no job is left in the inbox while a slot is free.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from venturi_redis._worker.inbox import Inbox

pytestmark = pytest.mark.anyio


async def _slots(inbox: Inbox, n: int, run: Any) -> None:
    async def slot() -> None:
        while True:
            job = inbox.take()
            if job is None and (job := await inbox.get()) is None:
                return
            await run(job)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(slot)


async def test_jobs_whose_handlers_wait_each_get_a_slot() -> None:
    """Ten jobs put at once, each waiting until all ten run: the spread must wake a slot per job."""
    inbox = Inbox()
    running: set[Any] = set()
    all_in = anyio.Event()

    async def run(job: Any) -> None:
        running.add(job)
        if len(running) == 10:
            all_in.set()
        await all_in.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_slots, inbox, 20, run)
            await anyio.sleep(0.01)  # every slot waits in get()
            for i in range(10):
                inbox.put(i)  # type: ignore[arg-type]
            await all_in.wait()
            inbox.close()
    assert running == set(range(10))


async def test_quick_jobs_run_in_order_and_none_is_left() -> None:
    """Jobs that never wait run in put order, across bursts, and close() lets every slot return."""
    inbox = Inbox()
    ran: list[int] = []

    async def run(job: Any) -> None:
        ran.append(job)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_slots, inbox, 8, run)
            for burst in range(5):
                await anyio.sleep(0.01)
                for i in range(10):
                    inbox.put(burst * 10 + i)  # type: ignore[arg-type]
            await anyio.sleep(0.01)
            inbox.close()
    assert ran == list(range(50))


async def test_a_job_put_while_every_slot_is_busy_is_taken_when_one_frees() -> None:
    inbox = Inbox()
    release = anyio.Event()
    ran: list[int] = []

    async def run(job: Any) -> None:
        ran.append(job)
        if job == 0:
            await release.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_slots, inbox, 1, run)
            await anyio.sleep(0.01)
            inbox.put(0)  # type: ignore[arg-type]
            await anyio.sleep(0.01)
            inbox.put(1)  # type: ignore[arg-type]  # the one slot is busy: nobody to wake
            await anyio.sleep(0.01)
            assert ran == [0]
            release.set()
            await anyio.sleep(0.01)
            inbox.close()
    assert ran == [0, 1]
