"""vr.SyncClient: blocking producers running the same scripts (dedup merge included)."""

from __future__ import annotations

import threading
import warnings
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import drain
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
