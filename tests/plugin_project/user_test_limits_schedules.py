from datetime import timedelta
from typing import ClassVar

import pytest

import venturi_redis as vr
from venturi_redis.testing import drain

pytestmark = pytest.mark.anyio


class SyncAccount(vr.Task):
    KIND: ClassVar[str] = "sync-account"
    tenant: str

    def limit_key(self) -> str | None:
        return self.tenant  # the per-key limit counts per tenant


class SyncAccountJob(SyncAccount, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


class Digest(vr.Task):
    KIND: ClassVar[str] = "digest"


class DigestJob(Digest, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result="digest sent")


async def test_each_tenant_syncs_at_most_once_a_minute(venturi_queue):
    for tenant in ["acme", "acme", "acme", "globex"]:
        await venturi_queue.enqueue(SyncAccount(tenant=tenant))
    once_a_minute = vr.Limit("sync-account", rate=vr.Rate(1, timedelta(minutes=1)), per_key=True)

    report = await drain(venturi_queue, SyncAccountJob, limits=[once_a_minute])

    assert (report.runs, len(report.completed)) == (4, 4)
    assert report.advanced_ms == 2 * 60_000  # acme's second and third sync each waited a minute


async def test_the_hourly_digest_fires_when_the_clock_gets_there(venturi_clock, venturi_queue):
    hourly = vr.Schedule("digest", Digest(), every=timedelta(hours=1))

    report = await drain(venturi_queue, DigestJob, schedules=[hourly])
    assert report.runs == 0  # declared; its first fire time is an hour away

    venturi_clock.advance(timedelta(hours=1))
    report = await drain(venturi_queue, DigestJob, schedules=[hourly])
    assert [job.schedule_id for job in report.completed] == ["digest"]
