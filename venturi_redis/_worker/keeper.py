"""The lease keeper: renews a running worker's leases, and its registration, every tick.

One task of the worker's service group (worker.py). Each tick it sends one
batched ``extend`` call per queue for the jobs running there (runner.py
``extend``), then renews the worker's registration on each queue
(registry.py ``Registration.beat``): one pipeline for up to 100 queues.

The tick is a third of the shortest lease held, of the worker's own lease
when idle; the registration never beats faster than that idle tick, whatever
the leases held. A clean stop removes the registration at once (``leave``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from .registry import Registration
from .runner import _SURVIVABLE, _Runner

if TYPE_CHECKING:
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")


class LeaseKeeper:
    """Renews the leases of ``runners``' running jobs and the worker's registration."""

    def __init__(
        self, name: str, runners: Sequence[_Runner], queues: list[Queue], concurrency: int, lease_ms: int
    ) -> None:
        self.runners = runners
        self.lease_ms = lease_ms
        # Who consumes each queue (registry.py; `venturi workers`).
        self.registration = Registration(name, queues, concurrency)

    async def run(self) -> None:
        """Renew every tick until cancelled; the first registration goes out at once."""
        tick = self.lease_ms / 3000
        await self.beat(tick)
        while True:
            shortest = min(
                (j.lease_ms for r in self.runners for j in r.active.values()), default=self.lease_ms
            )
            tick = max(shortest / 3000, 0.01)
            await anyio.sleep(tick)
            for r in self.runners:
                try:
                    await r.extend()
                except _SURVIVABLE as exc:
                    log.warning("queue %s: lease renewal failed (%s)", r.queue.name, exc)
            await self.beat(max(tick, self.lease_ms / 3000))

    async def beat(self, tick: float) -> None:
        try:
            errors = await self.registration.beat([(r.queue, len(r.active)) for r in self.runners], tick)
        except _SURVIVABLE as exc:  # recording the queues' names failed
            errors = [exc] * len(self.runners)
        for r, error in zip(self.runners, errors, strict=True):
            if error is not None:
                log.warning("queue %s: worker registration failed (%s)", r.queue.name, error)

    async def leave(self) -> None:
        """A clean stop: the worker is no longer listed (else it would be until its TTL)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                await self.registration.leave([r.queue for r in self.runners])
            except _SURVIVABLE as exc:
                log.warning("worker deregistration failed (%s)", exc)
