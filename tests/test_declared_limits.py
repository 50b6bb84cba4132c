"""Limits declared in code: ``vr.Worker(..., limits=[vr.Limit(...)])`` (issue 39, item 4).

Set when the worker starts, on every queue it consumes, like ``schedules=``;
checked where they are declared.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, make_worker
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio
backends = pytest.mark.parametrize("backend", ["redis", "memory"])


@backends
async def test_a_worker_sets_its_declared_limits_when_it_starts(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    sharded = vr.ShardedQueue(client, f"{queue_name}-s", partitions=2)
    limits = [
        vr.Limit("echo", concurrency=2, rate=vr.Rate(100, timedelta(seconds=1))),
        vr.Limit("echo", concurrency=1, per_key=True),
    ]
    worker = make_worker([queue, sharded], EchoJob, limits=limits)
    assert await queue.limits() == []  # declared, not written yet
    await queue.enqueue(Echo(text="a"))

    with anyio.fail_after(30):
        await worker.run(until_idle=True)

    for q in [queue, *sharded.partitions]:
        got = [(x.kind, x.per_key, x.concurrency, x.rate) for x in await q.limits()]
        assert got == [("echo", False, 2, vr.Rate(100, 1)), ("echo", True, 1, None)], q.name
    assert (await queue.counts())["completed"] == 1  # and it ran under them


@backends
async def test_a_limit_stored_differently_is_set_as_declared(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    await queue.set_limit("echo", concurrency=50)
    await queue.set_limit("other", concurrency=3)  # not declared: left alone
    await queue.enqueue(Echo(text="a"))
    await drain(queue, EchoJob, limits=[vr.Limit("echo", rate=vr.Rate(10, 60))])
    got = {x.kind: (x.concurrency, x.rate) for x in await queue.limits()}
    assert got == {"echo": (None, vr.Rate(10, 60)), "other": (3, None)}


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: vr.Limit("echo"), r"vr\.Limit needs a concurrency or a rate"),
        (lambda: vr.Limit("echo", concurrency=0), "concurrency must be a whole number from 1 to"),
        (lambda: vr.Limit("echo", rate=5), r"rate must be a vr\.Rate"),  # type: ignore[arg-type]
        (lambda: vr.Limit("", concurrency=1), "is not a task kind"),
        (lambda: vr.Limit("echo", concurrency=1, per_key="yes"), "per_key must be True or False"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_limit_is_refused_where_it_is_declared(make: object, match: str) -> None:
    with pytest.raises(vr.ConfigurationError, match=match):
        make()  # type: ignore[operator]


@backends
async def test_the_worker_refuses_what_is_no_list_of_limits(client: vr.Client, queue_name: str) -> None:
    queue = client.queue(queue_name)
    one = vr.Limit("echo", concurrency=1)
    with pytest.raises(vr.ConfigurationError, match=r"limits must be a list of vr\.Limit"):
        vr.Worker(queue, limits=one)  # type: ignore[arg-type]
    with pytest.raises(vr.ConfigurationError, match="kind-wide limit of 'echo' is declared twice"):
        vr.Worker(queue, limits=[one, vr.Limit("echo", rate=vr.Rate(1, 1))])
