"""Prometheus metrics: counters from the worker's observer, gauges from queue stats, lazy import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import Field

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob

pytestmark = pytest.mark.anyio


async def test_counters_and_histogram_follow_the_runs(queue: vr.Queue) -> None:
    m = vr.PrometheusMetrics()
    await queue.enqueue_many([Echo(text="a"), Echo(text="b")])
    await queue.enqueue(Doomed())
    await queue.enqueue(Flaky(fail_times=2))
    await queue.enqueue(Echo(text="x"), priority="low")

    # a KIND no handler of this worker knows is labelled "unregistered"
    class Stray(vr.Task):
        KIND: ClassVar[str] = "stray-kind-from-elsewhere"

    await queue.enqueue(Stray())
    await drain(queue, EchoJob, DoomedJob, FlakyJob, observer=m)
    n = queue.name

    def value(name: str, **labels: str) -> float:
        v = m.registry.get_sample_value(name, {"queue": n, **labels})
        return 0.0 if v is None else v

    assert value("venturi_jobs_completed_total", kind="echo") == 3
    assert value("venturi_jobs_completed_total", kind="flaky") == 1
    assert value("venturi_jobs_failed_total", kind="flaky") == 2
    assert value("venturi_jobs_dead_total", kind="doomed") == 1
    assert value("venturi_jobs_dead_total", kind="unregistered") == 1
    assert value("venturi_jobs_claimed_total", kind="flaky") == 3
    assert value("venturi_jobs_finished_total", kind="flaky", outcome="failed") == 2
    assert value("venturi_job_run_seconds_count", kind="echo", outcome="completed") == 3
    # Time from eligible to claimed, per claim: the flaky job's three included (issue 30).
    assert value("venturi_job_pickup_seconds_count", kind="flaky") == 3
    assert value("venturi_job_pickup_seconds_count", kind="echo") == 3
    assert 0 <= value("venturi_job_pickup_seconds_sum", kind="echo") < 60
    assert (
        m.registry.get_sample_value(
            "venturi_jobs_claimed_total", {"queue": n, "kind": "stray-kind-from-elsewhere"}
        )
        is None
    )


class Signed(vr.Task):
    KIND: ClassVar[str] = "signed"
    key: str = Field(json_schema_extra={"sensitive": True})


class SignedJob(Signed, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        raise vr.TaskError.permanent(f"key {self.key} revoked")


async def test_metrics_carry_no_job_data(queue: vr.Queue) -> None:
    """The redaction rule holds for the metrics by construction: no payload, note or
    result value is ever a label or a sample (docs/operations.md)."""
    m = vr.PrometheusMetrics()
    secret = "key-0f-the-kingdom"
    await queue.enqueue(Signed(key=secret))
    await queue.enqueue(Echo(text=secret))
    await drain(queue, SignedJob, EchoJob, observer=m)
    await m.refresh([queue])
    page = m.render()
    assert b"venturi_jobs_dead_total" in page and secret.encode() not in page


async def test_gauges_read_queue_stats(queue: vr.Queue) -> None:
    m = vr.PrometheusMetrics()
    await queue.enqueue(Echo(text="a"), priority="high")
    await queue.enqueue(Echo(text="b"), delay=3600)
    await queue.pause()
    await m.refresh([queue])
    n = queue.name
    assert m.registry.get_sample_value("venturi_queue_eligible", {"queue": n, "priority": "high"}) == 1
    assert m.registry.get_sample_value("venturi_queue_jobs", {"queue": n, "state": "delayed"}) == 1
    assert m.registry.get_sample_value("venturi_queue_paused", {"queue": n}) == 1
    lag = m.registry.get_sample_value("venturi_queue_lag_seconds", {"queue": n})
    assert lag is not None and lag >= 0
    assert b"venturi_queue_eligible" in m.render()


def test_no_metrics_dependency_unless_asked() -> None:
    code = textwrap.dedent(
        """
        import sys
        import anyio
        import venturi_redis as vr
        import venturi_redis.cli, venturi_redis.cli.commands  # the CLI itself, without --metrics-port
        from tests.tasks import Echo, EchoJob

        async def main():
            q = vr.Client.from_url("memory://nometrics").queue("q")
            await q.enqueue(Echo(text="x"))
            w = vr.Worker(q, handle_signals=False).register(EchoJob)
            await w.run(until_idle=True)
            await q.client.aclose()

        anyio.run(main)
        wanted = ("prometheus_client", "venturi_redis._worker.metrics")
        print([m for m in sys.modules if m.startswith(wanted)])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_lease_expiries_are_counted(queue: vr.Queue) -> None:
    """A run whose worker vanished: the reclaim that takes it back counts it (issue 30)."""
    m = vr.PrometheusMetrics()
    await queue.enqueue(Echo(text="orphan"))
    gone = make_worker(queue, EchoJob, lease=0.001)
    await gone._runners[0].claim(1)  # claimed, never run: its worker "died"
    await anyio.sleep(0.05)
    await drain(queue, EchoJob, observer=m)
    v = m.registry.get_sample_value(
        "venturi_leases_expired_total", {"queue": queue.name, "outcome": "requeued"}
    )
    assert v == 1
