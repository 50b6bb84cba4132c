"""Flow control (issue 28): limits enforced at claim time, slots given back, fairness, timeouts.

Contract tests on redis, memory and cluster. The claim-level tests drive the
scripts directly with a fake clock (``tests/helpers.claim_raw``), so rate
windows are exact and nothing sleeps; the timeout tests run a real worker.
The multi-process checks are in tests/test_flow_processes.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import anyio
import pytest

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from tests.servers import RedisServer
from venturi_redis._store import calls

pytestmark = pytest.mark.anyio

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Mail(vr.Task):
    KIND: ClassVar[str] = "mail"
    domain: str | None = None
    n: int = 0

    def limit_key(self) -> str | None:
        return self.domain


class Other(vr.Task):
    KIND: ClassVar[str] = "other"
    n: int = 0


@pytest.fixture
async def timed(url: str, queue_name: str) -> AsyncIterator[tuple[vr.Queue, Clock]]:
    clock = Clock(T0)
    async with vr.Client.from_url(url, clock=clock) as c:
        yield c.queue(queue_name), clock


async def claim(q: vr.Queue, count: int, worker: str = "w1") -> tuple[int, list[tuple[str, str, str]]]:
    """claim.lua: (next, [(id, kind, token)...])."""
    c = q.client
    call = calls.claim(
        q.keys, c._now_arg(), count=count, worker=worker, token_base="t", default_lease_ms=10_000
    )
    reply = list(await c.sender.call(call))
    jobs = [(job[0], job[1], job[6]) for job in calls.claim_reply(reply, "t").jobs()]
    return int(reply[1]), jobs


async def complete(q: vr.Queue, job_id: str, token: str) -> None:
    c = q.client
    call = calls.complete(q.keys, c._now_arg(), [calls.completion(job_id, token, "", b"", b"", b"")])
    assert calls.completed(await c.sender.call(call)) == [calls.APPLIED]


async def run(q: vr.Queue, call: calls.Call) -> Any:
    return await q.client.sender.call(call)


async def limit_of(q: vr.Queue, kind: str, per_key: bool = False) -> vr.LimitInfo:
    return next(info for info in await q.limits() if info.kind == kind and info.per_key is per_key)


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"concurrency": -1},
        {"concurrency": True},
        {"concurrency": 2.5},
        {"concurrency": "3"},
        {"rate": (5, 1)},
        {},
        {"concurrency": 1, "per_key": "yes"},
    ],
)
async def test_bad_limits_are_refused_and_nothing_is_written(
    client: vr.Client, queue_name: str, kwargs: dict[str, Any]
) -> None:
    q = client.queue(queue_name)
    with pytest.raises(vr.ConfigurationError):
        await q.set_limit("mail", **kwargs)
    assert await q.limits() == []
    assert await client.redis.exists(q.keys.limits, q.keys.meta) == 0


@pytest.mark.parametrize("kind", ["", "a\tb", "x" * 300, 7])
async def test_a_kind_that_is_no_task_kind_is_refused(client: vr.Client, queue_name: str, kind: Any) -> None:
    q = client.queue(queue_name)
    with pytest.raises(vr.ConfigurationError):
        await q.set_limit(kind, concurrency=1)
    with pytest.raises(vr.ConfigurationError):
        await q.clear_limit(kind)
    assert await client.redis.exists(q.keys.limits) == 0


@pytest.mark.parametrize(
    ("count", "per"), [(0, 1), (-1, 1), (1, 0), (1, -2), (1, math.nan), (1, math.inf), (True, 1)]
)
def test_a_bad_rate_is_refused(count: Any, per: Any) -> None:
    with pytest.raises(vr.ConfigurationError):
        vr.Rate(count, per)


@pytest.mark.parametrize("key", [b"bytes", 5, "x" * 1025])
async def test_a_bad_limit_key_is_refused_at_enqueue(client: vr.Client, queue_name: str, key: Any) -> None:
    class Bad(vr.Task):
        KIND: ClassVar[str] = "bad-key"

        def limit_key(self) -> Any:
            return key

    q = client.queue(queue_name)
    with pytest.raises(vr.ConfigurationError):
        await q.enqueue(Bad())
    with pytest.raises(vr.ConfigurationError):
        await q.enqueue_many([Bad()])
    assert await q.is_drained()


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, "5", True, timedelta(0)])
async def test_a_bad_timeout_is_refused(client: vr.Client, queue_name: str, timeout: Any) -> None:
    q = client.queue(queue_name)
    with pytest.raises(vr.ConfigurationError):
        await q.enqueue(Other(), timeout=timeout)
    assert await q.is_drained()
    with pytest.raises(vr.ConfigurationError):
        vr.Worker(q, timeout=timeout, handle_signals=False)


# -- kind-wide limits ------------------------------------------------------------------


async def test_kind_concurrency_caps_claims_and_a_finished_run_frees_its_slot(
    timed: tuple[vr.Queue, Clock],
) -> None:
    q, _clock = timed
    await q.set_limit("mail", concurrency=2)
    await q.enqueue_many([Mail(n=i) for i in range(5)])
    await q.enqueue_many([Other(n=i) for i in range(2)])
    nxt, got = await claim(q, 10)
    assert sorted(k for _, k, _ in got) == ["mail", "mail", "other", "other"]
    assert nxt == 0  # waiting on a slot: no time to come back at
    info = await limit_of(q, "mail")
    assert (info.concurrency, info.rate, info.running, info.waiting) == (2, None, 2, 3)
    assert (await claim(q, 10))[1] == []
    mail = [(i, t) for i, k, t in got if k == "mail"]
    await complete(q, *mail[0])
    again = (await claim(q, 10))[1]
    assert [k for _, k, _ in again] == ["mail"]
    assert (await limit_of(q, "mail")).running == 2
    assert (await q.stats()).limited == 2


async def test_kind_rate_allows_count_starts_per_window(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.set_limit("mail", rate=vr.Rate(2, 1))
    await q.enqueue_many([Mail(n=i) for i in range(5)])
    nxt, got = await claim(q, 10)
    assert len(got) == 2
    assert nxt == T0 + 1000  # when the window rolls: the idle fleet sleeps until then
    clock.ms += 999
    assert (await claim(q, 10))[1] == []
    clock.ms += 1
    assert len((await claim(q, 10))[1]) == 2
    clock.ms += 500
    assert (await claim(q, 10))[1] == []
    clock.ms += 500
    assert len((await claim(q, 10))[1]) == 1
    assert await q.is_drained() is False  # running


async def test_a_limit_set_while_jobs_wait_in_pending_parks_them(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.enqueue_many([Mail(n=i) for i in range(4)], delay=0.001)  # pending, not parked
    await q.set_limit("mail", concurrency=1)
    clock.ms += 1
    assert len((await claim(q, 10))[1]) == 1
    assert (await limit_of(q, "mail")).waiting == 3
    assert (await claim(q, 10))[1] == []


async def test_raising_or_clearing_a_cap_frees_waiting_jobs_at_once(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=1)
    await q.enqueue_many([Mail(n=i) for i in range(6)])
    assert len((await claim(q, 10))[1]) == 1
    await q.set_limit("mail", concurrency=3)
    assert len((await claim(q, 10))[1]) == 2
    assert await q.clear_limit("mail") is True
    assert await q.clear_limit("mail") is False
    assert len((await claim(q, 10))[1]) == 3
    assert await q.limits() == []


# -- per-key limits and fairness ---------------------------------------------------------


async def test_per_key_concurrency_runs_distinct_keys_in_parallel(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=1, per_key=True)
    await q.enqueue_many([Mail(domain="a.com", n=i) for i in range(5)])
    await q.enqueue_many([Mail(domain="b.com", n=i) for i in range(2)])
    await q.enqueue(Mail(domain=None))  # no key: the per-key cap does not apply
    _, got = await claim(q, 10)
    assert len(got) == 3
    info = await limit_of(q, "mail", per_key=True)
    assert (info.running, info.waiting) == (2, 5)
    assert (await claim(q, 10))[1] == []
    first = {(await q.get(i)).id: (i, t) for i, _, t in got}  # type: ignore[union-attr]
    for job_id, token in first.values():
        await complete(q, job_id, token)
    assert len((await claim(q, 10))[1]) == 2  # one more of each key


async def test_a_key_that_arrives_late_is_not_starved(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.set_limit("mail", concurrency=1000, per_key=True)
    await q.enqueue_many([Mail(domain="big", n=i) for i in range(60)])
    clock.ms += 1
    small = await q.enqueue_many([Mail(domain="small", n=i) for i in range(3)])
    order: list[str] = []
    for _ in range(8):
        clock.ms += 1
        order += [i for i, _, _ in (await claim(q, 1))[1]]
    # Claims alternate between the keys: the small key's jobs are all among the first six.
    assert set(small) <= set(order[:6])


async def test_priority_orders_jobs_within_a_key(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=5, per_key=True)
    low = await q.enqueue(Mail(domain="a", n=1), priority="low")
    crit = await q.enqueue(Mail(domain="a", n=2), priority="critical")
    normal = await q.enqueue(Mail(domain="a", n=3))
    assert [i for i, _, _ in (await claim(q, 3))[1]] == [crit, normal, low]


async def test_per_key_rate(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.set_limit("mail", rate=vr.Rate(1, 10), per_key=True)
    await q.enqueue_many([Mail(domain=d, n=i) for d in ("a", "b") for i in range(3)])
    nxt, got = await claim(q, 10)
    assert len(got) == 2 and nxt == T0 + 10_000
    clock.ms += 10_000
    assert len((await claim(q, 10))[1]) == 2


async def test_kind_and_per_key_limits_combine(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=3)
    await q.set_limit("mail", concurrency=1, per_key=True)
    await q.enqueue_many([Mail(domain=d, n=i) for d in ("a", "b", "c", "d") for i in range(2)])
    _, got = await claim(q, 10)
    assert len(got) == 3
    assert len({(await q.get(i)).payload["domain"] for i, _, _ in got}) == 3  # type: ignore[union-attr]
    await complete(q, *next((i, t) for i, _, t in got))
    assert len((await claim(q, 10))[1]) == 1


# -- no slot is leaked --------------------------------------------------------------------


def _ending(q: vr.Queue, job_id: str, token: str) -> dict[str, calls.Call]:
    k, now, p = q.keys, q.client._now_arg(), vr.Priority.NORMAL
    return {
        "complete": calls.complete(k, now, [calls.completion(job_id, token, "", b"", b"", b"")]),
        "retry": calls.retry(
            k,
            now,
            job_id=job_id,
            token=token,
            priority=p,
            note="boom",
            attachment=b"",
            carry=b"",
            base_ms=1,
            cap_ms=1,
            jitter=0.0,
            max_failures="none",
        ),
        "dead": calls.dead(
            k, now, job_id=job_id, token=token, note="x", attachment=b"", carry=b"", reason="permanent"
        ),
        "pause": calls.pause(
            k, now, job_id=job_id, token=token, priority=p, delay_ms=0, note="", attachment=b"", carry=b""
        ),
        "suspend": calls.suspend(
            k, now, job_id=job_id, token=token, note="", attachment=b"", carry=b"", output=b""
        ),
        "cancel": calls.cancel(k, now, job_id=job_id, note="n", token=token),
        "release": calls.release(k, now, job_id=job_id, token=token, priority=p, carry=b"", note=""),
        "reclaim": calls.reclaim(k, now, batch=10, max_failures="none"),
    }


@pytest.mark.parametrize(
    "ending", ["complete", "retry", "dead", "pause", "suspend", "cancel", "release", "reclaim"]
)
async def test_every_ending_of_a_run_gives_its_slots_back(timed: tuple[vr.Queue, Clock], ending: str) -> None:
    q, clock = timed
    await q.set_limit("mail", concurrency=1)
    await q.set_limit("mail", concurrency=1, per_key=True)
    await q.enqueue_many([Mail(domain="a", n=i) for i in range(2)])
    ((job_id, _, token),) = (await claim(q, 10))[1]
    assert (await limit_of(q, "mail")).running == 1
    assert (await claim(q, 10))[1] == []
    if ending == "reclaim":
        clock.ms += 20_000  # past the lease
    await run(q, _ending(q, job_id, token)[ending])
    assert (await limit_of(q, "mail")).running == 0
    assert (await limit_of(q, "mail", per_key=True)).running == 0
    assert "slot" not in (await q.client.redis.hgetall(q.keys.job(job_id)))
    # The waiting job (or the one put back) runs now.
    assert len((await claim(q, 10))[1]) == 1


async def test_a_parked_job_can_be_cancelled(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=1)
    # Jobs with a limit key are parked at enqueue (those without, by the first claim).
    first, second = await q.enqueue_many([Mail(domain="a", n=1), Mail(domain="a", n=2)])
    assert await q.cancel(second) == "cancelled"
    assert (await limit_of(q, "mail")).waiting == 1
    assert [i for i, _, _ in (await claim(q, 10))[1]] == [first]
    assert (await limit_of(q, "mail")).waiting == 0


async def test_workers_drain_a_limited_queue(client: vr.Client, queue_name: str) -> None:
    q = client.queue(queue_name)

    class MailJob(Mail, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
            await anyio.sleep(0.01)
            return vr.Outcome.completed()

    await q.set_limit("mail", concurrency=2, rate=vr.Rate(50, 1))
    await q.set_limit("mail", concurrency=1, per_key=True)
    ids = await q.enqueue_many([Mail(domain=f"d{i % 3}", n=i) for i in range(12)])
    await drain(q, MailJob, concurrency=8)
    assert {(await q.get(i)).state for i in ids} == {vr.JobState.COMPLETED}  # type: ignore[union-attr]
    assert (await limit_of(q, "mail")).running == 0


# -- timeouts --------------------------------------------------------------------------------


class Slow(vr.Task):
    KIND: ClassVar[str] = "slow"
    seconds: float = 30.0

    def timeout(self) -> float | None:
        return 0.05


class SlowJob(Slow, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
        await anyio.sleep(self.seconds)
        return vr.Outcome.completed()


async def test_a_run_past_its_timeout_fails_then_dies_at_the_backstop(
    client: vr.Client, queue_name: str
) -> None:
    q = client.queue(queue_name)
    job_id = await q.enqueue(Slow(), max_failures=2)
    await drain(q, SlowJob)
    info = await q.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD and info.failures == 2
    failed = [e for e in await q.journal(job_id) if e.event == "failed"]
    assert len(failed) == 2
    assert all(e.note == "timed out after 0.05 s" for e in failed)
    assert (await events(q, job_id))[-1] == "dead"


class Swallower(vr.Task):
    KIND: ClassVar[str] = "swallow"
    outcome: str = "completed"

    def timeout(self) -> float | None:
        return 0.05


class SwallowerJob(Swallower, vr.Handler[Any]):
    """Catches its timeout's cancellation and returns an outcome anyway."""

    async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            pass
        if self.outcome == "pause":
            return vr.Outcome.pause_in(0)
        return vr.Outcome.completed_with("done, honest")


@pytest.mark.parametrize("outcome", ["completed", "pause"])
async def test_a_handler_that_swallows_its_timeout_is_still_a_failed_run(
    client: vr.Client, queue_name: str, outcome: str
) -> None:
    """Issue 38, item 7: the run overran its timeout; what the handler returned after
    catching the cancellation does not make it a completed (or paused) run."""
    q = client.queue(queue_name)
    job_id = await q.enqueue(Swallower(outcome=outcome), max_failures=1)
    await drain(q, SwallowerJob)
    info = await q.get(job_id)
    assert info is not None and info.state == vr.JobState.DEAD and info.failures == 1
    journal = await q.journal(job_id)
    assert [e.note for e in journal if e.event == "failed"] == ["timed out after 0.05 s"]
    assert not [e for e in journal if e.event in ("completed", "paused")]


async def test_enqueue_timeout_overrides_the_task_and_the_worker_default_applies(
    client: vr.Client, queue_name: str
) -> None:
    q = client.queue(queue_name)
    quick = await q.enqueue(Slow(seconds=0.3), timeout=5, max_failures=1)
    cut = await q.enqueue(Other(), max_failures=1)

    class OtherJob(Other, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
            await anyio.sleep(30)
            return vr.Outcome.completed()

    worker = make_worker(q, SlowJob, OtherJob, timeout=0.1)
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    assert (await q.get(quick)).state == vr.JobState.COMPLETED  # type: ignore[union-attr]
    other = await q.get(cut)
    assert other is not None and other.state == vr.JobState.DEAD
    assert [e.note for e in await q.journal(cut) if e.event == "failed"] == ["timed out after 0.1 s"]


# -- the CLI --------------------------------------------------------------------------------------


def test_cli_limits_set_clear_and_stats(redis_server: RedisServer, queue_name: str) -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    url = redis_server.url
    with vr.SyncClient(url) as sc:
        sc.queue(queue_name).enqueue(Mail(domain="a"))

    def venturi(*args: str) -> Any:
        return CliRunner().invoke(app, [*args, "--redis", url, "-q", queue_name])

    res = venturi("limit", "set", "mail", "--concurrency", "3", "--rate", "100/s")
    assert res.exit_code == 0, res.output
    assert venturi("limit", "set", "mail", "--per-key", "--concurrency", "1").exit_code == 0
    assert venturi("limit", "set", "mail", "--rate", "ten").exit_code == 2  # a usage error
    assert venturi("limit", "set", "mail", "--concurrency", "0").exit_code == 2
    res = venturi("limits", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [(r["kind"], r["per_key"], r["concurrency"], r["rate"]) for r in rows] == [
        ("mail", False, 3, {"count": 100, "per_seconds": 1.0}),
        ("mail", True, 1, None),
    ]
    assert "per key" in venturi("limits").output
    assert venturi("limit", "clear", "mail", "--per-key").exit_code == 0
    assert venturi("limit", "clear", "mail", "--per-key").exit_code == 1  # nothing to clear
    with vr.SyncClient(url) as sc:
        sq = sc.queue(queue_name)
        sq.enqueue(Mail(domain="b"))  # a limit key: parked at enqueue
    res = venturi("stats", "--json")
    assert json.loads(res.output)[0]["limited"] == 1
    assert "limited" in venturi("stats").output


async def test_a_workflow_job_gets_its_task_timeout(client: vr.Client, queue_name: str) -> None:
    """enqueue(after=...) stores no timeout: the worker asks the task itself."""

    class QuickOther(Other, vr.Handler[Any]):
        async def handle(self, ctx: vr.Context[Any], state: Any) -> vr.Outcome:
            return vr.Outcome.completed()

    q = client.queue(queue_name)
    first = await q.enqueue(Other())
    job = await q.enqueue(Slow(), after=[first], max_failures=1)
    await drain(q, QuickOther, SlowJob)
    assert [e.note for e in await q.journal(job) if e.event == "failed"] == ["timed out after 0.05 s"]


async def test_parked_jobs_are_counted_and_listed_as_pending(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("mail", concurrency=1, per_key=True)
    ids = await q.enqueue_many([Mail(domain="a", n=i) for i in range(3)])
    other = await q.enqueue(Other())
    counts = await q.counts()
    assert (counts["limited"], counts["pending"], counts["pending:normal"]) == (3, 4, 1)
    listed = [j.id for j in await q.list_jobs(state="pending")]
    assert listed == [other, *ids]
    assert all(j.state == vr.JobState.PENDING for j in await q.list_jobs(state="pending"))
    assert not await q.is_drained()


async def test_keys_waiting_on_the_kind_cap_go_first_come_first_served(timed: tuple[vr.Queue, Clock]) -> None:
    q, clock = timed
    await q.set_limit("mail", concurrency=2)
    await q.set_limit("mail", concurrency=1, per_key=True)
    for domain in ("a", "b", "c", "d", "e"):
        clock.ms += 1
        await q.enqueue_many([Mail(domain=domain, n=i) for i in range(2)])

    async def domains(got: list[tuple[str, str, str]]) -> list[str]:
        return [(await q.get(i)).payload["domain"] for i, _, _ in got]  # type: ignore[union-attr]

    clock.ms += 1
    _, got = await claim(q, 10)
    assert await domains(got) == ["a", "b"]  # c, d, e wait on the kind's cap, in that order
    order = []
    running = {d: (i, t) for d, (i, _, t) in zip(await domains(got), got, strict=True)}
    for _ in range(6):
        first = sorted(running)[0]
        await complete(q, *running.pop(first))
        clock.ms += 1
        _, got = await claim(q, 10)
        assert len(got) == 1  # every freed slot is used at once
        (d,) = await domains(got)
        order.append(d)
        running[d] = (got[0][0], got[0][2])
    assert order[:3] == ["c", "d", "e"]  # the keys that waited, before a and b's second jobs


async def test_enqueue_many_reads_each_tasks_own_timeout_and_key(client: vr.Client, queue_name: str) -> None:
    q = client.queue(queue_name)
    slow, other, mail = await q.enqueue_many([Slow(), Other(), Mail(domain="x.org")])
    fields = [await client.redis.hmget(q.keys.job(i), "timeout_ms", "limit_key") for i in (slow, other, mail)]
    assert fields == [[b"50", None], [None, None], [None, b"5:x.org"]]
    forced = await q.enqueue_many([Slow(), Other()], timeout=2)
    assert [await client.redis.hget(q.keys.job(i), "timeout_ms") for i in forced] == [b"2000", b"2000"]


class Digest(Mail):
    KIND: ClassVar[str] = "digest"

    def dedup_key(self) -> str | None:
        return f"digest-{self.n}"


async def test_a_dedup_merge_moves_a_parked_job_to_its_new_priority(timed: tuple[vr.Queue, Clock]) -> None:
    q, _ = timed
    await q.set_limit("digest", concurrency=1, per_key=True)
    low = await q.enqueue(Digest(domain="a", n=1), priority="low")
    other = await q.enqueue(Digest(domain="a", n=2))
    assert await q.enqueue(Digest(domain="a", n=1), priority="critical") == low  # merged into the parked job
    info = await q.get(low)
    assert info is not None and info.priority == vr.Priority.CRITICAL
    assert [i for i, _, _ in (await claim(q, 10))[1]] == [low]  # critical first within its key
    assert (await limit_of(q, "digest", per_key=True)).waiting == 1 and other
