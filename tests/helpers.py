"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from typing import Any

import anyio
from redis.exceptions import RedisError

import venturi_redis as vr
from venturi_redis._store import calls


def make_worker(queue: vr.Queue | list[vr.Queue], *handlers: type[Any], **options: Any) -> vr.Worker[Any]:
    options.setdefault("handle_signals", False)
    options.setdefault("poll_interval", 0.5)
    options.setdefault("backoff", vr.Backoff.fibonacci(base=0.01, cap=0.05))
    worker: vr.Worker[Any] = vr.Worker(queue, **options)
    worker.register(*handlers)
    return worker


async def drain(
    queue: vr.Queue | list[vr.Queue], *handlers: type[Any], timeout: float = 30, **options: Any
) -> vr.Worker[Any]:
    """Run a worker until the queue is drained (bounded, so a bug fails instead of hanging)."""
    worker = make_worker(queue, *handlers, **options)
    with anyio.fail_after(timeout):
        await worker.run(until_idle=True)
    return worker


async def expires_at(r: Any, key: str) -> tuple[int, int]:
    """When ``key`` expires (ms since the epoch), as bounds ``(lo, hi)``.

    Exact (``lo == hi``) by PEXPIRETIME, Redis 7.0 and later; on 6.2, which
    lacks it, by PTTL between two readings of this machine's clock (the
    suite's servers are local: the same clock).
    """
    try:
        at = int(await r.pexpiretime(key))
        return at, at
    except RedisError:  # unknown command (redis-py's cluster client says so before sending)
        pass
    before = int(time.time() * 1000)
    ttl = int(await r.pttl(key))
    after = int(time.time() * 1000)
    return before + ttl, after + ttl


async def events(queue: vr.Queue, job_id: str) -> list[str]:
    return [e.event for e in await queue.journal(job_id)]


async def run_until_event(
    queue: vr.Queue, job_id: str, event: str, *handlers: type[Any], timeout: float = 10
) -> None:
    """Run a worker until ``event`` shows in the job's journal, then shut it down."""
    worker = make_worker(queue, *handlers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(timeout):
            while event not in await events(queue, job_id):
                await anyio.sleep(0.02)
        worker.shutdown()


async def claim_raw(queue: vr.Queue, count: int, *, worker: str = "w1", lease_ms: int = 30_000) -> list[Any]:
    """Run claim.lua directly (no worker); the script's raw reply.

    ``[now, next, job...]``, ``calls.CLAIM_FIELDS`` values per job (see
    lua/claim.lua); ``claimed`` gives each job's id and lease token.
    """
    c = queue.client
    call = calls.claim(
        queue.keys, c._now_arg(), count=count, worker=worker, token_base="tok", default_lease_ms=lease_ms
    )
    return list(await c.sender.call(call))


def claimed_jobs(reply: list[Any]) -> list[tuple[str, str]]:
    """(id, lease token) of each job of a ``claim_raw`` reply (its token base is 'tok')."""
    return [(job[0], job[6]) for job in calls.claim_reply(reply, "tok").jobs()]


async def keys_matching(redis: Any, pattern: str) -> list[bytes]:
    """The key names matching ``pattern``, by SCAN: KEYS is @dangerous, which an
    application's ACL user does not have (VENTURI_REDIS_SETUP=acl runs these tests so)."""
    return sorted({key async for key in redis.scan_iter(match=pattern, count=1000)})
