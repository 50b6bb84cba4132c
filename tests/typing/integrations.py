"""The dashboard mounted in an app, OpenTelemetry, metrics (docs/dashboard.md, observability.md)."""

from typing import ClassVar, assert_type

from starlette.applications import Starlette

import venturi_redis as vr
from venturi_redis.dashboard import create_app
from venturi_redis.otel import VenturiInstrumentor


class SendEmail(vr.Task):
    KIND: ClassVar[str] = "send_email"
    to: str


def mounted() -> None:
    client = vr.Client.from_url("redis://127.0.0.1:6379/0")
    dashboard = create_app(client, tasks=[SendEmail], allowed_hosts=["ops.example.com"], read_only=True)
    assert_type(dashboard, Starlette)
    VenturiInstrumentor().instrument()
    metrics = vr.PrometheusMetrics()
    vr.Worker(client.queue("emails"), observer=metrics)
