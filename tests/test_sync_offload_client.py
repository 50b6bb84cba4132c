"""vr.SyncClient.offload and .resolve: the blocking ``fn.offload(client, ...)`` and ``vr.resolve``.

Each test runs in a plain thread with no event loop, as a Django or Flask view
does, against a real redis-server; a worker runs the calls from a thread of
its own, so ``SyncClient.resolve`` waits on it as a view would.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest
from pydantic import BaseModel, ValidationError

import venturi_redis as vr
from tests.servers import RedisServer

T = TypeVar("T")


class Report(BaseModel):
    tenant_id: int
    total: float


@pytest.fixture
def name() -> str:
    return f"sync-offload-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sc(redis_server: RedisServer) -> Iterator[vr.SyncClient]:
    with pytest.raises(RuntimeError):  # no running loop: the caller is plain blocking code
        asyncio.get_running_loop()
    with vr.SyncClient(redis_server.url) as sync_client:
        yield sync_client


def on_async(url: str, call: Callable[[vr.Client], Awaitable[T]]) -> T:
    """``call(client)`` on an async client of ``url``: the async path, to compare with."""

    async def main() -> T:
        async with vr.Client.from_url(url) as client:
            return await call(client)

    return anyio.run(main)


def test_it_offloads_a_def_and_an_async_def_and_resolve_waits_for_the_typed_results(
    sc: vr.SyncClient, redis_server: RedisServer, name: str
) -> None:
    def build(tenant_id: int, total: float = 0.5) -> Report:
        return Report(tenant_id=tenant_id, total=total)

    async def build_async(tenant_id: int) -> Report:
        return Report(tenant_id=tenant_id, total=9.0)

    sync_fn = vr.offload(queue=name, kind="tests.sync_client_def")(build)
    async_fn = vr.offload(queue=name, kind="tests.sync_client_async")(build_async)
    first = sc.offload(sync_fn, 7, total=2.5)
    second = sc.offload(async_fn, tenant_id=8)
    jobs = [sc.queue(name).get(h.job_id) for h in (first, second)]
    assert [(j.kind, j.state) for j in jobs if j] == [
        ("tests.sync_client_def", vr.JobState.PENDING),
        ("tests.sync_client_async", vr.JobState.PENDING),
    ]

    async def work(client: vr.Client) -> None:
        worker: vr.Worker[Any] = vr.Worker(client.queue(name), handle_signals=False, poll_interval=0.2)
        with anyio.fail_after(30):
            await worker.register(sync_fn).register(async_fn).run(until_idle=True)

    worker = threading.Thread(target=on_async, args=(redis_server.url, work))
    worker.start()
    try:
        done = sc.resolve(first, timeout=30), sc.resolve(second, timeout=30)
    finally:
        worker.join()
    assert done == (
        vr.OffloadResult("completed", value=Report(tenant_id=7, total=2.5), job_id=first.job_id),
        vr.OffloadResult("completed", value=Report(tenant_id=8, total=9.0), job_id=second.job_id),
    )


def test_a_bad_argument_raises_the_async_paths_error_and_enqueues_nothing(
    sc: vr.SyncClient, redis_server: RedisServer, name: str
) -> None:
    def build(tenant_id: int) -> int:
        return tenant_id

    fn = vr.offload(queue=name, kind="tests.sync_client_bad")(build)
    with pytest.raises(ValidationError) as blocking:
        sc.offload(fn, tenant_id="seven")  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as awaited:
        on_async(redis_server.url, lambda client: fn.offload(client, tenant_id="seven"))  # type: ignore[arg-type]
    assert str(blocking.value) == str(awaited.value)
    with pytest.raises(TypeError, match="missing a required argument: 'tenant_id'"):
        sc.offload(fn)  # type: ignore[call-arg]
    assert sum(sc.queue(name).counts().values()) == 0


def test_a_parameter_named_fn_reaches_the_function(sc: vr.SyncClient, name: str) -> None:
    def twice(fn: int) -> int:
        return 2 * fn

    handle = sc.offload(vr.offload(queue=name, kind="tests.sync_client_fn")(twice), fn=21)
    job = sc.queue(name).get(handle.job_id)
    assert job is not None and job.payload == {"fn": 21}


def test_resolve_answers_as_vr_resolve_does_pending_on_timeout_and_not_found_for_an_unknown_key(
    sc: vr.SyncClient, redis_server: RedisServer, name: str
) -> None:
    def build(tenant_id: int) -> int:
        return tenant_id

    fn = vr.offload(queue=name, kind="tests.sync_client_wait")(build)
    handle = sc.offload(fn, 1)  # no worker runs it
    late = sc.resolve(handle, timeout=0.1)
    assert late == on_async(redis_server.url, lambda client: vr.resolve(client, handle, timeout=0.1))
    assert late == vr.OffloadResult("pending", job_id=handle.job_id)
    job = sc.queue(name).get(handle.job_id)
    assert job is not None and job.state == vr.JobState.PENDING  # nothing was cancelled
    with pytest.raises(vr.OffloadNotFound, match=f"queue {name!r}"):
        sc.resolve(fn.handle(f"{name}:{'A' * 32}"), timeout=0.1)
