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

The ``venturi_queue_*`` gauges are read from Redis every refresh: 27 commands
a queue, many queues a round trip (``_producer/many.py``). Every pod that
exports them pays that, so on many queues ``gauges`` chooses who does
(``venturi worker --metrics-gauges``):

- ``all`` (the default): every worker reads and exports its queues' gauges;
- ``elected``: of the workers serving the same set of queues, one at a time
  does, the holder of a key with a TTL (``keys.metrics_gauges_key``, taken
  with ``SET NX PX``, renewed each refresh); the others export none (their
  last values cleared) and take over within three intervals of the holder's
  end (at once after a clean stop, which gives the key up). Redis reads the
  queues once per refresh, not once per pod;
- ``none``: no queue gauges (the job counters and histograms only).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
from redis.exceptions import ResponseError

from .._model.errors import ConfigurationError
from .._producer.base import _text
from .._producer.many import stats_of
from .._store.keys import metrics_gauges_key

if TYPE_CHECKING:
    from .._producer.client import Queue
    from .._producer.reads import QueueStats

log = logging.getLogger("venturi_redis.metrics")

Gauges = Literal["all", "elected", "none"]
GAUGES: tuple[Gauges, ...] = ("all", "elected", "none")

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
        gauges: Who exports the ``venturi_queue_*`` gauges: ``"all"`` (this
            worker reads its queues every refresh), ``"elected"`` (one worker
            of those serving the same queues at a time) or ``"none"``; see the
            module docstring.
    """

    def __init__(self, registry: Any = None, *, gauges: Gauges = "all") -> None:
        if gauges not in GAUGES:
            raise ConfigurationError(f"gauges={gauges!r}: use one of {', '.join(GAUGES)}")
        self.gauges: Gauges = gauges
        # This exporter's id in the election: readable in redis-cli, unique per instance.
        self.holder_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.exporting = gauges == "all"
        self._wrong_key: str | None = None  # the election's key last found of another type
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

    async def refresh(self, queues: Sequence[Queue], interval: float = 5.0) -> None:
        """Read ``queue.stats()`` of each queue into the gauges: many queues a round trip
        (``_producer/many.py``; a worker on 1,000 queues read them one by one, 2,000 round
        trips a refresh). A queue that cannot be read keeps its last values. With
        ``gauges="elected"`` only while this instance holds the election (one ``SET NX``,
        or a renewal, first), with ``"none"`` never."""
        if self.gauges == "none" or not queues:
            return
        if self.gauges == "elected":
            held = await self._elected(queues, interval)
            if not held:
                if self.exporting:
                    self._clear_queue_gauges()
                self.exporting = False
                return
            self.exporting = True
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
        """Refresh the gauges every ``interval`` seconds (run beside the worker). Cancelled,
        an elected holder gives its key up, so another worker takes over at its next refresh."""
        try:
            while True:
                try:
                    await self.refresh(queues, interval)
                except Exception as exc:  # noqa: BLE001 - a scrape must never take the worker down
                    log.warning("metrics: reading queue stats failed (%s)", exc)
                await anyio.sleep(interval)
        finally:
            if self.gauges == "elected" and self.exporting and queues:
                # Best effort: the worker may have closed its client already; the key's TTL
                # then hands the gauges on instead.
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        await self.resign(queues)
                    except Exception as exc:  # noqa: BLE001 - stopping must not fail on it
                        log.debug("metrics: could not give the gauges' key up (%s)", exc)

    # -- the election (gauges="elected") ---------------------------------------------------

    @staticmethod
    def gauges_key(queues: Sequence[Queue]) -> str:
        """The election's key of this set of queues: workers serving the same names share it."""
        digest = hashlib.sha256("\n".join(sorted({q.name for q in queues})).encode()).hexdigest()[:16]
        return metrics_gauges_key(digest, queues[0].client.namespace)

    async def _elected(self, queues: Sequence[Queue], interval: float) -> bool:
        """Take the key, or renew it when this instance holds it: whether it does now.

        The renewal (``GET``, then ``PEXPIRE``) is not atomic: should the key expire between
        the two and another worker take it, this one renews the other's key and both
        export for a refresh or two, with the same values (``max by (queue)`` reads them as
        one). No write is ever lost to it, only a little Redis work.
        """
        redis = queues[0].client.redis
        key = self.gauges_key(queues)
        ttl_ms = int(max(interval, 1.0) * 3000)
        if await redis.set(key, self.holder_id, nx=True, px=ttl_ms):
            if not self.exporting:
                log.info("metrics: this worker exports the queue gauges (%s)", key)
            return True
        try:
            holder = _text(await redis.get(key))
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            # Something else wrote the key (a hand-made key, a clash of names): left as it
            # is, said once while it stays so; no worker exports until it is deleted.
            if self._wrong_key != key:
                self._wrong_key = key
                log.warning(
                    "metrics: the gauges' election key %s holds a %s, not a string: no worker "
                    "exports the queue gauges until it is deleted (DEL %s)",
                    key,
                    _text(await redis.type(key)),
                    key,
                )
            return False
        self._wrong_key = None
        if holder == self.holder_id:
            await redis.pexpire(key, ttl_ms)
            return True
        return False

    async def resign(self, queues: Sequence[Queue]) -> None:
        """Give the election's key up if this instance holds it (a clean stop)."""
        redis = queues[0].client.redis
        key = self.gauges_key(queues)
        if _text(await redis.get(key)) == self.holder_id:
            await redis.delete(key)
        self.exporting = False

    def _clear_queue_gauges(self) -> None:
        """Drop every queue gauge series: another worker exports them now, and stale values
        here would read as a second opinion."""
        for gauge in (self.depth, self.eligible, self.lag, self.paused, self.trim_lag, self.over_retention):
            gauge.clear()

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` over HTTP on ``port`` (a daemon thread); returns the server."""
        return self._pc.start_http_server(port, addr=addr, registry=self.registry)

    def render(self) -> bytes:
        """The text exposition format of the registry (what a scrape returns)."""
        out: bytes = self._pc.generate_latest(self.registry)
        return out
