"""@vr.offload: decoration checks, the pending snapshot, settling, resolve and its race."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import keys_matching
from tests.servers import RedisServer
from venturi_redis._producer import results as _results
from venturi_redis._producer.results import _resolve
from venturi_redis._store import calls
from venturi_redis._worker.offload import offload_handler

pytestmark = pytest.mark.anyio

SECRET = "password=hunter2 at db-7.internal"


class Report(BaseModel):
    tenant_id: int
    month: int
    total: float


# Each test uses its own queue (the `queue` fixture); these functions take the
# queue from the decorator, so the tests rebind them with `on(queue)`.


async def _build(tenant_id: int, month: int = 1) -> Report:
    if tenant_id < 0:
        raise vr.TaskError.permanent(SECRET)
    if tenant_id == 0:
        raise RuntimeError(SECRET)  # retryable, until the backstop
    return Report(tenant_id=tenant_id, month=month, total=tenant_id * 1.5)


def on(queue: vr.Queue, fn: Callable[..., Any] = _build, **options: Any) -> vr.OffloadFunction[Any, Any]:
    options.setdefault("kind", "tests.build_monthly")
    return vr.offload(queue=queue.name, **options)(fn)


def worker(queues: vr.Queue | list[vr.Queue], *fns: Any, **options: Any) -> vr.Worker[Any]:
    options.setdefault("handle_signals", False)
    options.setdefault("poll_interval", 0.2)
    options.setdefault("backoff", vr.Backoff.fibonacci(base=0.01, cap=0.02))
    w: vr.Worker[Any] = vr.Worker(queues, **options)
    return w.register(*fns)


async def run_until_idle(queues: vr.Queue | list[vr.Queue], *fns: Any, **options: Any) -> None:
    with anyio.fail_after(30):
        await worker(queues, *fns, **options).run(until_idle=True)


def token_of(handle: vr.OffloadHandle[Any]) -> str:
    return handle.key.rsplit(":", 1)[1]


# -- decoration ------------------------------------------------------------------------------------


class NotAModel:
    pass


def test_every_parameter_and_the_return_type_are_checked_at_decoration() -> None:
    async def bad_param(tenant_id: int, conn: NotAModel) -> int:
        return 1

    async def bad_return(tenant_id: int) -> NotAModel:
        return NotAModel()

    async def bad_callable(cb: Callable[[int], int]) -> int:
        return 1

    for fn, what in (
        (bad_param, "parameter 'conn'"),
        (bad_return, "the return value"),
        (bad_callable, "parameter 'cb'"),
    ):
        with pytest.raises(TypeError) as err:
            vr.offload(kind="k")(fn)
        assert what in str(err.value)
        assert fn.__qualname__ in str(err.value)
    with pytest.raises(TypeError, match="NotAModel"):
        vr.offload(kind="k")(bad_param)


def test_other_decoration_mistakes_are_type_errors() -> None:
    async def no_return(x: int):  # type: ignore[no-untyped-def]
        return x

    async def unannotated(x) -> int:  # type: ignore[no-untyped-def]
        return 1

    async def varargs(*xs: int) -> int:
        return 1

    async def collides(priority: int) -> int:
        return 1

    cases: list[tuple[Any, str]] = [
        (no_return, "return annotation"),
        (unannotated, "'x' has no type annotation"),
        (varargs, r"\*xs"),
        (collides, "'priority' collides"),
    ]
    for fn, match in cases:
        with pytest.raises(TypeError, match=match):
            vr.offload(kind="k")(fn)


async def test_kind_is_module_and_qualified_name_unless_given() -> None:
    async def build_monthly(tenant_id: int) -> int:
        return tenant_id

    derived = vr.offload(build_monthly)
    assert (
        derived.kind
        == f"{__name__}.test_kind_is_module_and_qualified_name_unless_given.<locals>.build_monthly"
    )
    assert derived.queue == "default"
    assert vr.offload(kind="reports.monthly", queue="reports")(build_monthly).kind == "reports.monthly"
    assert derived.task_type.kind() == derived.kind
    assert offload_handler(derived).kind() == derived.kind
    assert offload_handler(derived) is offload_handler(derived)  # one class per function
    assert derived.__name__ == "build_monthly"


async def test_calling_the_function_still_runs_it_in_process(queue: vr.Queue, client: vr.Client) -> None:
    fn = on(queue)
    assert await fn(2, month=5) == Report(tenant_id=2, month=5, total=3.0)
    with pytest.raises(vr.TaskError, match="hunter2"):
        await fn(-1)
    assert await keys_matching(client.redis, f"*{queue.name}*") == []  # nothing was enqueued


# -- offload: the job and its pending snapshot -----------------------------------------------------


async def test_offload_writes_the_job_and_a_pending_snapshot_together(
    client: vr.Client, queue: vr.Queue
) -> None:
    fn = on(queue)
    handle = await fn.offload(client, 3, month=4)
    assert handle.key.startswith(f"{queue.name}:")
    token = token_of(handle)
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", token)  # 192 random bits
    assert token not in repr(handle)  # the key is a capability: kept out of logs
    assert handle.result_type is Report
    info = await queue.get(handle.job_id)
    assert info is not None and info.state == vr.JobState.PENDING
    assert info.kind == "tests.build_monthly" and info.payload == {"tenant_id": 3, "month": 4}
    # the snapshot shares the queue's hash tag and says "pending"
    snap_key = queue.keys.offload(token)
    assert "{" + queue.name + "}" in snap_key
    snap = await client.redis.hgetall(snap_key)
    assert snap[b"status"] == b"pending" and snap[b"job_id"] == handle.job_id.encode()
    assert await client.redis.pttl(snap_key) == -1  # pending lives as long as the job
    raw = await client.redis.hgetall(queue.keys.job(handle.job_id))
    assert raw[b"offload"] == token.encode()
    res = await vr.read_result(client, handle)
    assert res == vr.OffloadResult("pending", job_id=handle.job_id)
    # every call gets its own key
    other = await fn.offload(client, 3, month=4)
    assert other.key != handle.key and other.job_id != handle.job_id


async def test_bad_arguments_write_nothing(client: vr.Client, queue: vr.Queue) -> None:
    fn = on(queue)
    with pytest.raises(ValueError, match="tenant_id"):
        await fn.offload(client, tenant_id="not a number")
    with pytest.raises(TypeError):
        await fn.offload(client, 1, 2, 3)
    assert await keys_matching(client.redis, f"*{queue.name}*") == []


# -- settling --------------------------------------------------------------------------------------


async def test_completion_settles_the_snapshot_with_the_typed_value(
    client: vr.Client, queue: vr.Queue
) -> None:
    fn = on(queue, retention=timedelta(hours=2))
    handle = await fn.offload(client, tenant_id=7, month=2)
    await run_until_idle(queue, fn)
    res = await vr.resolve(client, handle, timeout=5)
    assert res == vr.OffloadResult(
        "completed", value=Report(tenant_id=7, month=2, total=10.5), job_id=handle.job_id
    )
    assert isinstance(res.value, Report)
    assert await vr.read_result(client, handle) == res
    assert await vr.read_result_redacted(client, handle.key, Report) == res
    untyped = await vr.read_result(client, handle.key)
    assert untyped is not None and untyped.value == {"tenant_id": 7, "month": 2, "total": 10.5}
    # retention: the settled snapshot expires (set by the script, from the job's offload_ttl)
    ttl = await client.redis.pttl(queue.keys.offload(token_of(handle)))
    assert 0 < ttl <= 2 * 3600 * 1000
    info = await queue.get(handle.job_id)
    assert info is not None and info.result == {"tenant_id": 7, "month": 2, "total": 10.5}
    # a handle rebuilt from the key alone reads the same typed result
    assert await vr.read_result(client, fn.handle(handle.key)) == res


async def test_a_permanent_failure_keeps_the_raw_error_out_of_the_message(
    client: vr.Client, queue: vr.Queue
) -> None:
    fn = on(queue)
    handle = await fn.offload(client, tenant_id=-1)
    pubsub = client.redis.pubsub()
    await pubsub.subscribe(queue.keys.offload_channel(token_of(handle)))
    try:
        await run_until_idle(queue, fn)
        messages: list[bytes] = []
        with anyio.fail_after(5):
            while not messages:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if msg is not None:
                    messages.append(msg["data"])
    finally:
        await pubsub.aclose()
    assert json.loads(messages[0]) == {"status": "failed", "error": "terminal error"}
    assert b"hunter2" not in messages[0]
    res = await vr.resolve(client, handle, timeout=5)
    assert (res.status, res.error, res.value) == ("failed", SECRET, None)
    red = await vr.read_result_redacted(client, handle.key)
    assert red == vr.OffloadResult("failed", error="terminal error", job_id=handle.job_id)


async def test_the_retry_backstop_settles_a_failure(client: vr.Client, queue: vr.Queue) -> None:
    fn = on(queue, max_failures=2)
    handle = await fn.offload(client, tenant_id=0)
    await run_until_idle(queue, fn)
    info = await queue.get(handle.job_id)
    assert info is not None and info.state == vr.JobState.DEAD and info.failures == 2
    res = await vr.read_result(client, handle)
    assert res is not None and (res.status, res.error) == ("failed", SECRET)
    red = await vr.read_result_redacted(client, handle)
    assert red is not None and red.error == "terminal error"


async def test_retrying_a_dead_offload_job_makes_its_snapshot_pending_again(
    client: vr.Client, queue: vr.Queue
) -> None:
    failing = [True]

    async def flaky(tenant_id: int) -> Report:
        if failing[0]:
            raise vr.TaskError.permanent(SECRET)
        return Report(tenant_id=tenant_id, month=1, total=1.0)

    fn = on(queue, flaky)
    handle = await fn.offload(client, tenant_id=3)
    await run_until_idle(queue, fn)
    res = await vr.read_result(client, handle)
    assert res is not None and res.status == "failed"
    snapshot = queue.keys.offload(token_of(handle))
    assert await client.redis.pttl(snapshot) > 0  # a settled snapshot's retention
    assert await queue.retry(handle.job_id)
    # In the same step as the job: pending again, no outcome left, no expiry.
    assert await vr.read_result(client, handle) == vr.OffloadResult("pending", job_id=handle.job_id)
    raw = await client.redis.hgetall(snapshot)
    assert b"error" not in raw and b"finished_at" not in raw and raw[b"kind"] == b"tests.build_monthly"
    assert await client.redis.pttl(snapshot) == -1
    # A waiter now waits for the rerun instead of returning the old failure.
    failing[0] = False
    got: list[vr.OffloadResult[Report]] = []

    async def wait() -> None:
        got.append(await vr.resolve(client, handle, timeout=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await run_until_idle(queue, fn)
    assert got == [
        vr.OffloadResult("completed", value=Report(tenant_id=3, month=1, total=1.0), job_id=handle.job_id)
    ]
    # A dead job whose failed snapshot already expired gets its pending one back.
    failing[0] = True
    other = await fn.offload(client, tenant_id=4)
    await run_until_idle(queue, fn)
    await client.redis.delete(queue.keys.offload(token_of(other)))
    assert await queue.retry(other.job_id)
    assert await vr.read_result(client, other) == vr.OffloadResult("pending", job_id=other.job_id)


async def test_a_worker_without_the_function_settles_a_failure(client: vr.Client, queue: vr.Queue) -> None:
    fn = on(queue)

    async def something_else(x: int) -> int:
        return x

    handle = await fn.offload(client, tenant_id=1)
    await run_until_idle(queue, vr.offload(queue=queue.name, kind="tests.other")(something_else))
    res = await vr.read_result(client, handle)
    assert res is not None and res.status == "failed"
    assert res.error is not None and "no handler for kind 'tests.build_monthly'" in res.error


async def test_the_reclaim_backstop_settles_a_failure(url: str, queue_name: str) -> None:
    now = [1_000_000]
    async with vr.Client.from_url(url, clock=lambda: now[0]) as client:
        queue = client.queue(queue_name)
        fn = on(queue, max_failures=1)
        handle = await fn.offload(client, tenant_id=1)
        k = queue.keys
        # A worker claims the job and dies: nobody ever completes it.
        claim = calls.claim(
            k, client._now_arg(), count=1, worker="ghost", token_base="tok", default_lease_ms=1000
        )
        await client.sender.call(claim)
        now[0] += 5000
        reclaim = calls.reclaim(k, client._now_arg(), batch=10, max_failures="25")
        assert calls.reclaimed(await client.sender.call(reclaim)).dead == 1
        res = await vr.read_result(client, handle)
        assert res is not None and res.status == "failed"
        assert res.error is not None and res.error.startswith("lease expired")
        assert await client.redis.pttl(k.offload(token_of(handle))) > 0


async def test_a_wrong_return_value_is_a_failure_not_a_wrong_result(
    client: vr.Client, queue: vr.Queue
) -> None:
    async def liar(x: int) -> Report:
        return {"nope": x}  # type: ignore[return-value]

    fn = on(queue, liar, kind="tests.liar")
    handle = await fn.offload(client, 1)
    await run_until_idle(queue, fn)
    res = await vr.read_result(client, handle)
    assert res is not None and res.status == "failed"
    assert res.error is not None and "not its declared" in res.error


async def test_a_function_returning_none(client: vr.Client, queue: vr.Queue) -> None:
    seen: list[str] = []

    async def record(text: str) -> None:
        seen.append(text)

    fn = on(queue, record, kind="tests.record")
    handle = await fn.offload(client, "hello")
    await run_until_idle(queue, fn)
    assert await vr.resolve(client, handle, timeout=5) == vr.OffloadResult("completed", job_id=handle.job_id)
    assert seen == ["hello"]


# -- resolve ---------------------------------------------------------------------------------------


async def test_resolve_waits_for_a_worker_running_beside_it(client: vr.Client, queue: vr.Queue) -> None:
    fn = on(queue)
    handle = await fn.offload(client, tenant_id=2, month=9)
    w = worker(queue, fn)
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.run)
        with anyio.fail_after(10):
            res = await vr.resolve(client, handle, timeout=None)  # waits as long as it takes
        w.shutdown()
    assert res.status == "completed" and res.value == Report(tenant_id=2, month=9, total=3.0)


async def test_resolve_times_out_as_pending(client: vr.Client, queue: vr.Queue) -> None:
    handle = await on(queue).offload(client, tenant_id=2)
    res = await vr.resolve(client, handle, timeout=0.2)
    assert res == vr.OffloadResult("pending", job_id=handle.job_id)


@pytest.fixture
def subscription_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No quiet-slice re-read within a test's timeout: only the wake-up can end the wait."""
    monkeypatch.setattr(_results, "_WAIT_SLICE", 600.0)


@pytest.mark.usefixtures("subscription_only")
@pytest.mark.parametrize("stage", ["subscribed", "read"])
async def test_resolve_sees_a_completion_injected_between_its_steps(
    client: vr.Client, queue: vr.Queue, stage: str
) -> None:
    """The race, deliberately: the job settles right after subscribe, or right after the read.

    After "read", the snapshot said pending and the only way to learn of the
    completion is the wake-up published while resolve was already subscribed;
    a resolve that read before subscribing would wait out its timeout.
    """
    fn = on(queue)
    handle = await fn.offload(client, tenant_id=4)
    injected: list[str] = []

    async def hook(at: str) -> None:
        if at == stage:
            await run_until_idle(queue, fn)
            injected.append(at)

    with anyio.fail_after(20):
        res = await _resolve(client, handle, 10.0, hook)
    assert injected == [stage]
    assert res.status == "completed" and res.value == Report(tenant_id=4, month=1, total=6.0)


async def test_unknown_and_malformed_keys(client: vr.Client, queue: vr.Queue) -> None:
    fn = on(queue)
    unknown = fn.handle(f"{queue.name}:{'A' * 32}")
    assert await vr.read_result(client, unknown) is None
    assert await vr.read_result_redacted(client, unknown.key) is None
    with pytest.raises(vr.OffloadNotFound, match="never issued"):
        await vr.resolve(client, unknown, timeout=1)
    for bad in ("", "nocolon", f"{queue.name}:short", "bad name!:" + "A" * 32, f"{queue.name}:{'A' * 31}*"):
        with pytest.raises(vr.ConfigurationError):
            await vr.read_result(client, bad)


# -- worker classes --------------------------------------------------------------------------------


async def test_a_worker_runs_only_its_own_queues(client: vr.Client, queue_name: str) -> None:
    reports, default = client.queue(f"{queue_name}-reports"), client.queue(f"{queue_name}-default")
    fn = on(reports)
    handle = await fn.offload(client, tenant_id=5)
    # A worker for "default" alone, even with the function registered, never runs it.
    await run_until_idle(default, fn)
    assert (await vr.read_result(client, handle)) == vr.OffloadResult("pending", job_id=handle.job_id)
    await run_until_idle(reports, fn)
    res = await vr.read_result(client, handle)
    assert res is not None and res.status == "completed"


async def test_a_flooded_queue_does_not_starve_another(client: vr.Client, queue_name: str) -> None:
    """Each queue has its own slots: the one default job runs while reports are stuck.

    The report jobs wait for the default job to finish; if default had to wait
    for a free report slot, nothing would ever finish and fail_after would fire.
    """
    reports, default = client.queue(f"{queue_name}-reports"), client.queue(f"{queue_name}-default")
    done = anyio.Event()

    async def slow_report(n: int) -> int:
        await done.wait()
        return n

    async def urgent(n: int) -> int:
        done.set()
        return n

    slow = vr.offload(queue=reports.name, kind="tests.slow_report")(slow_report)
    fast = vr.offload(queue=default.name, kind="tests.urgent")(urgent)
    flood = [await slow.offload(client, i) for i in range(20)]
    one = await fast.offload(client, 1)
    await run_until_idle([reports, default], slow, fast, concurrency=2)
    assert (await vr.read_result(client, one)) == vr.OffloadResult("completed", value=1, job_id=one.job_id)
    for i, h in enumerate(flood):
        assert (await vr.read_result(client, h)) == vr.OffloadResult("completed", value=i, job_id=h.job_id)


@pytest.mark.usefixtures("subscription_only")
async def test_resolve_resubscribes_after_redis_restarts() -> None:
    """The server dies while resolve waits: it reconnects, reads back, and still sees the completion."""
    with RedisServer("--appendonly", "yes", "--appendfsync", "always") as server:
        async with vr.Client.from_url(server.url) as client:
            queue = client.queue("restarts")
            fn = on(queue)
            handle = await fn.offload(client, tenant_id=6)
            waiting = anyio.Event()
            results: list[vr.OffloadResult[Any]] = []

            async def hook(stage: str) -> None:
                if stage == "read":
                    waiting.set()

            async def resolver() -> None:
                results.append(await _resolve(client, handle, 30.0, hook))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(resolver)
                    await waiting.wait()  # subscribed, read "pending", now waiting
                    await anyio.to_thread.run_sync(server.restart)
                    async with vr.Client.from_url(server.url) as other:
                        # resolve subscribes again on the new server...
                        channel = other.queue("restarts").keys.offload_channel(token_of(handle))
                        while (await other.redis.pubsub_numsub(channel))[0][1] < 1:
                            await anyio.sleep(0.01)
                        # ...and then the job completes
                        await run_until_idle(other.queue("restarts"), fn)
    assert [(r.status, r.value) for r in results] == [("completed", Report(tenant_id=6, month=1, total=9.0))]
