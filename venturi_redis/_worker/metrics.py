"""Prometheus metrics for workers (``venturi worker --metrics-port``).

``prometheus_client`` is imported only when ``PrometheusMetrics`` is built:
a producer, or a worker without metrics, never loads it.

Exposed series (``queue`` and ``kind`` labels; a KIND no handler of the
worker is registered for is reported as ``unregistered``)::

    venturi_jobs_claimed_total{queue,kind}
    venturi_jobs_completed_total{queue,kind}
    venturi_jobs_failed_total{queue,kind}        retryable failures
    venturi_jobs_dead_total{queue,kind}
    venturi_jobs_finished_total{queue,kind,outcome}   every outcome, paused and cancelled included
    venturi_job_run_seconds{queue,kind,outcome}  histogram of run durations
    venturi_job_pickup_seconds{queue,kind}       histogram: from eligible to claimed
    venturi_leases_expired_total{queue,outcome}  runs whose lease expired (worker presumed
                                                 dead), taken back by this worker's reclaim:
                                                 outcome requeued or dead
    venturi_event_loop_blocked_seconds           histogram: blocks of the worker's event loop at
                                                 least Worker(blocked_loop_warning=...) long
    venturi_queue_jobs{queue,state}              depth: eligible, delayed, retrying, running, ...
    venturi_queue_eligible{queue,priority}       eligible now, per priority
    venturi_queue_lag_seconds{queue}             age of the oldest eligible job
    venturi_queue_paused{queue}                  1 while claims are paused
    venturi_queue_trim_lag_seconds{queue}        how long the oldest finished job is past its retention
    venturi_queue_over_retention{queue}          finished jobs past their count bound, not yet trimmed

``venturi_queue_eligible`` and ``venturi_queue_lag_seconds`` are the inputs an
autoscaler (KEDA's Prometheus scaler) wants; see docs/operations.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._producer.many import stats_of

if TYPE_CHECKING:
    from .._producer.client import Queue
    from .._producer.reads import QueueStats

log = logging.getLogger("venturi_redis.metrics")

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class WorkerObserver(Protocol):
    """What a Worker reports as it runs (``Worker(observer=...)``)."""

    def job_claimed(self, queue: str, kind: str) -> None:
        """A job of ``kind`` was claimed from ``queue``."""

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        """A run ended with ``outcome`` (completed, failed, dead, paused, suspended,
        released, cancelled) after ``seconds``; only transitions Redis accepted count."""

    # Optional, called when the observer has them (PrometheusMetrics does):
    #   job_waited(queue, kind, seconds): a claimed job had been eligible for ``seconds``.
    #   leases_expired(queue, requeued, dead): this worker's reclaim took back expired leases.
    #   loop_blocked(seconds): the event loop ran again after a block the worker warned of.


class PrometheusMetrics:
    """Counters, a run-duration histogram and queue gauges in one registry.

    Args:
        registry: A ``prometheus_client.CollectorRegistry``; a fresh one by
            default (so several instances, e.g. in tests, never collide).
    """

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as pc
        except ImportError:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "metrics need prometheus_client: pip install 'venturi-redis[metrics]'"
            ) from None
        self._pc = pc
        self.registry = registry if registry is not None else pc.CollectorRegistry()
        r = self.registry
        labels = ["queue", "kind"]
        self.claimed = pc.Counter("venturi_jobs_claimed", "Jobs claimed", labels, registry=r)
        self.completed = pc.Counter("venturi_jobs_completed", "Jobs completed", labels, registry=r)
        self.failed = pc.Counter("venturi_jobs_failed", "Retryable failed runs", labels, registry=r)
        self.dead = pc.Counter("venturi_jobs_dead", "Jobs that went to dead", labels, registry=r)
        self.finished = pc.Counter(
            "venturi_jobs_finished", "Runs ended, by outcome", [*labels, "outcome"], registry=r
        )
        self.run_seconds = pc.Histogram(
            "venturi_job_run_seconds",
            "Run duration from claim to the accepted transition",
            [*labels, "outcome"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.pickup = pc.Histogram(
            "venturi_job_pickup_seconds",
            "Time from a job becoming eligible to its claim",
            labels,
            buckets=_BUCKETS,
            registry=r,
        )
        self.leases = pc.Counter(
            "venturi_leases_expired",
            "Runs whose lease expired, taken back by this worker's reclaim",
            ["queue", "outcome"],
            registry=r,
        )
        self.blocked = pc.Histogram(
            "venturi_event_loop_blocked_seconds",
            "Blocks of the worker's event loop (a handler blocking it), at least blocked_loop_warning long",
            buckets=_BUCKETS,
            registry=r,
        )
        self.depth = pc.Gauge("venturi_queue_jobs", "Jobs per state", ["queue", "state"], registry=r)
        self.eligible = pc.Gauge(
            "venturi_queue_eligible", "Jobs eligible now, per priority", ["queue", "priority"], registry=r
        )
        self.lag = pc.Gauge(
            "venturi_queue_lag_seconds", "Age of the oldest eligible job", ["queue"], registry=r
        )
        self.paused = pc.Gauge("venturi_queue_paused", "1 while claims are paused", ["queue"], registry=r)
        self.trim_lag = pc.Gauge(
            "venturi_queue_trim_lag_seconds",
            "How long the oldest finished job has been past its retention period (0: trimming keeps up)",
            ["queue"],
            registry=r,
        )
        self.over_retention = pc.Gauge(
            "venturi_queue_over_retention",
            "Finished jobs past their state's retention count bound, not yet trimmed",
            ["queue"],
            registry=r,
        )

    # -- WorkerObserver ---------------------------------------------------------------

    def job_claimed(self, queue: str, kind: str) -> None:
        self.claimed.labels(queue, kind).inc()

    def job_finished(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        self.finished.labels(queue, kind, outcome).inc()
        self.run_seconds.labels(queue, kind, outcome).observe(seconds)
        counter = {"completed": self.completed, "failed": self.failed, "dead": self.dead}.get(outcome)
        if counter is not None:
            counter.labels(queue, kind).inc()

    def job_waited(self, queue: str, kind: str, seconds: float) -> None:
        self.pickup.labels(queue, kind).observe(seconds)

    def leases_expired(self, queue: str, requeued: int, dead: int) -> None:
        if requeued:
            self.leases.labels(queue, "requeued").inc(requeued)
        if dead:
            self.leases.labels(queue, "dead").inc(dead)

    def loop_blocked(self, seconds: float) -> None:
        self.blocked.observe(seconds)

    # -- gauges ---------------------------------------------------------------------------

    async def refresh(self, queues: Sequence[Queue]) -> None:
        """Read ``queue.stats()`` of each queue into the gauges: many queues a round trip
        (``_producer/many.py``; a worker on 1,000 queues read them one by one, 2,000 round
        trips a refresh). A queue that cannot be read keeps its last values."""
        by_client: dict[int, list[Queue]] = {}
        for q in queues:
            by_client.setdefault(id(q.client), []).append(q)
        read: list[QueueStats] = []
        for qs in by_client.values():
            got, broken = await stats_of(qs[0].client, [q.name for q in qs])
            read += got.values()
            if broken:
                name, exc = next(iter(broken.items()))
                log.warning(
                    "metrics: reading the stats of %d queue(s) failed (%s: %s)", len(broken), name, exc
                )
        for st in read:
            for label, n in st.pending.items():
                self.eligible.labels(st.queue, label).set(n)
            for state, n in (
                ("eligible", st.eligible),
                ("delayed", st.delayed),
                ("retrying", st.retrying),
                ("running", st.running),
                ("suspended", st.suspended),
                ("completed", st.completed),
                ("dead", st.dead),
                ("cancelled", st.cancelled),
            ):
                self.depth.labels(st.queue, state).set(n)
            self.lag.labels(st.queue).set(st.lag_seconds)
            self.paused.labels(st.queue).set(1 if st.paused else 0)
            self.trim_lag.labels(st.queue).set(st.trim_lag_seconds)
            self.over_retention.labels(st.queue).set(st.over_retention)

    async def refresh_forever(self, queues: Sequence[Queue], interval: float = 5.0) -> None:
        """Refresh the gauges every ``interval`` seconds (run beside the worker)."""
        while True:
            try:
                await self.refresh(queues)
            except Exception as exc:  # noqa: BLE001 - a scrape must never take the worker down
                log.warning("metrics: reading queue stats failed (%s)", exc)
            await anyio.sleep(interval)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` over HTTP on ``port`` (a daemon thread); returns the server."""
        return self._pc.start_http_server(port, addr=addr, registry=self.registry)

    def render(self) -> bytes:
        """The text exposition format of the registry (what a scrape returns)."""
        out: bytes = self._pc.generate_latest(self.registry)
        return out
