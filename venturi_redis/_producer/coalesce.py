"""Concurrent single enqueues of one queue share ``enqueue.lua`` calls."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from redis.exceptions import ConnectionError as RedisConnectionError

from .._store.prepare import ENQUEUE_CHUNK, Prepared

if TYPE_CHECKING:
    from .base import QueueLike


@dataclass(eq=False, slots=True)
class _Waiting:
    """One ``enqueue`` call waiting for (or leading) a shared script call."""

    job: Prepared
    done: anyio.Event
    lead: bool = False  # this call sends the next batch
    sent: bool = False  # its job is in a batch on its way (it can no longer be withdrawn)
    settled: bool = False
    holder: str = ""
    error: Exception | None = None


class Coalescer:
    """Concurrent single enqueues of one queue share script calls.

    A call made while no enqueue of this queue is in flight goes out at once,
    alone: a sequential producer pays nothing extra. Calls made while one is
    in flight wait, and the first of them then sends all of them (up to 500,
    and up to ``Client(max_batch_bytes=...)`` of payloads: Redis copies them
    while it serves nobody else) as one ``enqueue.lua`` call: one round trip
    and one script for a burst of a web server's requests, with each call's
    own result (its job created, or the holder of its dedup key for it to
    merge into) and each call's own error. A call that sends a batch for the
    others is shielded from cancellation until the reply is in, because they
    depend on it; a call cancelled while it still waits is withdrawn, with
    nothing written.
    """

    __slots__ = ("_queue", "_sending", "_waiting")

    def __init__(self, queue: QueueLike) -> None:
        self._queue = queue
        self._sending = False
        self._waiting: deque[_Waiting] = deque()

    async def enqueue(self, job: Prepared) -> str:
        """Enqueue ``job``; returns '' when it was created, else the holder of its dedup key."""
        if not self._sending:
            # Nothing in flight: this call goes out alone, at once. Calls made
            # meanwhile queue up, and the first of them is handed the lead.
            self._sending = True
            try:
                return await self._queue.store.enqueue_one(job)
            finally:
                self._pass_lead()
        me = _Waiting(job, anyio.Event())
        self._waiting.append(me)
        try:
            await me.done.wait()
        except BaseException:
            if not me.sent:  # never left this process: withdraw it
                if me in self._waiting:
                    self._waiting.remove(me)
                if me.lead:
                    self._pass_lead()
            raise
        if me.lead:
            try:
                while not me.settled:
                    await self._send_batch()
            finally:
                self._pass_lead()
        if me.error is not None:
            raise me.error
        return me.holder

    async def _send_batch(self) -> None:
        waiting, held, most = self._waiting, 0, self._queue.client.max_batch_bytes
        batch: list[_Waiting] = []
        while waiting and len(batch) < ENQUEUE_CHUNK and held < most:
            w = waiting.popleft()
            w.sent = True
            batch.append(w)
            held += len(w.job.payload)
        try:
            with anyio.CancelScope(shield=True):
                holders = await self._queue.store.enqueue([w.job for w in batch])
            for w, holder in zip(batch, holders, strict=True):
                w.holder = holder
        except Exception as exc:  # noqa: BLE001 - each call of the batch raises what it would have alone
            for w in batch:
                w.error = exc
        except BaseException:  # KeyboardInterrupt and the like, in the sender: the others must not hang
            for w in batch:
                w.error = RedisConnectionError(
                    "the enqueue call carrying this job was interrupted in another caller; "
                    "whether the job was created is unknown"
                )
            raise
        finally:
            for w in batch:
                w.settled = True
                w.done.set()

    def _pass_lead(self) -> None:
        if self._waiting:
            nxt = self._waiting[0]
            nxt.lead = True
            nxt.done.set()
        else:
            self._sending = False
