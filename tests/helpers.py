"""Small helpers shared by the tests."""

from __future__ import annotations

from typing import Any

import anyio

import venturi_redis as vr


def make_worker(queue: vr.Queue | list[vr.Queue], *handlers: type[Any], **options: Any) -> vr.Worker[Any]:
    options.setdefault("handle_signals", False)
    options.setdefault("poll_interval", 0.5)
    options.setdefault("backoff", vr.Backoff.fibonacci(base=0.01, cap=0.05))
    worker: vr.Worker[Any] = vr.Worker(queue, **options)
    worker.register(*handlers)
    return worker


async def drain(
    queue: vr.Queue | list[vr.Queue], *handlers: type[Any], timeout: float = 30, **options: Any
) -> vr.Worker[Any]:
    """Run a worker until the queue is drained (bounded, so a bug fails instead of hanging)."""
    worker = make_worker(queue, *handlers, **options)
    with anyio.fail_after(timeout):
        await worker.run(until_idle=True)
    return worker


async def events(queue: vr.Queue, job_id: str) -> list[str]:
    return [e.event for e in await queue.journal(job_id)]
