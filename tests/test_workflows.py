"""Workflows (issue 31): jobs that wait for other jobs, on redis, memory and cluster.

``enqueue(task, after=[...])``, ``enqueue_flow``, the WAITING state, the
failure policies, cancel both ways, retention racing a waiting job, and the
tree form. The multi-process fan-in with a SIGKILLed worker is
tests/test_workflows_procs.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar, Literal

import anyio
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import venturi_redis as vr
from tests.helpers import claim_raw, claimed_jobs, drain, events
from tests.servers import RedisServer
from venturi_redis._model.codec import pack
from venturi_redis._store import calls
from venturi_redis.cli.commands import app

pytestmark = pytest.mark.anyio


class Step(vr.Task):
    """Records its run in the worker state and returns its name and what it saw."""

    KIND: ClassVar[str] = "wf.step"
    name: str
    fail: Literal["", "permanent", "retry"] = ""


class StepJob(Step, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if self.fail:
            raise vr.TaskError(f"{self.name} fails", permanent=self.fail == "permanent")
        seen = await ctx.dependency_results()
        state.setdefault("ran", []).append(self.name)
        state.setdefault("seen", {})[self.name] = seen
        return vr.Outcome.completed(result={"name": self.name, "saw": sorted(seen)})


class Tolerant(Step):
    KIND: ClassVar[str] = "wf.tolerant"

    def on_dependency_failure(self) -> Literal["fail", "ignore"]:
        return "ignore"


class TolerantJob(Tolerant, vr.Handler[Any]):
    handle = StepJob.handle


class Deduped(Step):
    KIND: ClassVar[str] = "wf.deduped"

    def dedup_key(self) -> str | None:
        return self.name


HANDLERS = (StepJob, TolerantJob)


async def reclaim(queue: vr.Queue) -> None:
    """One reclaim sweep, as a worker's tick runs it."""
    cl = queue.client
    call = calls.reclaim(queue.keys, cl._now_arg(), batch=100, max_failures="none")
    await cl.sender.call(call)


async def run_all(queue: vr.Queue) -> dict[str, Any]:
    state: dict[str, Any] = {}
    await drain(queue, *HANDLERS, state=state)
    return state


async def test_a_chain_of_three_runs_in_order_and_passes_results(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    b = await queue.enqueue(Step(name="b"), after=[a])
    c = await queue.enqueue(Step(name="c"), after=[b])
    info = await queue.get(c)
    assert info is not None and info.state is vr.JobState.WAITING and info.waiting_on == (b,)
    assert (await queue.get(a)).dependents == (b,)  # type: ignore[union-attr]
    assert (await queue.counts())["waiting"] == 2
    assert (await queue.stats()).waiting == 2
    assert [j.id for j in await queue.list_jobs(state="waiting")] == [b, c]

    state = await run_all(queue)

    assert state["ran"] == ["a", "b", "c"]
    assert state["seen"]["b"] == {a: {"name": "a", "saw": []}}
    assert state["seen"]["c"] == {b: {"name": "b", "saw": [a]}}
    done = await queue.get(c)
    assert done is not None and done.state is vr.JobState.COMPLETED and done.waiting_on == ()
    assert (await queue.get(b)).dependents == (c,)  # type: ignore[union-attr]
    journal = await events(queue, c)
    assert journal[:4] == ["enqueued", "waiting", "dependency_completed", "ready"]
    assert (await queue.counts())["waiting"] == 0


async def test_after_a_completed_job_counts_it_done(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    await run_all(queue)
    b = await queue.enqueue(Step(name="b"), after=[a])
    info = await queue.get(b)
    assert info is not None and info.state is vr.JobState.PENDING
    state = await run_all(queue)
    assert state["seen"]["b"] == {a: {"name": "a", "saw": []}}


async def test_after_an_unknown_id_raises_and_writes_nothing(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    with pytest.raises(vr.ConfigurationError, match="no such job"):
        await queue.enqueue(Step(name="b"), after=[a, "01NOSUCHJOB"])
    assert await queue.counts() == {**await queue.counts(), "pending": 1, "waiting": 0}
    assert (await queue.get(a)).dependents == ()  # type: ignore[union-attr]
    with pytest.raises(vr.ConfigurationError, match="list of job ids"):
        await queue.enqueue(Step(name="b"), after=a)  # type: ignore[arg-type]


async def test_after_refuses_a_dedup_key(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    with pytest.raises(vr.ConfigurationError, match="dedup key"):
        await queue.enqueue(Deduped(name="d"), after=[a])
    with pytest.raises(vr.ConfigurationError, match="dedup key"):
        await queue.enqueue_flow(Step(name="p"), [Deduped(name="d")])


@pytest.mark.parametrize("how", ["permanent", "retry"])
async def test_a_failed_dependency_fails_the_chain_below_it(queue: vr.Queue, how: str) -> None:
    # permanent: dead.lua; retry: the retry backstop (retry.lua) kills it.
    a = await queue.enqueue(Step(name="a", fail=how), max_failures=1)  # type: ignore[arg-type]
    b = await queue.enqueue(Step(name="b"), after=[a])
    c = await queue.enqueue(Step(name="c"), after=[b])
    other = await queue.enqueue(Step(name="other"))
    d = await queue.enqueue(Step(name="d"), after=[b, other])
    state = await run_all(queue)
    assert state["ran"] == ["other"]
    for job_id in (b, c, d):
        info = await queue.get(job_id)
        assert info is not None and info.state is vr.JobState.DEAD, job_id
        assert info.waiting_on == ()
    b_info = await queue.get(b)
    assert b_info is not None and b_info.note is not None and a in b_info.note
    c_info = await queue.get(c)
    assert c_info is not None and c_info.note is not None and b in c_info.note
    dead = (await queue.journal(b))[-1]
    assert dead.event == "dead" and dead.details["reason"] == "dependency_failed"
    assert dead.details["dependency"] == a
    assert "dependency_failed" in await events(queue, b)
    # d left the graph when it died: whether `other` completed before (d stays listed
    # in its dependents, which are kept) or after (d was taken out), nothing waits on it.
    assert not await queue.client.redis.exists(queue.keys.deps(d))
    assert (await queue.counts())["waiting"] == 0


async def test_an_ignore_job_runs_without_the_failed_result(queue: vr.Queue) -> None:
    good = await queue.enqueue(Step(name="good"))
    bad = await queue.enqueue(Step(name="bad", fail="permanent"))
    t = await queue.enqueue(Tolerant(name="t"), after=[good, bad])
    state = await run_all(queue)
    assert "t" in state["ran"]
    assert state["seen"]["t"] == {good: {"name": "good", "saw": []}}
    failed = [e for e in await queue.journal(t) if e.event == "dependency_failed"]
    assert [e.details["dependency"] for e in failed] == [bad]
    assert failed[0].details["policy"] == "ignore"
    # After a dead job: refused for a `fail` task, accepted (counted done) for an `ignore` one.
    with pytest.raises(vr.ConfigurationError, match="is dead"):
        await queue.enqueue(Step(name="x"), after=[bad])
    late = await queue.enqueue(Tolerant(name="late"), after=[bad])
    assert (await queue.get(late)).state is vr.JobState.PENDING  # type: ignore[union-attr]


async def test_cancelling_a_waiting_job_releases_it_from_the_graph(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    b = await queue.enqueue(Step(name="b"), after=[a])
    c = await queue.enqueue(Step(name="c"), after=[b])
    assert await queue.cancel(b) == "cancelled"
    assert (await queue.get(a)).dependents == ()  # type: ignore[union-attr]
    info = await queue.get(b)
    assert info is not None and info.state is vr.JobState.CANCELLED and info.waiting_on == ()
    # c waited on b, which is cancelled: its `fail` policy applies.
    c_info = await queue.get(c)
    assert c_info is not None and c_info.state is vr.JobState.DEAD
    state = await run_all(queue)
    assert state["ran"] == ["a"]
    assert await queue.counts() == {**await queue.counts(), "waiting": 0, "dead": 1, "cancelled": 1}


async def test_cancelling_a_dependency_applies_each_dependents_policy(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    strict = await queue.enqueue(Step(name="strict"), after=[a])
    tolerant = await queue.enqueue(Tolerant(name="tolerant"), after=[a])
    assert await queue.cancel(a) == "cancelled"
    assert (await queue.get(strict)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    assert (await queue.get(tolerant)).state is vr.JobState.PENDING  # type: ignore[union-attr]
    state = await run_all(queue)
    assert state["ran"] == ["tolerant"] and state["seen"]["tolerant"] == {}


async def test_retention_purging_a_dependency_does_not_lose_its_result(queue: vr.Queue) -> None:
    c = await queue.enqueue(Step(name="c"))
    late = await queue.enqueue(Step(name="late"), after=[c])
    # c completes (by hand, no worker), and retention purges it before `late`
    # runs: the result copied at completion is what late reads.
    ((claimed, token),) = claimed_jobs(await claim_raw(queue, 1))
    assert claimed == c
    cl = queue.client
    result = pack({"name": "c"})
    done = calls.complete(queue.keys, cl._now_arg(), [calls.completion(c, token, "", b"", b"", result)])
    assert calls.completed(await cl.sender.call(done)) == [calls.APPLIED]
    assert await queue.purge("completed") == 1
    assert await queue.get(c) is None
    assert (await queue.get(late)).state is vr.JobState.PENDING  # type: ignore[union-attr]
    state = await run_all(queue)
    assert state["seen"]["late"] == {c: {"name": "c"}}
    # The waiting job's own workflow keys go when it is purged in turn.
    assert await queue.purge("completed") == 1
    assert not await cl.redis.exists(queue.keys.depresults(late), queue.keys.dependents(c))


async def test_enqueue_flow_is_one_atomic_step_and_nests(queue: vr.Queue) -> None:
    pages = [Step(name=f"page{i}") for i in range(5)]
    flow = await queue.enqueue_flow(Step(name="report"), pages)
    assert isinstance(flow, vr.Flow) and len(flow.children_ids) == 5
    assert (await queue.get(flow.parent_id)).waiting_on == tuple(sorted(flow.children_ids))  # type: ignore[union-attr]
    top = await queue.enqueue_flow(Step(name="top"), [flow, Step(name="side")])
    assert top.children_ids[0] == flow.parent_id
    state = await run_all(queue)
    assert state["ran"][-2:] == ["report", "top"]
    assert set(state["seen"]["report"]) == set(flow.children_ids)
    assert state["seen"]["report"][flow.children_ids[0]] == {"name": "page0", "saw": []}
    assert set(state["seen"]["top"]) == set(top.children_ids)


async def test_a_flow_with_an_unknown_subflow_writes_nothing(queue: vr.Queue) -> None:
    ghost = vr.Flow(parent_id="01GHOST", children_ids=())
    with pytest.raises(vr.ConfigurationError, match="01GHOST"):
        await queue.enqueue_flow(Step(name="p"), [Step(name="c"), ghost])
    counts = await queue.counts()
    assert counts["pending"] == 0 and counts["waiting"] == 0


async def test_a_dead_dependency_retried_later_tells_nobody_twice(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a", fail="permanent"))
    t = await queue.enqueue(Tolerant(name="t"), after=[a])
    await run_all(queue)
    assert (await queue.get(t)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]
    assert await queue.retry(a)
    await run_all(queue)
    entries = [e.event for e in await queue.journal(t)]
    assert entries.count("dependency_failed") == 1 and entries.count("claimed") == 1


async def test_a_job_that_died_unstarted_completes_without_the_operators_note(queue: vr.Queue) -> None:
    """Its first run follows an operator's retry: the completion drops the retry's note
    (complete.lua's first-run path once kept it)."""
    a = await queue.enqueue(Step(name="a", fail="permanent"))
    b = await queue.enqueue(Step(name="b"), after=[a])
    await run_all(queue)
    dead = await queue.get(b)
    assert dead is not None and dead.state is vr.JobState.DEAD and dead.run_count == 0
    assert await queue.retry(b)
    assert (await queue.get(b)).note == "retried by an operator"  # type: ignore[union-attr]
    await run_all(queue)
    done = await queue.get(b)
    assert done is not None and (done.state, done.run_count, done.note) == (vr.JobState.COMPLETED, 1, None)


async def test_sharded_queue_refuses_after(client: vr.Client, queue_name: str) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=3)
    with pytest.raises(vr.ConfigurationError, match="after="):
        await sharded.enqueue(Step(name="a"), after=["x"])


def test_venturi_job_show_lists_dependencies_both_ways(redis_server: RedisServer) -> None:
    name = f"wfcli-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(redis_server.url) as sc:
        sq = sc.queue(name)
        a = sq.enqueue(Step(name="a"))
        b = sq.enqueue(Step(name="b"), after=[a])
    cli = CliRunner()
    shown = cli.invoke(app, ["job", "show", b, "--redis", redis_server.url, "-q", name])
    assert shown.exit_code == 0, shown.output
    assert "waiting on" in shown.stdout and a in shown.stdout and "waiting" in shown.stdout
    stats = json.loads(cli.invoke(app, ["stats", "--redis", redis_server.url, "-q", name, "--json"]).stdout)
    assert stats[0]["waiting"] == 1
    other = cli.invoke(app, ["job", "show", a, "--redis", redis_server.url, "--json"])
    doc = json.loads(other.stdout)
    assert doc["job"]["dependents"] == [b] and doc["job"]["waiting_on"] == []


async def test_the_dashboard_job_page_shows_dependencies_both_ways(redis_server: RedisServer) -> None:
    httpx = pytest.importorskip("httpx")
    from venturi_redis.dashboard import create_app

    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}")
    try:
        queue = client.queue("wf")
        a = await queue.enqueue(Step(name="a"))
        b = await queue.enqueue(Step(name="b"), after=[a])
        transport = httpx.ASGITransport(app=create_app(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
            page = await h.get(f"/queues/wf/jobs/{b}")
            assert page.status_code == 200
            assert "waiting on" in page.text and f"/queues/wf/jobs/{a}" in page.text
            assert "waiting 1" in (await h.get("/queues/wf")).text
            listed = (await h.get("/api/queues/wf/jobs", params={"state": "waiting"})).json()
            assert [j["id"] for j in listed["jobs"]] == [b]
            up = await h.get(f"/queues/wf/jobs/{a}")
            assert "dependents" in up.text and f"/queues/wf/jobs/{b}" in up.text
    finally:
        await client.aclose()


async def test_the_event_stream_tells_a_flow_as_its_journals_do(queue: vr.Queue) -> None:
    await queue.set_events(True)
    flow = await queue.enqueue_flow(Step(name="p"), [Step(name="c")])
    await run_all(queue)
    raw = await queue.client.redis.xrange(queue.keys.events)
    seen = [(f[b"event"].decode(), f[b"job"].decode()) for _, f in raw]
    (child,) = flow.children_ids
    parent = flow.parent_id
    for expected in [
        ("enqueued", child),
        ("enqueued", parent),
        ("waiting", parent),
        ("completed", child),
        ("dependency_completed", parent),
        ("ready", parent),
        ("completed", parent),
    ]:
        assert expected in seen, expected
    assert seen.index(("dependency_completed", parent)) < seen.index(("completed", parent))


async def test_a_cancel_finished_by_the_claim_applies_the_policy(queue: vr.Queue) -> None:
    """A cancel requested while the job ran, whose run then ended otherwise (here
    released): the claim that would run it again finishes the cancel, and its
    dependents are told by the next reclaim sweep."""
    a = await queue.enqueue(Step(name="a"))
    strict = await queue.enqueue(Step(name="strict"), after=[a])
    tolerant = await queue.enqueue(Tolerant(name="tolerant"), after=[a])
    ((_, token),) = claimed_jobs(await claim_raw(queue, 1))
    assert await queue.cancel(a) == "requested"
    cl = queue.client
    release = calls.release(
        queue.keys,
        cl._now_arg(),
        job_id=a,
        token=token,
        priority=vr.Priority.NORMAL,
        carry=b"",
        note="released",
    )
    assert calls.transition(await cl.sender.call(release)).applied
    await claim_raw(queue, 1)  # finishes the cancel instead of running it
    assert (await queue.get(a)).state is vr.JobState.CANCELLED  # type: ignore[union-attr]
    # The claim leaves the telling to the next reclaim sweep (graph.lua graph_orphaned).
    assert (await queue.get(strict)).state is vr.JobState.WAITING  # type: ignore[union-attr]
    assert await cl.redis.smembers(queue.keys.prefix + "graph:orphans") == {a.encode()}
    await reclaim(queue)
    assert not await cl.redis.exists(queue.keys.prefix + "graph:orphans")
    assert (await queue.get(strict)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    state = await run_all(queue)
    assert state["ran"] == ["tolerant"]
    assert (await queue.get(tolerant)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_a_quarantined_dependency_fails_its_dependents(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    b = await queue.enqueue(Step(name="b"), after=[a])
    await queue.client.redis.hset(queue.keys.job(a), "priority", "bogus")  # corrupt data
    await claim_raw(queue, 1)
    assert (await queue.get(a)).state is vr.JobState.DEAD  # type: ignore[union-attr]
    await reclaim(queue)
    info = await queue.get(b)
    assert info is not None and info.state is vr.JobState.DEAD and info.note is not None
    assert a in info.note and "bogus" in info.note


class Total(BaseModel):
    amount: float


async def _total(n: int) -> Total:
    return Total(amount=n * 1.5)


async def test_an_offload_dependencys_result_comes_back_typed(client: vr.Client, queue: vr.Queue) -> None:
    fn = vr.offload(queue=queue.name, kind="wf.total")(_total)
    handle = await fn.offload(client, 2)
    after = await queue.enqueue(Step(name="after"), after=[handle.job_id])
    state: dict[str, Any] = {}
    worker = vr.Worker(queue, handle_signals=False, poll_interval=0.2, state=state)
    worker.register(fn, StepJob)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert state["seen"]["after"] == {handle.job_id: Total(amount=3.0)}
    assert (await queue.get(after)).result == {"name": "after", "saw": [handle.job_id]}  # type: ignore[union-attr]


async def test_enqueue_flow_caps_its_children(queue: vr.Queue) -> None:
    from venturi_redis._producer.flow import MAX_FLOW_JOBS

    too_many = [Step(name="c")] * (MAX_FLOW_JOBS + 1)
    with pytest.raises(vr.ConfigurationError, match="at most"):
        await queue.enqueue_flow(Step(name="p"), too_many)
    assert (await queue.counts())["pending"] == 0


class Keyed(Step):
    KIND: ClassVar[str] = "wf.keyed"

    def limit_key(self) -> str | None:
        return f"tenant-{self.name}"

    def timeout(self) -> float | None:
        return 5.0


async def test_a_workflow_job_keeps_its_limit_key_and_timeout(queue: vr.Queue) -> None:
    a = await queue.enqueue(Step(name="a"))
    b = await queue.enqueue(Keyed(name="b"), after=[a], timeout=2.5)
    flow = await queue.enqueue_flow(Keyed(name="p"), [Keyed(name="c")])
    redis = queue.client.redis

    async def stored(job_id: str) -> list[Any]:
        return list(await redis.hmget(queue.keys.job(job_id), "limit_key", "timeout_ms"))

    # As a plain enqueue stores them.
    assert await stored(b) == await stored(await queue.enqueue(Keyed(name="b"), timeout=2.5))
    for job_id, name in ((flow.parent_id, "p"), (flow.children_ids[0], "c")):
        plain = await stored(await queue.enqueue(Keyed(name=name)))
        assert await stored(job_id) == plain and plain[1] == b"5000" and plain[0]
