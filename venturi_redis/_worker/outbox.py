"""The outbox: one connection's endings and claims, sent many per round trip.

The completer (``completer.py``) decides what each run's ending becomes and
hands it here; an ``Outbox`` gathers what is ready and sends it in one
pipeline (``store.send_ops``), then hands each caller its parsed reply.
The order of a pipeline, and why it is safe to have two in flight, is the
class's docstring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._store.store import Op, Retained, send_ops

if TYPE_CHECKING:
    from .._producer.client import Client, Queue
    from .._store.store import Completion

log = logging.getLogger("venturi_redis.worker")

# Most completions in one complete.lua call (a longer burst takes several calls).
_COMPLETE_BATCH = 200
# Most bytes of values (attachments, carries, results) in one complete.lua
# call: Redis copies them while it serves nobody else (~5 ms a MB), so a burst
# of runs with large results goes out as several calls, others served between.
_COMPLETE_BYTES = 16 << 20
# Pipelines in flight at once: while one is at Redis, the worker builds and
# sends the next, so the worker's CPU and Redis's overlap instead of taking
# turns (in-process drain at concurrency 100: about +15%, benchmarks/README.md).
_IN_FLIGHT = 2


def completion_bytes(completion: Completion) -> int:
    """The bytes of a completion's large values: its attachment, carry and result (a note is
    bounded small: sizes.NOTE_CHARS)."""
    return sum(len(value) for value in completion[3:] if isinstance(value, bytes))


_Entry = tuple["Queue", "Completion", Any, Any]


def _counted(group: list[_Entry]) -> list[list[_Entry]]:
    """A queue's completions in calls of at most ``_COMPLETE_BATCH``."""
    return [group[i : i + _COMPLETE_BATCH] for i in range(0, len(group), _COMPLETE_BATCH)]


def _chunked(group: list[_Entry]) -> list[list[_Entry]]:
    """A queue's completions in calls of at most ``_COMPLETE_BATCH``, each closed once its
    values reach ``_COMPLETE_BYTES`` (so a call holds at most that and one job's values)."""
    chunks: list[list[_Entry]] = [[]]
    held = 0
    for entry in group:
        chunk = chunks[-1]
        if len(chunk) >= _COMPLETE_BATCH or held >= _COMPLETE_BYTES:
            chunk = []
            chunks.append(chunk)
            held = 0
        chunk.append(entry)
        held += completion_bytes(entry[1])
    return chunks


class Outbox:
    """Sends one connection's endings and claims, many per round trip.

    Handlers finish in bursts (a claim batch of no-op jobs finishes almost at
    once). What is submitted while a pipeline is in flight goes out together
    in the next one: the claim loops' claims first (they refill the slots
    those runs freed in the same round trip), then every other ending as its
    own script, then the completions of a queue as one ``complete`` call over
    all of them (each job still checked, written and journaled on its own). A
    lone call goes out at once: batching only happens under load.

    Claims go before the completions so that the running set never empties
    between a batch's completions and the next claim: a sorted set of up to
    128 members is a listpack, in which each of a claim's inserts scans the
    whole set; kept above that, it stays a skiplist (about 8% of Redis's
    instructions per job, benchmarks/redis_cost.py). A concurrency slot a
    completion gives back is then used by the next claim, a round trip later.

    Two pipelines may be in flight at once. That is safe because nothing
    orders one pipeline after another: a job's task waits for its ending's
    reply before it sends anything else for that job, and a claim loop waits
    for its claim before it claims again.
    """

    def __init__(self, client: Client, retained: Retained) -> None:
        self.client = client
        self.retained = retained
        # What is waiting for the next pipeline: (op, future) for an awaited
        # call; (queue, completion, done, job) for a completion nobody awaits.
        self._ops: list[tuple[Op[Any], asyncio.Future[Any], bool]] = []
        self._completions: list[tuple[Queue, Completion, Any, Any]] = []
        self._bytes = 0  # of the values of _completions (only counted when there are some)
        self._kick = anyio.Event()
        # Whether _kick is set: the calls after the first of a round trip skip setting it again.
        self._kicked = False

    async def submit(self, op: Op[Any], *, claim: bool = False) -> Any:
        """Run ``op`` in the next round trip (a claim before that trip's endings): its parsed reply."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append((op, reply, claim))
        self._wake_sender()
        return await reply

    def complete_soon(self, queue: Queue, completion: Completion, done: Any, job: Any) -> None:
        """A completion without waiting: the sender calls ``done(job, result)`` with the job's
        ``Transition`` (or the exception), from its own task."""
        self._completions.append((queue, completion, done, job))
        self._wake_sender()

    def hold(self, size: int) -> None:
        """The last completion handed over holds ``size`` bytes of values (told only when it
        may hold some: the usual completion costs nothing more)."""
        self._bytes += size

    def _wake_sender(self) -> None:
        """Set ``_kick`` once per round trip (the calls after the first skip setting it again)."""
        if not self._kicked:
            self._kicked = True
            self._kick.set()

    async def run(self) -> None:
        """Two senders: while one's pipeline is at Redis, the other gathers and sends the next."""
        async with anyio.create_task_group() as tg:
            for _ in range(_IN_FLIGHT):
                tg.start_soon(self._sender)

    async def _sender(self) -> None:
        while True:
            await self._kick.wait()
            # Let the tasks that are ready now (other runs finishing, a claim
            # loop woken by the slots they freed) add their calls to this batch.
            await anyio.lowlevel.checkpoint()
            # Reset and take in one step (no await between): a call added
            # before the reset is taken here, one added after sets the new event.
            self._kick = anyio.Event()
            self._kicked = False
            ops, self._ops = self._ops, []
            completions, self._completions = self._completions, []
            size, self._bytes = self._bytes, 0
            if not ops and not completions:
                continue  # the other sender took them
            await self._send(ops, completions, size)

    async def _send(
        self,
        ops: list[tuple[Op[Any], asyncio.Future[Any], bool]],
        completions: list[tuple[Queue, Completion, Any, Any]],
        size: int = 0,
    ) -> None:
        # The pipeline: the claims, the awaited endings, then one complete call
        # per queue (per _COMPLETE_BATCH completions).
        pipeline: list[Op[Any]] = [op for op, _, claim in ops if claim]
        n_claims = len(pipeline)
        pipeline += [op for op, _, claim in ops if not claim]
        first_complete = len(pipeline)
        # By queue (its key prefix: two Queue objects of one queue share a call), in order.
        by_queue: dict[str, list[tuple[Queue, Completion, Any, Any]]] = {}
        for entry in completions:
            prefix = entry[0].keys.prefix
            group = by_queue.get(prefix)
            if group is None:
                by_queue[prefix] = [entry]
            else:
                group.append(entry)
        chunks: list[list[tuple[Queue, Completion, Any, Any]]] = []
        for group in by_queue.values():
            store = group[0][0].store
            for chunk in _chunked(group) if size > _COMPLETE_BYTES else _counted(group):
                chunks.append(chunk)
                pipeline.append(store.complete_op([entry[1] for entry in chunk], self.retained))
        try:
            results = await send_ops(self.client.sender, pipeline)
        except Exception as exc:  # noqa: BLE001 - handed to every waiter, which retries
            results = [exc] * len(pipeline)
        claims = iter(results[:n_claims])
        plain = iter(results[n_claims:first_complete])
        for _op, future, claim in ops:
            value = next(claims) if claim else next(plain)
            if future.done():
                continue  # its waiter was cancelled
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)
        complete_results = results[first_complete:]
        for chunk, per_call in zip(chunks, complete_results, strict=True):
            values = [per_call] * len(chunk) if isinstance(per_call, BaseException) else per_call
            for (_, _, done, job), value in zip(chunk, values, strict=True):
                try:
                    done(job, value)
                except Exception:
                    log.exception("internal error handling a completion's reply")
