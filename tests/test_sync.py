"""vr.SyncClient: blocking producers running the same scripts (dedup merge included)."""

from __future__ import annotations

import threading
import uuid
import warnings
from typing import Any, ClassVar

import anyio
import msgpack
import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

import venturi_redis as vr
from tests.chaos.proxy import Proxy
from tests.helpers import drain
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio


class Count(vr.Task):
    """Coalesces by key: a pending job takes the sum."""

    KIND: ClassVar[str] = "count"
    key: str
    n: int = 1

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.with_(Count(key=self.key, n=existing.payload.n + self.n), vr.NoCarry())


class Ask(vr.Task):
    KIND: ClassVar[str] = "ask"


class AskJob(Ask, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if ctx.resume_input is None:
            return vr.Outcome.suspend(output="approve?")
        return vr.Outcome.completed(result=ctx.resume_input)


async def test_sync_enqueue_is_seen_by_the_async_side(url: str, queue: vr.Queue) -> None:
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue.name)
        jid = sq.enqueue(Echo(text="from django"), priority="high")
        ids = sq.enqueue_many([Echo(text=str(i)) for i in range(3)])
        info = sq.get(jid)
        assert info is not None and info.state == vr.JobState.PENDING
        assert info.priority == vr.Priority.HIGH and info.payload == {"text": "from django"}
        assert [e.event for e in sq.journal(jid)] == ["enqueued"]
        assert sq.get("01J0000000000000000000NONE") is None
        assert sq.counts()["pending"] == 4
    # the async side sees the very same jobs
    assert (await queue.get(ids[2])).payload == {"text": "2"}  # type: ignore[union-attr]
    await drain(queue, EchoJob)
    assert (await queue.stats()).completed == 4


async def test_sync_dedup_merge_runs_the_same_merge_loop(url: str, queue: vr.Queue) -> None:
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue.name)
        first = sq.enqueue(Count(key="k", n=2))
        # Many threads at once: every one merges into the same pending job.
        out: list[str] = []

        def produce() -> None:
            out.append(sq.enqueue(Count(key="k", n=1)))

        threads = [threading.Thread(target=produce) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(out) == {first}
        info = sq.get(first)
        assert info is not None and info.payload == {"key": "k", "n": 10}
        assert [e.event for e in sq.journal(first)].count("merged") == 8


async def test_sync_resume_and_cancel(url: str, queue: vr.Queue) -> None:
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue.name)
        jid = sq.enqueue(Ask())
        assert sq.resume(jid, "yes") == 0  # not suspended yet
        await drain(queue, AskJob)
        assert sq.get(jid).output == "approve?"  # type: ignore[union-attr]
        assert sq.resume(jid, "yes") == 1
        await drain(queue, AskJob)
        assert sq.get(jid).result == "yes"  # type: ignore[union-attr]
        other = sq.enqueue(Echo(text="x"))
        assert sq.cancel(other) == "cancelled"


def test_sync_client_errors_and_close() -> None:
    with pytest.raises(vr.ConfigurationError, match="unsupported URL"):
        vr.SyncClient("http://nope")
    sc = vr.SyncClient("memory://sync-close")
    with pytest.raises(vr.ConfigurationError, match="invalid queue name"):
        sc.queue("bad name!")
    q = sc.queue("ok")
    assert q.enqueue(Echo(text="a"))
    sc.close()
    sc.close()  # idempotent
    with pytest.raises(vr.ConfigurationError, match="closed"):
        q.enqueue(Echo(text="b"))
    with pytest.raises(vr.PayloadTooLarge), vr.SyncClient("memory://sync-cap", max_payload_bytes=10) as small:
        small.queue("q").enqueue(Echo(text="x" * 100))


def test_sync_client_works_after_fork(tmp_path: Any) -> None:
    import os

    sc = vr.SyncClient("memory://sync-fork")
    sq = sc.queue("q")
    sq.enqueue(Echo(text="parent"))
    with warnings.catch_warnings():  # 3.12+ warns about fork() with threads: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            ok = sq.enqueue(Echo(text="child")) and sq.counts()["pending"] >= 1
            os._exit(0 if ok else 1)
        except BaseException:  # noqa: BLE001 - any error is a failed child
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sq.counts()["pending"] == 1  # the child's memory:// server was its own copy
    sc.close()


# -- the direct single enqueue: from the calling thread, on a blocking connection ------------------


def _no_async_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*a: Any, **kw: Any) -> str:
        raise AssertionError("the single enqueue went through the loop thread")

    monkeypatch.setattr(vr.Queue, "enqueue", refuse)


def test_a_single_enqueue_on_redis_skips_the_loop_thread(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"sync-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as sc:
        sq = sc.queue(name)
        _no_async_enqueue(monkeypatch)
        jid = sq.enqueue(Echo(text="direct"), priority="high", delay=60, lease=30, max_failures=2)
        info = sq.get(jid)
        # The same job the async enqueue writes, options included.
        assert info is not None and info.state == vr.JobState.PENDING and info.payload == {"text": "direct"}
        assert info.priority == vr.Priority.HIGH and info.eligible_at is not None
        assert (info.eligible_at - info.created_at).total_seconds() == pytest.approx(60, abs=0.01)
        with redis.Redis(port=redis_server.port) as admin:
            raw = admin.hgetall(sc.client.queue(name).keys.job(jid))
        assert (raw[b"lease_ms"], raw[b"max_failures"]) == (b"30000", b"2")
        # Refused before anything is sent, in the calling thread.
        with pytest.raises(vr.PayloadTooLarge):
            sq.enqueue(Echo(text="x" * (sc.client.max_payload_bytes + 1)))
        assert sq.counts()["pending"] == 1
    with vr.SyncClient("memory://sync-direct") as mem:  # no lane, no direct path: the portal
        assert mem._direct is None
        with pytest.raises(AssertionError, match="loop thread"):
            mem.queue("q").enqueue(Echo(text="x"))


def test_direct_enqueues_from_many_threads_each_make_one_job(redis_server: RedisServer) -> None:
    name = f"sync-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as sc:
        sq = sc.queue(name)
        ids: list[str] = []

        def produce(t: int) -> None:
            for i in range(100):
                ids.append(sq.enqueue(Echo(text=f"{t}-{i}")))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == len(set(ids)) == 800
        assert sq.counts()["pending"] == 800


def test_a_direct_enqueue_after_a_script_flush_sends_the_source(redis_server: RedisServer) -> None:
    name = f"sync-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as sc:
        sq = sc.queue(name)
        sq.enqueue(Echo(text="a"))
        with redis.Redis(port=redis_server.port) as admin:
            admin.script_flush()
        jid = sq.enqueue(Echo(text="b"))
        assert sq.get(jid) is not None and sq.counts()["pending"] == 2


async def test_a_silent_connection_times_out_and_the_direct_enqueue_is_not_resent(
    redis_server: RedisServer,
) -> None:
    proxy = await Proxy(redis_server.port).start()
    name = f"sync-{uuid.uuid4().hex[:8]}"
    sc = vr.SyncClient(f"{proxy.url}?socket_timeout=0.5")
    try:
        sq = sc.queue(name)
        await anyio.to_thread.run_sync(lambda: sq.enqueue(Echo(text="before")))
        proxy.blackhole()  # the pooled connection now swallows everything
        with pytest.raises(RedisTimeoutError):
            await anyio.to_thread.run_sync(lambda: sq.enqueue(Echo(text="lost")))
        await anyio.to_thread.run_sync(lambda: sq.enqueue(Echo(text="after")))  # a new connection
    finally:
        await anyio.to_thread.run_sync(sc.close)
        await proxy.aclose()
    with redis.Redis(port=redis_server.port) as admin:
        keys = [k for k in admin.keys(f"*{name}*:job:*") if b":journal:" not in k]
        texts = sorted(msgpack.unpackb(admin.hget(k, "payload"))["text"] for k in keys)
    assert texts == ["after", "before"]  # the swallowed call was not sent again


def test_the_direct_path_works_after_fork(redis_server: RedisServer) -> None:
    import os

    name = f"sync-{uuid.uuid4().hex[:8]}"
    sc = vr.SyncClient(redis_server.url)
    sq = sc.queue(name)
    sq.enqueue(Echo(text="parent"))
    parent_pool = sc._direct
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            sq.enqueue(Echo(text="child"))
            os._exit(0 if sc._direct is not parent_pool else 1)  # a pool of its own
        except BaseException:  # noqa: BLE001 - any error is a failed child
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sq.enqueue(Echo(text="parent again"))  # the parent's connection is untouched by the child
    assert sq.counts()["pending"] == 3
    sc.close()
