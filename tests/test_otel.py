"""OpenTelemetry (issue 30): a PRODUCER span per enqueue, a CONSUMER span per run parented to it.

In one process on every backend, and across two processes (a producer and a
worker, each with the SDK's in-memory exporter) on a real Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pydantic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import Field

import venturi_redis as vr
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Doomed, DoomedJob, Flaky, FlakyJob
from venturi_redis import otel
from venturi_redis._model import tracing
from venturi_redis.otel import VenturiInstrumentor

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
PYTHON = (
    str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
)


class Nested(vr.Task):
    KIND: ClassVar[str] = "nested"


class NestedJob(Nested, vr.Handler[Any]):
    provider: ClassVar[TracerProvider | None] = None

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        assert NestedJob.provider is not None
        with NestedJob.provider.get_tracer("app").start_as_current_span("handler work"):
            return vr.Outcome.completed()


class Slow(vr.Task):
    KIND: ClassVar[str] = "slow"

    def timeout(self) -> float | None:
        return 0.05


class SlowJob(Slow, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(5)
        return vr.Outcome.completed()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    NestedJob.provider = provider
    VenturiInstrumentor().instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        VenturiInstrumentor().uninstrument()
        NestedJob.provider = None
    assert tracing.TRACE is None and tracing.RUN_SPAN is None


async def test_runs_are_children_of_their_enqueue(queue: vr.Queue, exporter: InMemorySpanExporter) -> None:
    nested = await queue.enqueue(Nested())
    flaky = await queue.enqueue(Flaky(fail_times=1))
    doomed = await queue.enqueue(Doomed())
    await drain(queue, NestedJob, FlakyJob, DoomedJob)
    spans = exporter.get_finished_spans()
    sends = {s.attributes["messaging.message.id"]: s for s in spans if s.kind == SpanKind.PRODUCER}  # type: ignore[index]
    runs: dict[str, list[Any]] = {}
    for s in spans:
        if s.kind == SpanKind.CONSUMER:
            runs.setdefault(str(s.attributes["messaging.message.id"]), []).append(s)  # type: ignore[index]
    assert set(sends) == set(runs) == {nested, flaky, doomed}
    for job_id, send in sends.items():
        assert send.name == f"send {queue.name}"
        assert send.attributes["messaging.destination.name"] == queue.name  # type: ignore[index]
        assert send.attributes["messaging.operation.type"] == "send"  # type: ignore[index]
        for run in runs[job_id]:
            assert run.name == f"process {queue.name}"
            assert run.context.trace_id == send.context.trace_id
            assert run.parent is not None and run.parent.span_id == send.context.span_id
            assert run.attributes["messaging.system"] == "redis"  # type: ignore[index]
    # A retry's run is a new span in the same trace; the failed one records the error.
    first, second = sorted(runs[flaky], key=lambda s: s.attributes["venturi.run"])  # type: ignore[index]
    assert (first.attributes["venturi.run"], second.attributes["venturi.run"]) == (1, 2)  # type: ignore[index]
    assert first.status.status_code == StatusCode.ERROR and [e.name for e in first.events] == ["exception"]
    assert second.status.status_code != StatusCode.ERROR
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert not first.links
    (dead,) = runs[doomed]
    assert dead.status.status_code == StatusCode.ERROR and dead.attributes["venturi.kind"] == "doomed"  # type: ignore[index]
    # The handler's own span nests under its run.
    (work,) = [s for s in spans if s.name == "handler work"]
    (run,) = runs[nested]
    assert work.parent is not None and work.parent.span_id == run.context.span_id


async def test_a_workflow_job_runs_in_its_enqueue_trace(
    queue: vr.Queue, exporter: InMemorySpanExporter
) -> None:
    first = await queue.enqueue(Nested())
    then = await queue.enqueue(Nested(), after=[first])
    await drain(queue, NestedJob)
    spans = exporter.get_finished_spans()
    send = {s.attributes["messaging.message.id"]: s for s in spans if s.kind == SpanKind.PRODUCER}  # type: ignore[index]
    (run,) = [
        s for s in spans if s.kind == SpanKind.CONSUMER and s.attributes["messaging.message.id"] == then
    ]  # type: ignore[index]
    assert run.parent is not None and run.parent.span_id == send[then].context.span_id


async def test_a_run_cut_by_its_timeout_is_an_error(queue: vr.Queue, exporter: InMemorySpanExporter) -> None:
    await queue.enqueue(Slow(), max_failures=1)
    await drain(queue, SlowJob)
    (run,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert run.status.status_code == StatusCode.ERROR and run.status.description == "timed out after 0.05 s"


class Swallowing(Slow, vr.Handler[Any]):
    KIND: ClassVar[str] = "swallowing"

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        try:
            await anyio.sleep(5)
        except anyio.get_cancelled_exc_class():
            pass
        return vr.Outcome.completed()


async def test_a_run_that_swallows_its_timeout_is_an_error_too(
    queue: vr.Queue, exporter: InMemorySpanExporter
) -> None:
    job_id = await queue.enqueue(Swallowing(), max_failures=1)
    await drain(queue, Swallowing)
    (run,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert run.status.status_code == StatusCode.ERROR and run.status.description == "timed out after 0.05 s"
    assert (await queue.get(job_id)).state == vr.JobState.DEAD  # type: ignore[union-attr]


CARD = "4242424242424242"


class CardCarry(pydantic.BaseModel):
    pin: str = Field("", json_schema_extra={"sensitive": True})


class Charge(vr.Task):
    KIND: ClassVar[str] = "charge"
    card: str = Field(json_schema_extra={"sensitive": True})
    permanent: bool = False


class ChargeJob(Charge, vr.Handler[CardCarry]):
    async def handle(self, ctx: vr.Context[CardCarry], state: Any) -> vr.Outcome:
        ctx.carry = CardCarry(pin="9876-secret")
        if self.permanent:
            raise vr.TaskError.permanent(f"card {self.card} refused, pin {ctx.carry.pin}")
        try:
            raise KeyError(f"no such card {self.card}")
        except KeyError as cause:
            raise ValueError(f"card {self.card} declined (pin {ctx.carry.pin})") from cause


async def test_sensitive_values_never_reach_a_span(queue: vr.Queue, exporter: InMemorySpanExporter) -> None:
    """Issue 38, item 4: the span's status, exception.message and exception.stacktrace
    are masked as the stored note is (the task's and the carry's sensitive fields)."""
    failed = await queue.enqueue(Charge(card=CARD), max_failures=1)
    refused = await queue.enqueue(Charge(card=CARD, permanent=True))
    await drain(queue, ChargeJob)
    assert (await queue.get(failed)).note == "card *** declined (pin ***)"  # type: ignore[union-attr]
    runs = {
        s.attributes["messaging.message.id"]: s  # type: ignore[index]
        for s in exporter.get_finished_spans()
        if s.kind == SpanKind.CONSUMER
    }
    for job_id, said in ((failed, "card *** declined (pin ***)"), (refused, "card *** refused, pin ***")):
        run = runs[job_id]
        assert run.status.status_code == StatusCode.ERROR
        assert run.status.description is not None and run.status.description.endswith(said)
        (event,) = run.events
        attributes = dict(event.attributes or {})
        assert event.name == "exception" and attributes["exception.message"] == said
        assert said in str(attributes["exception.stacktrace"])
        everything = repr((run.status.description, attributes, run.attributes))
        assert CARD not in everything and "9876-secret" not in everything
    stack = str(dict(runs[failed].events[0].attributes or {})["exception.stacktrace"])
    assert "no such card ***" in stack and "ValueError" in stack  # the chained cause too


async def test_not_instrumented_nothing_is_stored(queue: vr.Queue) -> None:
    assert tracing.TRACE is None and tracing.RUN_SPAN is None
    jid = await queue.enqueue(Nested())
    assert await queue.client.redis.hget(queue.keys.job(jid), "trace") is None


def test_the_package_does_not_import_the_instrumentation() -> None:
    """Neither venturi_redis.otel nor opentelemetry-instrumentation, producer or worker side.

    (redis-py >= 8 imports opentelemetry's API itself, when it is installed,
    for its own metrics: that is redis-py's, not ours.)
    """
    code = (
        "import sys, venturi_redis as vr; vr.Worker; "
        "print([m for m in sys.modules "
        "if m == 'venturi_redis.otel' or m.startswith('opentelemetry.instrumentation')])"
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _spans(mode: str, url: str, queue: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [PYTHON, "-m", "tests.otel_procs.run", mode, url, queue],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_across_two_processes(redis_server: RedisServer) -> None:
    queue = f"otel-{uuid.uuid4().hex[:10]}"
    ids, *sends = _spans("producer", redis_server.url, queue)
    runs = _spans("worker", redis_server.url, queue)
    send_of = {s["attributes"]["messaging.message.id"]: s for s in sends}
    assert set(send_of) == set(ids.values()) and all(s["kind"] == "PRODUCER" for s in sends)
    by_job: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        assert r["kind"] == "CONSUMER"
        by_job.setdefault(r["attributes"]["messaging.message.id"], []).append(r)
    for job_id, job_runs in by_job.items():
        send = send_of[job_id]
        for r in job_runs:
            assert r["trace_id"] == send["trace_id"] == r["parent_trace"]
            assert r["parent"] == send["span_id"]
    statuses = {name: [r["status"] for r in by_job[jid]] for name, jid in ids.items()}
    assert statuses["ok"] == ["UNSET"]
    assert sorted(statuses["flaky"]) == ["ERROR", "UNSET"]  # the failed run, then its retry: one trace
    failed, retried = sorted(by_job[ids["flaky"]], key=lambda r: r["attributes"]["venturi.run"])
    assert retried["links"] == [failed["span_id"]] and failed["links"] == []
    assert statuses["doomed"] == ["ERROR"]


async def test_a_span_whose_secrets_cannot_be_known_carries_the_exceptions_type_alone(
    queue: vr.Queue, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The error path decodes the payload again to learn the sensitive values; should
    # that fail, nothing can be masked, so nothing of the message is written.
    def undecodable(*args: Any) -> Any:
        raise ValueError("the payload does not decode now")

    failed = await queue.enqueue(Charge(card=CARD), max_failures=1)
    monkeypatch.setattr(otel, "unpack_model", undecodable)
    await drain(queue, ChargeJob)
    (run,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert run.attributes is not None and run.attributes["messaging.message.id"] == failed
    assert run.status.status_code == StatusCode.ERROR and run.status.description == "ValueError"
    (event,) = run.events
    assert dict(event.attributes or {}) == {"exception.type": "ValueError", "exception.escaped": "False"}
    assert CARD not in repr((run.status.description, run.events, run.attributes))
