"""The producer side as README.md, docs/operations.md, docs/workflows.md and docs/schedules.md show it."""

import os
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, assert_type

from pydantic import BaseModel

import venturi_redis as vr


class Progress(BaseModel):
    pages: int = 0


class Crawl(vr.Task[Progress]):
    KIND: ClassVar[str] = "crawl"
    site: str


class Report(BaseModel):
    tenant_id: int
    total_cents: int


@vr.offload(queue="reports", kind="reports.build_monthly")
async def build_monthly(tenant_id: int, month: int) -> Report:
    return Report(tenant_id=tenant_id, total_cents=month)


@vr.offload(queue="reports", kind="reports.build_yearly")
def build_yearly(tenant_id: int, year: int) -> Report:
    return Report(tenant_id=tenant_id, total_cents=year)


async def producing() -> None:
    key = vr.Encryption.new_key()
    assert_type(key, bytes)
    client = vr.Client.from_url(
        os.environ.get("REDIS_URL"),
        namespace="shop",
        max_connections=10,
        encryption=vr.Encryption(keys=[key]),
        durable=vr.Durability(replicas=1, timeout=1.0),
    )
    assert_type(client, vr.Client)
    assert_type(vr.Client.from_url("redis+cluster://10.0.0.1:7000", cluster=True), vr.Client)
    assert_type(vr.Queue.from_url("memory://", name="emails", max_payload_bytes=1 << 20), vr.Queue)
    queue = client.queue("crawls")
    assert_type(queue.name, str)

    job_id = await queue.enqueue(Crawl(site="a"), delay=60, priority="high", lease=30.0, max_failures=None)
    assert_type(job_id, str)
    at = await queue.enqueue(
        Crawl(site="b"), at=datetime.now(UTC) + timedelta(hours=1), carry=Progress(pages=2)
    )
    assert_type(at, str)
    after = await queue.enqueue(Crawl(site="c"), after=[job_id, at], expires=timedelta(minutes=10))
    assert_type(after, str)
    ids = await queue.enqueue_many(
        [Crawl(site=s) for s in "xyz"], priority=vr.Priority.LOW, delay=timedelta(1)
    )
    assert_type(ids, list[str])

    flow = await queue.enqueue_flow(Crawl(site="parent"), [Crawl(site="child")])
    assert_type(flow, vr.Flow)
    assert_type(flow.parent_id, str)
    assert_type(flow.children_ids, tuple[str, ...])
    assert_type(await queue.enqueue_flow(Crawl(site="root"), [flow, Crawl(site="leaf")]), vr.Flow)

    done = await queue.wait(job_id, timeout=30)
    assert_type(done, vr.JobInfo)
    assert_type(done.state, vr.JobState)
    assert_type(done.dead_reason, vr.DeadReason | None)
    assert_type(done.note, str | None)
    assert_type(done.finished_at, datetime | None)
    assert_type(done.waiting_on, tuple[str, ...])
    assert_type(Crawl.model_validate(done.payload), Crawl)
    assert_type(await queue.get(job_id), vr.JobInfo | None)
    assert_type(await queue.journal(job_id), list[vr.JournalEntry])
    assert_type(await queue.counts(), dict[str, int])
    assert_type(await queue.is_drained(), bool)
    assert_type(await queue.stats(), vr.QueueStats)
    assert_type(await queue.workers(), list[vr.WorkerInfo])
    assert_type(await queue.list_jobs(state="dead", kind="crawl"), list[vr.JobInfo])
    assert_type(await queue.resume(job_id, {"approved": True}), int)
    assert_type(await queue.update(job_id, task=Crawl(site="d"), priority="high", delay=0), bool)
    assert_type(await queue.cancel(job_id), str)
    assert_type(await queue.retry(job_id), bool)
    assert_type(await queue.retry_dead(error_type="ConnectionError", since=timedelta(hours=2)), list[str])
    assert_type(await queue.cancel_jobs("pending", kind="newsletter"), list[str])
    assert_type(await queue.purge("dead", kind="legacy", until=timedelta(days=7)), int)
    assert_type(await queue.history(since=timedelta(hours=1)), list[vr.HistoryPoint])
    async for event in queue.events(kinds=["crawl"]):
        assert_type(event, vr.QueueEvent)
        assert_type(event.event, str)
        break

    await queue.set_limit("crawl", concurrency=20, rate=vr.Rate(100, 1))
    for info in await queue.limits():
        assert_type(info, vr.LimitInfo)
        for load in info.keys:
            assert_type(load, vr.LimitKeyLoad)

    nightly = await queue.schedule("nightly", Crawl(site="n"), cron="30 2 * * *", tz="Europe/Berlin")
    assert_type(nightly, vr.ScheduleInfo)
    assert_type(nightly.next_at, datetime | None)
    assert_type(await queue.schedules(), list[vr.ScheduleInfo])
    assert_type(await queue.trigger_schedule("nightly"), str | None)
    assert_type(vr.Schedule("pulse", Crawl(site="p"), every=timedelta(seconds=1)), vr.Schedule)

    orders = vr.ShardedQueue(client, "orders", partitions=6)
    assert_type(await orders.enqueue(Crawl(site="s")), str)
    assert_type(await orders.enqueue_many([Crawl(site="s")]), list[str])
    assert_type(await orders.get(job_id), vr.JobInfo | None)
    assert_type(orders.partition_for(Crawl(site="s")), vr.Queue)

    # @vr.offload: the function keeps its signature; results are typed by its return annotation.
    assert_type(await build_monthly(1, 5), Report)
    handle = await build_monthly.offload(client, tenant_id=1, month=5)
    assert_type(handle, vr.OffloadHandle[Report])
    assert_type(build_monthly.handle(handle.key), vr.OffloadHandle[Report])
    assert_type(build_monthly.task(1, 5), vr.Task[Any])
    res = await vr.resolve(client, handle, timeout=30.0)
    assert_type(res, vr.OffloadResult[Report])
    assert_type(res.value, Report | None)
    assert_type(await vr.read_result(client, handle), vr.OffloadResult[Report] | None)
    assert_type(await vr.read_result_redacted(client, handle.key, Report), vr.OffloadResult[Report] | None)
    assert_type(await vr.read_result(client, handle.key), vr.OffloadResult[Any] | None)

    # A plain def: its direct call stays sync; offloading it is the same as an async one's.
    yearly_fn: vr.OffloadFunction[..., Report] = build_yearly  # a SyncOffloadFunction is one
    assert_type(build_yearly(1, 2026), Report)
    assert_type(build_yearly.__wrapped__(1, 2026), Report)
    assert_type(await build_monthly.__wrapped__(1, 5), Report)
    yearly = await build_yearly.offload(client, tenant_id=1, year=2026)
    assert_type(yearly, vr.OffloadHandle[Report])
    assert_type(build_yearly.handle(yearly.key), vr.OffloadHandle[Report])
    assert_type(await vr.resolve(client, yearly, timeout=30.0), vr.OffloadResult[Report])
    assert_type(yearly_fn.kind, str)

    await client.aclose()


def blocking(task: Crawl) -> None:
    """Django and Flask enqueue through vr.SyncClient (docs/operations.md)."""
    with vr.SyncClient("memory://", namespace="shop", max_connections=4) as venturi:
        emails = venturi.queue("emails")
        assert_type(emails, vr.SyncQueue)
        job_id = emails.enqueue(task, delay=5)
        assert_type(job_id, str)
        assert_type(emails.enqueue_many([task]), list[str])
        assert_type(emails.get(job_id), vr.JobInfo | None)
        assert_type(emails.wait(job_id, timeout=10), vr.JobInfo)
        assert_type(emails.counts(), dict[str, int])
        assert_type(venturi.client, vr.Client)
        # Offload from a view: checked against the function's parameters, either form.
        handle = venturi.offload(build_monthly, tenant_id=1, month=5)
        assert_type(handle, vr.OffloadHandle[Report])
        assert_type(venturi.offload(build_yearly, 1, year=2026), vr.OffloadHandle[Report])
        assert_type(venturi.resolve(handle, timeout=10), vr.OffloadResult[Report])


# -- what a checker must refuse ------------------------------------------------


async def refused(client: vr.Client, queue: vr.Queue, task: Crawl) -> None:
    vr.Client.from_url("redis://", max_conections=10)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    vr.Client.from_url("redis://", namespace=3)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    vr.Queue.from_url("redis://", encryption=b"key")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    vr.SyncClient("redis://", clock=123)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await queue.enqueue(task, dealy=5)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    await queue.enqueue(task, at="tomorrow")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await queue.enqueue(Report(tenant_id=1, total_cents=2))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await queue.enqueue_many([task], after=["x"])  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    info = await queue.wait("job")
    info.state = "done"  # type: ignore[misc, assignment]  # pyright: ignore[reportAttributeAccessIssue]
    await build_monthly.offload(client, tenant_id="1", month=5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await build_monthly(1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    await build_yearly(1, 2026)  # type: ignore[misc]  # pyright: ignore[reportGeneralTypeIssues]
    await build_yearly.offload(client, tenant_id="1", year=2026)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    sync_client = vr.SyncClient("memory://")
    sync_client.offload(build_monthly, tenant_id="1", month=5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    sync_client.offload(build_yearly, 1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    sync_client.resolve(sync_client.offload(build_yearly, 1, 2026))  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    handle = await build_monthly.offload(client, 1, 5)
    res = await vr.resolve(client, handle, timeout=1)
    print(res.value.total_cents)  # type: ignore[union-attr]  # pyright: ignore[reportOptionalMemberAccess]
