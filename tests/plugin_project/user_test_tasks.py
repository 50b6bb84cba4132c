"""A user's test file: it imports pytest, the plugin's drain and its own tasks, nothing else.

tests/test_testing_plugin.py copies it into a fresh project as test_tasks.py
and runs pytest there, as a user would.
"""

import pytest
from tasks import Approve, ApproveJob, Charge, ChargeJob, Refresh, RefreshJob, Report, ReportJob

from venturi_redis.testing import drain

pytestmark = pytest.mark.anyio


async def test_a_charge_retries_then_completes(venturi_queue):
    job_id = await venturi_queue.enqueue(Charge(order_id=7))

    report = await drain(venturi_queue, ChargeJob)

    job = report.job(job_id)
    assert (job.state.value, job.note) == ("completed", "charged order 7")
    assert (job.failures, report.runs) == (3, 4)  # three timeouts, then the charge
    assert report.advanced_ms > 0  # the backoff waits were skipped, not slept


async def test_an_unknown_order_dies(venturi_queue):
    job_id = await venturi_queue.enqueue(Charge(order_id=-1))

    report = await drain(venturi_queue, ChargeJob)

    assert [j.id for j in report.dead] == [job_id]
    assert report.dead[0].note == "order -1 does not exist"


async def test_a_report_pauses_between_batches(venturi_queue):
    job_id = await venturi_queue.enqueue(Report(rows=250))

    report = await drain(venturi_queue, ReportJob)

    job = report.job(job_id)
    assert (job.state.value, job.result, job.run_count) == ("completed", 250, 3)
    assert report.advanced_ms >= 2 * 3600 * 1000  # two pauses of an hour each
    events = [e.event for e in await venturi_queue.journal(job_id)]
    assert events.count("paused") == 2


async def test_refreshes_of_one_feed_merge(venturi_queue):
    first = await venturi_queue.enqueue(Refresh(feed="news", urls=["a"]), delay=300)  # five minutes
    second = await venturi_queue.enqueue(Refresh(feed="news", urls=["b"]))
    assert second == first  # merged into the waiting job

    report = await drain(venturi_queue, RefreshJob)

    assert report.runs == 1
    assert report.job(first).result == ["a", "b"]


async def test_an_approval_waits_for_a_person(venturi_queue):
    job_id = await venturi_queue.enqueue(Approve(document=3))

    report = await drain(venturi_queue, ApproveJob)
    assert report.notes() == {job_id: "document 3 waits for approval"}
    assert report.suspended[0].state.value == "suspended"

    await venturi_queue.resume(job_id, "carol")
    report = await drain(venturi_queue, ApproveJob)
    assert report.job(job_id).note == "approved by carol"


async def test_a_payload_that_cannot_be_stored_fails_at_enqueue(venturi_queue):
    # No eager mode: the payload goes through the real codec, so this fails
    # in the test as it would in production.
    with pytest.raises(ValueError, match="cannot encode Refresh"):  # a vr.PayloadError
        await venturi_queue.enqueue(Refresh.model_construct(feed="x", urls=[object()]))
