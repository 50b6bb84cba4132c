"""Scenario 4: Redis killed (SIGKILL) and restarted on the same port, mid-run.

The server runs with ``appendonly yes`` and ``appendfsync always``, so every
write it acknowledged is on disk before the reply. Worker processes and an
in-process producer keep the same client objects throughout: they reconnect
by themselves, the scripts (lost with the server's script cache) are
reloaded after NOSCRIPT, no acknowledged enqueue is lost and every job
completes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from redis.exceptions import RedisError

import venturi_redis as vr
from tests.chaos.chaos_tasks import Work, started_key
from tests.chaos.conftest import LONG, Fleet, figures, reconnecting
from tests.servers import RedisServer
from venturi_redis._store.scripts import scripts

pytestmark = pytest.mark.anyio

RESTARTS = 10 if LONG else 2
DOWN_FOR = 0.5  # seconds the server stays dead each time
CLAIM_SHA = scripts()["claim"].sha


async def test_redis_restart_loses_no_acknowledged_enqueue(
    fleet_factory: Callable[..., Fleet], queue_name: str
) -> None:
    with RedisServer("--appendonly", "yes", "--appendfsync", "always") as server:
        client = vr.Client.from_url(server.url)
        q = client.queue(queue_name)
        acked: list[str] = []
        producer_errors: Counter[str] = Counter()
        stop = anyio.Event()

        async def produce() -> None:
            while not stop.is_set():
                try:
                    acked.append(await q.enqueue(Work(ms=10)))
                except RedisError as exc:  # the producer's own retry loop: the app's choice
                    producer_errors[type(exc).__name__] += 1
                    await anyio.sleep(0.05)
                await anyio.sleep(0.005)

        try:
            fleet = fleet_factory(server.url, queue_name, lease=1.0, reclaim_interval=0.25, poll_interval=30)
            fleet.start()
            fleet.start()
            await fleet.wait_started()
            recoveries: list[float] = []
            noscripts = 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                for _ in range(RESTARTS):
                    await anyio.sleep(1.5)
                    server.kill()
                    await anyio.sleep(DOWN_FOR)
                    server.start()
                    back = time.monotonic()
                    # Recovered when a job enqueued after the restart has been run.
                    while not acked:
                        await anyio.sleep(0.01)
                    n = len(acked)
                    while len(acked) <= n:
                        await anyio.sleep(0.01)
                    probe = acked[n]
                    while True:
                        info = await reconnecting(lambda: q.get(probe))  # noqa: B023
                        if info is not None and info.state == vr.JobState.COMPLETED:
                            break
                        assert time.monotonic() - back < 30, "workers did not recover from the restart"
                        await anyio.sleep(0.02)
                    recoveries.append(time.monotonic() - back)
                    # The new server started with an empty script cache: the
                    # clients met NOSCRIPT and ran the scripts by EVAL.
                    errors = await reconnecting(lambda: client.redis.info("errorstats"))
                    calls = await reconnecting(lambda: client.redis.info("commandstats"))
                    assert _stat(errors, "errorstat_NOSCRIPT", "count") > 0, errors
                    assert _stat(calls, "cmdstat_eval", "calls") > 0, calls
                    noscripts += _stat(errors, "errorstat_NOSCRIPT", "count")
                await anyio.sleep(1.0)
                stop.set()

            deadline = time.monotonic() + 30
            while not await q.is_drained():
                assert time.monotonic() < deadline, await q.counts()
                await anyio.sleep(0.05)
            pipe = client.redis.pipeline(transaction=False)
            for job_id in acked:
                pipe.hget(q.keys.job(job_id), "state")
            states = Counter((s or b"missing").decode() for s in await pipe.execute())
            runs = Counter(x.decode() for x in await client.redis.lrange(started_key(queue_name), 0, -1))
            alive = fleet.alive()
            # The scripts were loaded again by the clients that hit NOSCRIPT.
            assert (await client.redis.script_exists(CLAIM_SHA))[0]
            figures(
                "redis-restart",
                jobs=len(acked),
                faults=RESTARTS,
                down_s=DOWN_FOR,
                lost=len(acked) - states["completed"],
                duplicates=sum(n - 1 for n in runs.values()),
                producer_errors=dict(producer_errors),
                noscript_recoveries=noscripts,
                worst_recovery_s=f"{max(recoveries):.2f}",
                workers_alive=len(alive),
            )
            assert states == Counter({"completed": len(acked)}), states
            assert len(alive) == 2, "a worker process died: " + "\n".join(
                fleet.log(n)[-3000:] for n in fleet.procs if n not in alive
            )
        finally:
            await client.aclose()


def _stat(section: dict[str, Any], line: str, field: str) -> int:
    """One number of an INFO section's ``line`` (``errorstat_NOSCRIPT:count=3``).

    redis-py parses the line into a dict; early 5.0 releases (5.0.1) leave an error
    statistic with one field as its text, ``count=3``.
    """
    value = section.get(line, {})
    if isinstance(value, str):
        value = dict(part.split("=", 1) for part in value.split(","))
    return int(value.get(field, 0))
