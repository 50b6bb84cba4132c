"""@vr.offload on a plain ``def``: a direct call stays sync; a worker runs it in a handler thread.

Its producer side and result path are an async one's (tests/test_offload.py);
what is its own is tested here, on a real redis-server: the direct call, the
thread it runs in and the job's log context there, the retry and dead
endings, a timeout that abandons its thread, and what decoration refuses.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import keys_matching

pytestmark = pytest.mark.anyio


class Report(BaseModel):
    tenant_id: int
    total: float


def on(queue: vr.Queue, fn: Callable[..., Any], **options: Any) -> vr.SyncOffloadFunction[Any, Any]:
    options.setdefault("kind", "tests.build_sync")
    return vr.offload(queue=queue.name, **options)(fn)


async def run_until_idle(queue: vr.Queue, fn: Any, **options: Any) -> vr.Worker[Any]:
    options.setdefault("handle_signals", False)
    options.setdefault("poll_interval", 0.2)
    options.setdefault("backoff", vr.Backoff.fibonacci(base=0.01, cap=0.02))
    worker: vr.Worker[Any] = vr.Worker(queue, **options).register(fn)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    return worker


async def test_calling_it_directly_is_a_plain_sync_call(client: vr.Client, queue: vr.Queue) -> None:
    def build(tenant_id: int) -> Report:
        return Report(tenant_id=tenant_id, total=1.5)

    fn = on(queue, build)
    assert isinstance(fn, vr.OffloadFunction) and fn.__name__ == "build"
    assert fn(3) == Report(tenant_id=3, total=1.5)  # a value, no coroutine to await
    assert await keys_matching(client.redis, f"*{queue.name}*") == []  # nothing was enqueued


async def test_a_worker_runs_it_in_a_handler_thread_and_it_resolves_typed(
    client: vr.Client, queue: vr.Queue
) -> None:
    seen: dict[str, Any] = {}

    def build(tenant_id: int, total: float = 0.5) -> Report:
        seen["thread"] = threading.current_thread().name
        record = logging.LogRecord("app", logging.INFO, __file__, 1, "built", None, None)
        vr.JobLogFilter().filter(record)  # the job's log context, as a sync handler has it
        seen["job"] = record.venturi_job_id
        time.sleep(0.01)  # blocking is fine here: the loop is not this thread
        return Report(tenant_id=tenant_id, total=total)

    fn = on(queue, build)
    handle = await fn.offload(client, 7, total=2.5)
    await run_until_idle(queue, fn)
    res = await vr.resolve(client, handle, timeout=5)
    assert res == vr.OffloadResult("completed", value=Report(tenant_id=7, total=2.5), job_id=handle.job_id)
    assert await vr.read_result(client, fn.handle(handle.key)) == res
    assert seen["thread"].startswith("venturi-handler-") and seen["thread"] != threading.current_thread().name
    assert seen["job"] == handle.job_id


async def test_an_exception_retries_and_the_next_run_succeeds(client: vr.Client, queue: vr.Queue) -> None:
    runs: list[int] = []

    def flaky(tenant_id: int) -> Report:
        runs.append(tenant_id)
        if len(runs) == 1:
            raise ConnectionError("provider timeout")
        return Report(tenant_id=tenant_id, total=1.0)

    fn = on(queue, flaky)
    handle = await fn.offload(client, tenant_id=4)
    await run_until_idle(queue, fn)
    res = await vr.resolve(client, handle, timeout=5)
    assert (res.status, res.value) == ("completed", Report(tenant_id=4, total=1.0))
    info = await queue.get(handle.job_id)
    assert info is not None and (info.state, info.failures, runs) == (vr.JobState.COMPLETED, 1, [4, 4])
    failed = [e for e in await queue.journal(handle.job_id) if e.event == "failed"]
    assert len(failed) == 1 and "provider timeout" in (failed[0].note or "")


async def test_a_permanent_error_sends_it_to_dead_with_its_note(client: vr.Client, queue: vr.Queue) -> None:
    def refuse(tenant_id: int) -> Report:
        raise vr.TaskError.permanent(f"tenant {tenant_id} is closed")

    fn = on(queue, refuse)
    handle = await fn.offload(client, tenant_id=9)
    await run_until_idle(queue, fn)
    info = await queue.get(handle.job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.DEAD, 1)
    assert "tenant 9 is closed" in (info.note or "")
    res = await vr.resolve(client, handle, timeout=5)
    assert (res.status, res.error) == ("failed", "tenant 9 is closed")


async def test_past_its_timeout_the_run_fails_and_its_thread_is_abandoned(
    client: vr.Client, queue: vr.Queue
) -> None:
    go = threading.Event()

    def stuck(tenant_id: int) -> Report:
        go.wait(20)  # bounded, so that a bug fails the test instead of hanging it
        return Report(tenant_id=tenant_id, total=0.0)

    fn = on(queue, stuck, max_failures=1)
    handle = await fn.offload(client, tenant_id=1)
    worker = await run_until_idle(queue, fn, timeout=0.2)
    info = await queue.get(handle.job_id)
    assert info is not None and info.state is vr.JobState.DEAD
    assert "timed out after 0.2 s" in (info.note or "")
    assert worker.handler_threads.abandoned == 1
    go.set()  # the abandoned thread returns now: what it returns is discarded
    with anyio.fail_after(30):
        while worker.handler_threads.abandoned:
            await anyio.sleep(0.01)
    res = await vr.read_result(client, handle)
    assert res is not None and res.status == "failed"


def _hidden(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A decorator that hides that ``fn`` is async, as some tracing decorators do."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


async def test_a_def_returning_a_coroutine_is_awaited_on_the_worker(
    client: vr.Client, queue: vr.Queue
) -> None:
    @_hidden
    async def build(tenant_id: int) -> Report:
        return Report(tenant_id=tenant_id, total=3.0)

    fn = on(queue, build)
    assert await fn(2) == Report(tenant_id=2, total=3.0)
    handle = await fn.offload(client, tenant_id=2)
    await run_until_idle(queue, fn)
    res = await vr.resolve(client, handle, timeout=5)
    assert (res.status, res.value) == ("completed", Report(tenant_id=2, total=3.0))


class Callable_:
    def __call__(self, x: int) -> int:
        return x


def test_what_cannot_be_offloaded_is_refused_at_decoration() -> None:
    def gen(x: int) -> Iterator[int]:
        yield x

    async def agen(x: int) -> AsyncIterator[int]:
        yield x

    def unannotated(x) -> int:  # type: ignore[no-untyped-def]
        return 1

    def varargs(*xs: int) -> int:
        return 1

    cases: list[tuple[Any, str]] = [
        (gen, "a generator cannot be offloaded"),
        (agen, "a generator cannot be offloaded"),
        (Callable_(), "decorate a function .* not a Callable_"),
        (Callable_, "decorate a function .* not a type"),
        (len, "decorate a function .* not a builtin_function_or_method"),
        (unannotated, "'x' has no type annotation"),
        (varargs, r"\*xs"),
    ]
    for fn, match in cases:
        with pytest.raises(TypeError, match=match):
            vr.offload(kind="k")(fn)

    async def build(x: int) -> int:
        return x

    def len_of(x: str) -> int:
        return len(x)

    # The class is @vr.offload's choice: a direct construction of the wrong one is refused.
    options: dict[str, Any] = {
        "queue": "q",
        "kind": "k",
        "retention": None,
        "priority": None,
        "lease": None,
        "max_failures": None,
    }
    with pytest.raises(TypeError, match=r"not for a vr\.SyncOffloadFunction"):
        vr.SyncOffloadFunction(build, **options)
    with pytest.raises(TypeError, match=r"not for a vr\.OffloadFunction"):
        vr.OffloadFunction(len_of, **options)
