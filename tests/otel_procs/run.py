"""``python -m tests.otel_procs.run producer|worker URL QUEUE``: enqueue or drain, instrumented,
then print every span this process recorded as one JSON line each (the producer first prints
the job ids, as a JSON line of its own)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import venturi_redis as vr
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob, Flaky, FlakyJob
from venturi_redis.otel import VenturiInstrumentor


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": ctx.trace_id,
        "span_id": ctx.span_id,
        "parent": span.parent.span_id if span.parent else None,
        "parent_trace": span.parent.trace_id if span.parent else None,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [e.name for e in span.events],
        "links": [link.context.span_id for link in span.links],
    }


async def main(mode: str, url: str, queue_name: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    VenturiInstrumentor().instrument(tracer_provider=provider)
    queue = vr.Client.from_url(url).queue(queue_name)
    try:
        if mode == "producer":
            ids = {
                "ok": await queue.enqueue(Echo(text="traced")),
                "flaky": await queue.enqueue(Flaky(fail_times=1)),
                "doomed": await queue.enqueue(Doomed()),
            }
            print(json.dumps(ids))
        else:
            worker = vr.Worker(
                queue,
                handle_signals=False,
                poll_interval=0.2,
                backoff=vr.Backoff.fibonacci(base=0.01, cap=0.05),
            )
            worker.register(EchoJob, FlakyJob, DoomedJob)
            await asyncio.wait_for(worker.run(until_idle=True), 30)
    finally:
        await queue.client.aclose()
        VenturiInstrumentor().uninstrument()
    for span in exporter.get_finished_spans():
        print(json.dumps(as_dict(span)))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
