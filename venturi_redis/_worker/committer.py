"""The committer: one connection's transitions and claims, many per round trip."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel

from .._store import calls

if TYPE_CHECKING:
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")
_J = TypeVar("_J")

# Most completions in one complete.lua call (a longer burst takes several calls).
_COMPLETE_BATCH = 200
# Pipelines in flight at once: while one is at Redis, the worker builds and
# sends the next, so the worker's CPU and Redis's overlap instead of taking
# turns (in-process drain at concurrency 100: about +15%, benchmarks/README.md).
_IN_FLIGHT = 2


class _Committer:
    """Sends one connection's transitions and claims, many per round trip.

    Handlers finish in bursts (a claim batch of no-op jobs finishes almost at
    once). What is submitted while a pipeline is in flight goes out together
    in the next one: the completions of a queue as one ``complete`` call over
    all of them (each job still checked, written and journaled on its own),
    every other transition as its own script, and the claim loops' claims
    last, so that the slots those runs freed are refilled in the same round
    trip. A lone call goes out at once: batching only happens under load.

    Two pipelines may be in flight at once (on two connections). That is safe
    because nothing orders one pipeline after another: a job's task waits for
    its transition's reply before it sends anything else for that job, and a
    claim loop waits for its claim before it claims again.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._calls: list[tuple[str, Any]] = []
        # One future per call, resolved by the sender with the call's reply.
        # A bare asyncio future, not an anyio.Event plus a value: this is per
        # transition, and the worker runs on asyncio anyway (redis.asyncio).
        # Or (callback, job) for a completion that nobody awaits (complete_soon).
        self._replies: list[asyncio.Future[Any] | tuple[Callable[[Any, Any], None], Any]] = []
        self._kick = anyio.Event()

    async def _submit(self, kind: str, call: Any) -> Any:
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls.append((kind, call))
        self._replies.append(reply)
        self._kick.set()
        return await reply

    async def submit(self, call: calls.Call) -> Any:
        """Run one script in the next round trip: its reply, or its error raised."""
        return await self._submit("script", call)

    async def claim(self, call: calls.Call) -> Any:
        """Run a claim in the next round trip, after that round trip's transitions."""
        return await self._submit("claim", call)

    def complete_soon(
        self, queue: Queue, completion: calls.Completion, done: Callable[[_J, Any], None], job: _J
    ) -> None:
        """``complete`` without waiting: the sender calls ``done(job, result)`` with the
        job's ``calls.Transition`` or the exception, from its own task."""
        self._calls.append(("complete", (queue, completion)))
        self._replies.append((done, job))
        self._kick.set()

    async def complete(self, queue: Queue, completion: calls.Completion) -> calls.Transition:
        """Complete one job (its ``calls.completion`` values) in the next round trip."""
        result: calls.Transition = await self._submit("complete", (queue, completion))
        return result

    def _plan(self, batch: list[tuple[str, Any]]) -> tuple[list[calls.Call], list[tuple[int, int | None]]]:
        """The pipeline for a batch, and where each call's reply is in it.

        A place is (index in the pipeline, index in a multi-job reply or None).
        """
        pipeline: list[calls.Call] = []
        places: list[tuple[int, int | None]] = [(0, None)] * len(batch)
        completes: dict[str, tuple[Queue, list[int]]] = {}
        claims: list[int] = []
        for i, (kind, call) in enumerate(batch):
            if kind == "complete":
                completes.setdefault(call[0].keys.prefix, (call[0], []))[1].append(i)
            elif kind == "claim":
                claims.append(i)
            else:
                places[i] = (len(pipeline), None)
                pipeline.append(call)
        for queue, indices in completes.values():
            for start in range(0, len(indices), _COMPLETE_BATCH):
                chunk = indices[start : start + _COMPLETE_BATCH]
                for j, i in enumerate(chunk):
                    places[i] = (len(pipeline), j)
                completions = [batch[i][1][1] for i in chunk]
                pipeline.append(calls.complete(queue.keys, queue.client._now_arg(), completions))
        for i in claims:
            places[i] = (len(pipeline), None)
            pipeline.append(batch[i][1])
        return pipeline, places

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
            batch, self._calls = self._calls, []
            replies, self._replies = self._replies, []
            if not batch:
                continue  # the other sender took them
            pipeline, places = self._plan(batch)
            try:
                results = await self.client._scripts.run_pipeline(
                    self.client.redis, pipeline, return_exceptions=True
                )
            except Exception as exc:  # noqa: BLE001 - handed to every waiter, which retries
                results = [exc] * len(pipeline)
            parsed: dict[int, list[calls.Transition]] = {}  # complete.lua's replies, parsed once each
            for reply, (at, sub) in zip(replies, places, strict=True):
                value = results[at]
                if sub is not None and not isinstance(value, BaseException):
                    per_job = parsed.get(at)
                    if per_job is None:
                        per_job = parsed[at] = calls.completed(value)
                    value = per_job[sub]
                if isinstance(reply, tuple):
                    done, job = reply
                    try:
                        done(job, value)
                    except Exception:
                        log.exception("internal error handling a completion's reply")
                    continue
                if reply.done():
                    continue  # its waiter was cancelled
                if isinstance(value, BaseException):
                    reply.set_exception(value)
                else:
                    reply.set_result(value)
