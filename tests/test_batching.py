"""The worker's batched paths: many completions per script call, claims riding along.

A burst of finished runs is written by one ``complete`` call over all of them
(each job still fenced and journaled on its own), and the claim that refills
the freed slots goes out in the same round trip.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain, events
from tests.tasks import Echo, EchoJob
from venturi_redis._store import calls
from venturi_redis._store.store import KEEP_ALL
from venturi_redis._worker.outbox import Outbox
from venturi_redis._worker.runner import _Runner

pytestmark = pytest.mark.anyio


async def _claim(queue: vr.Queue, count: int) -> list[tuple[str, str]]:
    reply = await claim_raw(queue, count, worker="tester")
    return claimed_jobs(reply)


async def test_one_complete_call_settles_many_jobs_each_fenced(queue: vr.Queue) -> None:
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(3)])
    claimed = await _claim(queue, 3)
    assert sorted(j for j, _ in claimed) == sorted(ids)
    (a, ta), (b, _), (c, tc) = claimed
    call = calls.complete(
        queue.keys,
        queue.client._now_arg(),
        [
            calls.completion(a, ta, "done a", b"", b"", b""),
            calls.completion(b, "stale-token", "done b", b"", b"", b""),
            calls.completion(c, tc, "done c", b"", b"", b""),
        ],
    )
    reply = await queue.client.sender.call(call)

    assert reply[0] == 1 and reply[2] == 1
    assert b"lease token does not match" in reply[1]
    info = {j: await queue.get(j) for j in (a, b, c)}
    assert info[a].state == vr.JobState.COMPLETED and info[a].note == "done a"  # type: ignore[union-attr]
    assert info[c].state == vr.JobState.COMPLETED and info[c].note == "done c"  # type: ignore[union-attr]
    # The refused one is untouched but for its journaled refusal.
    assert info[b].state == vr.JobState.RUNNING  # type: ignore[union-attr]
    assert (await events(queue, b))[-1] == "refused"
    assert (await events(queue, a))[-1] == "completed"
    counts = await queue.counts()
    assert counts["completed"] == 2 and counts["running"] == 1


async def test_a_burst_of_completions_shares_round_trips(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = queue.client.sender
    pipelines: list[list[tuple[str, int]]] = []
    real = sender.pipeline

    async def spy(calls: Any, **kw: Any) -> list[Any]:
        # (script, jobs it carries): a complete call carries ARGV[5] jobs.
        pipelines.append([(name, int(args[4]) if name == "complete" else 1) for name, _, args in calls])
        return await real(calls, **kw)

    monkeypatch.setattr(sender, "pipeline", spy)
    n = 60
    state: dict[str, Any] = {}
    await queue.enqueue_many([Echo(text=str(i)) for i in range(n)])
    await drain(queue, EchoJob, state=state, concurrency=20)

    assert sorted(state["ran"], key=int) == [str(i) for i in range(n)]
    completes = [jobs for p in pipelines for name, jobs in p if name == "complete"]
    assert sum(completes) == n  # every completion went through the committer once
    assert len(completes) < n and max(completes) > 1  # ... many per script call
    # The claims that refilled the freed slots rode with the completions.
    assert any({"complete", "claim"} <= {name for name, _ in p} for p in pipelines)
    assert (await queue.counts())["completed"] == n


@pytest.mark.parametrize(("batch_size", "largest"), [(None, 10), (20, 20), (3, 3)])
async def test_a_claim_takes_half_the_slots_unless_batch_size_says(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, batch_size: int | None, largest: int
) -> None:
    asked: list[int] = []
    real = _Runner._claim_op

    def spy(self: _Runner, count: int, stop_key: str | None = None) -> Any:
        asked.append(count)  # every claim's count, on every claim path
        return real(self, count, stop_key)

    monkeypatch.setattr(_Runner, "_claim_op", spy)
    n = 60
    state: dict[str, Any] = {}
    await queue.enqueue_many([Echo(text=str(i)) for i in range(n)])
    await drain(queue, EchoJob, state=state, concurrency=20, batch_size=batch_size)

    assert sorted(state["ran"], key=int) == [str(i) for i in range(n)]
    # The first claim finds all 20 slots free; none asks for more than the batch.
    assert asked[0] == largest and max(asked) == largest


async def test_the_default_batch_size_follows_concurrency(queue: vr.Queue) -> None:
    w = vr.Worker(queue, concurrency=7)
    assert w.batch_size == 4
    w.concurrency = 2  # as `venturi worker --concurrency 2` does
    assert w.batch_size == 1
    given = vr.Worker(queue, concurrency=7, batch_size=5)
    given.concurrency = 2
    assert given.batch_size == 5  # a claim still never takes more than the free slots
    for bad in (0, -1):
        with pytest.raises(vr.ConfigurationError, match="batch_size must be >= 1"):
            vr.Worker(queue, batch_size=bad)
    with pytest.raises(vr.ConfigurationError, match="batch_size must be >= 1"):
        given.batch_size = 0


async def test_two_pipelines_go_out_at_once_never_three(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one pipeline is at Redis the next goes out; a third waits for one of them."""
    client = queue.client
    sender = client.sender
    real = sender.pipeline
    gates: list[anyio.Event] = []

    async def held(calls: Any, **kw: Any) -> list[Any]:
        gate = anyio.Event()
        gates.append(gate)
        await gate.wait()
        return await real(calls, **kw)

    monkeypatch.setattr(sender, "pipeline", held)
    committer = Outbox(client, KEEP_ALL)
    replies: list[Any] = []

    async def claim() -> None:
        op = queue.store.claim_op(count=1, worker="w-test", token_base="tok", default_lease_ms=30_000)
        replies.append((await committer.submit(op, claim=True)).raw)

    async def until(n: int) -> None:
        with anyio.fail_after(5):
            while len(gates) < n:
                await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(committer.run)
        tg.start_soon(claim)
        await until(1)
        tg.start_soon(claim)
        await until(2)  # the second went out with the first still in flight
        tg.start_soon(claim)
        await anyio.sleep(0.1)
        assert len(gates) == 2  # the third waits for a free place
        gates[0].set()
        await until(3)
        gates[1].set()
        gates[2].set()
        with anyio.fail_after(5):
            while len(replies) < 3:
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    assert [len(r) for r in replies] == [2, 2, 2]  # an empty queue's claim: [now, next]


def _failing_completes(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, error: Exception, times: int
) -> list[int]:
    """The committer's pipelines that carry a complete call fail with ``error``, ``times`` times.

    Returns the list of jobs each failed pipeline carried (its complete calls' ARGV[5]).
    """
    sender = queue.client.sender
    real = sender.pipeline
    failed: list[int] = []

    async def flaky(calls: Any, **kw: Any) -> list[Any]:
        carried = sum(int(args[4]) for name, _, args in calls if name == "complete")
        if carried and len(failed) < times:
            failed.append(carried)
            raise error
        return await real(calls, **kw)

    monkeypatch.setattr(sender, "pipeline", flaky)
    return failed


async def test_a_completion_whose_round_trip_fails_is_sent_again_and_lands_once(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slot task hands its completion to the committer and goes on to its next
    # job; a connection error on the way is the committer's to retry, and the
    # job stays on the worker's books (its lease renewed) until it lands.
    from redis.exceptions import ConnectionError as RedisConnectionError

    failed = _failing_completes(queue, monkeypatch, RedisConnectionError("connection lost"), times=2)
    state: dict[str, Any] = {}
    ids = await queue.enqueue_many([Echo(text=str(i)) for i in range(30)])
    worker = await drain(queue, EchoJob, state=state, concurrency=10)

    assert len(failed) == 2 and sum(failed) >= 2
    assert sorted(state["ran"], key=int) == [str(i) for i in range(30)]  # each ran once
    for job_id in ids:
        assert (await events(queue, job_id)).count("completed") == 1
    assert (await queue.counts())["completed"] == 30
    assert not any(r.active for r in worker._runners)


async def test_a_completion_refused_by_an_error_reply_leaves_the_job_to_its_lease(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Not a connection error: nothing is resent, the error is logged, and the
    # worker does not wait for the job (its lease expires and reclaim retries it).
    from redis.exceptions import ResponseError

    _failing_completes(queue, monkeypatch, ResponseError("OOM command not allowed"), times=1)
    job_id = await queue.enqueue(Echo(text="x"))
    with caplog.at_level("ERROR", logger="venturi_redis.worker"):
        worker = await drain(queue, EchoJob, state={}, concurrency=1, lease=0.5, reclaim_interval=0.1)
    assert "internal error completing job" in caplog.text
    assert not any(r.active for r in worker._runners)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED and info.run_count == 2
