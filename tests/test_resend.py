"""A resent enqueue changes nothing: a client may send a command again when it lost the reply.

redis-py's cluster client resends a command whose connection failed (three
retries by default), a user's own client may be configured to, and the first
send may have been applied. Job ids are fresh per enqueue call, so enqueue.lua
treats a job hash that exists, or a dedup field naming this very id, as its
own earlier send (lua/enqueue.lua).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.helpers import claim_raw, events
from tests.test_dedup import Count, Tally
from venturi_redis._store import calls
from venturi_redis._store.keys import dedup_field
from venturi_redis._store.prepare import prepare
from venturi_redis._transport.fastpack import FastPackConnection

pytestmark = pytest.mark.anyio


class Plain(vr.Task):
    KIND: ClassVar[str] = "plain"
    n: int = 0


def _prepared(queue: vr.Queue, task: vr.Task[Any], carry: Any = None) -> Any:
    cap = queue.client.max_payload_bytes
    return prepare(task, cap, None, delay=0, priority=None, lease=None, max_failures=None, carry=carry)


async def _send(queue: vr.Queue, job: Any, dedup_mode: str = "nx") -> list[Any]:
    """One send of the enqueue script for ``job``: its reply after ``now``, as text."""
    call = calls.enqueue(queue.keys, queue.client._now_arg(), [job], dedup_mode=dedup_mode)
    reply = await queue.client.sender.call(call)
    return calls.enqueue_holders(reply)


async def _state(queue: vr.Queue, job_id: str) -> tuple[Any, ...]:
    r = queue.client.redis
    k = queue.keys
    return (
        await r.hget(k.job(job_id), "state"),
        await r.hget(k.job(job_id), "run_count"),
        await r.zscore(k.pending(vr.Priority.NORMAL), job_id),
        await r.zscore(k.running, job_id),
    )


async def test_a_resend_after_the_job_was_claimed_leaves_it_running(queue: vr.Queue) -> None:
    job = _prepared(queue, Plain(n=1))
    assert await _send(queue, job) == [""]
    assert (await claim_raw(queue, 1))[2] == job.id.encode()  # [now, next, id, ...]
    running = await _state(queue, job.id)
    assert running[:3] == (b"running", b"1", None)
    assert await _send(queue, job) == [""]  # reported created, as the first send was
    assert await _state(queue, job.id) == running  # not put back to pending
    assert (await queue.counts())["pending"] == 0
    assert await events(queue, job.id) == ["enqueued", "claimed"]


async def test_a_resend_of_a_pending_job_is_not_merged_into_itself(queue: vr.Queue) -> None:
    job = _prepared(queue, Count(key="k"), carry=Tally(n=1))
    assert await _send(queue, job) == [""]
    assert await _send(queue, job) == [""]  # not [job.id]: that would send it to merge
    info = await queue.get(job.id)
    assert info is not None and info.carry == {"n": 1}
    assert await events(queue, job.id) == ["enqueued"]


@pytest.mark.parametrize("dedup_mode", ["nx", "force"])
async def test_a_resend_after_claim_gives_back_the_dedup_key(queue: vr.Queue, dedup_mode: str) -> None:
    job = _prepared(queue, Count(key="k"))
    field = dedup_field("count", "k")
    assert await _send(queue, job, dedup_mode) == [""]
    await claim_raw(queue, 1)
    assert await queue.client.redis.hget(queue.keys.dedup, field) is None  # freed at claim
    assert await _send(queue, job, dedup_mode) == [""]
    # The key is free for the next enqueue, which makes a new job instead of
    # trying to merge into a running one.
    assert await queue.client.redis.hget(queue.keys.dedup, field) is None
    b = await queue.enqueue(Count(key="k"))
    assert b != job.id and (await queue.get(b)).state == vr.JobState.PENDING  # type: ignore[union-attr]


async def test_a_resend_keeps_another_jobs_dedup_key(queue: vr.Queue) -> None:
    job = _prepared(queue, Count(key="k"))
    assert await _send(queue, job) == [""]
    await claim_raw(queue, 1)
    b = await queue.enqueue(Count(key="k"))  # the key's new holder
    assert await _send(queue, job) == [b]  # a collision with b, as for any enqueue: nothing written
    assert await _state(queue, job.id) == (b"running", b"1", None, await _score_running(queue, job.id))
    assert (await queue.client.redis.hget(queue.keys.dedup, dedup_field("count", "k"))).decode() == b


async def _score_running(queue: vr.Queue, job_id: str) -> Any:
    return await queue.client.redis.zscore(queue.keys.running, job_id)


async def test_the_cluster_clients_own_resend_after_a_lost_reply_enqueues_once(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first EVALSHA runs and its reply is lost; redis-py's cluster client sends it again.

    (A single Redis client raises instead, as docs/guarantees.md says.)
    """
    client = vr.Client.from_url(redis_cluster.url)
    try:
        await _lose_one_evalsha_reply(client.queue("resend"), monkeypatch)
    finally:
        await client.aclose()


async def _lose_one_evalsha_reply(queue: vr.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    await queue.enqueue(Plain())  # connections made, scripts loaded
    lost: list[AbstractConnection] = []
    for cls in (AbstractConnection, FastPackConnection):
        original = cls.send_packed_command

        async def send(conn: AbstractConnection, command: Any, *a: Any, _o: Any = original, **kw: Any) -> Any:
            if (
                not lost
                and b"EVALSHA" in b"".join(command if isinstance(command, list) else [command]).upper()
            ):
                lost.append(conn)
                read = conn.read_response

                async def fail(*a: Any, **kw: Any) -> Any:
                    del conn.read_response
                    await read(*a, **kw)  # the server ran it
                    raise RedisConnectionError("injected: the reply was lost")

                conn.read_response = fail  # type: ignore[method-assign]
            return await _o(conn, command, *a, **kw)

        monkeypatch.setattr(cls, "send_packed_command", send)
    a = await queue.enqueue(Count(key="k"), carry=Tally(n=1))
    assert lost  # the fault was injected, and the call still returned
    info = await queue.get(a)
    assert info is not None and info.carry == {"n": 1}  # not merged into itself
    assert await events(queue, a) == ["enqueued"]


async def test_the_short_and_the_general_enqueue_layouts_write_the_same_job(queue: vr.Queue) -> None:
    """enqueue.lua's two ARGV layouts: calls.enqueue sends the short one for a plain single
    job; the general one, sent here by hand for the same job, must write the same."""
    r, k = queue.client.redis, queue.keys
    now = "1765000000000"
    field = dedup_field("plain", "same")
    cap = queue.client.max_payload_bytes
    short_job = prepare(Plain(n=7), cap, None)._replace(dedup=field)  # no optional field
    general_job = prepare(Plain(n=7), cap, None)._replace(dedup=dedup_field("plain", "other"))
    short = calls.enqueue(k, now, [short_job])
    assert short.args == [now, *calls.job_args(short_job)[:6]]
    general = calls.Call(
        "enqueue",
        [k.dedup, k.wake, k.meta, k.job(general_job.id), k.pending(general_job.priority)],
        [now, k.prefix, 1, "nx", "", *calls.job_args(general_job)],
    )
    for call in (short, general):
        assert calls.enqueue_holder(await queue.client.sender.call(call)) == ""
    written = [await r.hgetall(k.job(j.id)) for j in (short_job, general_job)]
    assert written[0].pop(b"dedup") == field.encode()
    assert written[1].pop(b"dedup") == dedup_field("plain", "other").encode()
    assert written[0] == written[1]
    assert written[0][b"state"] == b"pending" and written[0][b"created_at"] == now.encode()
    pending = k.pending(vr.Priority.NORMAL)
    assert await r.zscore(pending, short_job.id) == await r.zscore(pending, general_job.id) == int(now)
    assert await r.hget(k.dedup, field) == short_job.id.encode()
    assert await r.llen(k.wake) == 2
    entries = [fields for _, fields in await r.xrange(k.events)]
    assert [e[b"job"] for e in entries] == [short_job.id.encode(), general_job.id.encode()]
    for e in entries:
        e.pop(b"job")
    assert entries[0] == entries[1] and entries[0][b"event"] == b"enqueued"
    # The short layout's dedup check: a second job with the same field is refused.
    again = prepare(Plain(n=8), cap, None)._replace(dedup=field)
    assert len(calls.enqueue(k, now, [again]).args) == 7
    assert await _send_at(queue, again, now) == [short_job.id]
    assert not await r.exists(k.job(again.id))


async def _send_at(queue: vr.Queue, job: Any, now: str) -> list[Any]:
    reply = await queue.client.sender.call(calls.enqueue(queue.keys, now, [job]))
    return calls.enqueue_holders(reply)
