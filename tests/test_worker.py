"""Worker runtime: fencing, reclaim, shutdown, signals, wake-ups, several queues."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import drain, events, make_worker
from tests.procs.worker import Hang, HangJob
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis._store import calls
from venturi_redis._store.scripts import ScriptSet
from venturi_redis._worker import gc_tuning

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


class Tally(BaseModel):
    by: str = ""


class Race(vr.Task[Tally]):
    KIND: ClassVar[str] = "race"


class RaceJob(Race, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[Tally], state: dict[str, Any]) -> vr.Outcome:
        ctx.carry.by = state["name"]
        state["started"].set()
        await state["go"].wait()
        return vr.Outcome.completed_with(f"done by {state['name']}")


@contextlib.contextmanager
def worker_process(url: str, queue_name: str, *, lease: float) -> Iterator[subprocess.Popen[str]]:
    """A tests.procs.worker process; killed and its pipe closed on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.procs.worker", url, queue_name, str(lease)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def wait_for(queue: vr.Queue, job_id: str, pred: Any, timeout: float = 10) -> vr.JobInfo:
    with anyio.fail_after(timeout):
        while True:
            info = await queue.get(job_id)
            if info is not None and pred(info):
                return info
            await anyio.sleep(0.02)


async def test_stale_worker_cannot_complete_a_job_it_lost(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker A stops renewing (as if hung); B reclaims and finishes; A's late completion is refused."""
    job_id = await queue.enqueue(Race())
    a_state = {"name": "A", "started": anyio.Event(), "go": anyio.Event()}
    b_state = {"name": "B", "started": anyio.Event(), "go": anyio.Event()}
    b_state["go"].set()
    # concurrency=1: A stays busy with its stale run and cannot claim the job back
    a = make_worker(queue, RaceJob, state=a_state, lease=0.4, reclaim_interval=3600, concurrency=1)
    b = make_worker(queue, RaceJob, state=b_state, lease=5, reclaim_interval=0.1)

    async def no_renewal() -> None:
        return None

    a._runners[0].extend = no_renewal  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        with anyio.fail_after(10):
            await a_state["started"].wait()
        tg.start_soon(b.run)
        done = await wait_for(queue, job_id, lambda i: i.state == vr.JobState.COMPLETED)
        a_state["go"].set()  # A wakes up, late, and tries to complete
        with anyio.fail_after(10):
            while "refused" not in await events(queue, job_id):
                await anyio.sleep(0.02)
        a.shutdown()
        b.shutdown()
    final = await queue.get(job_id)
    assert final is not None
    assert final == done  # A's refused completion wrote nothing but the journal entry
    assert (final.note, final.carry, final.run_count, final.failures) == ("done by B", {"by": "B"}, 2, 1)
    journal = await queue.journal(job_id)
    assert [e.event for e in journal] == [
        "enqueued",
        "claimed",
        "lease_expired",
        "claimed",
        "completed",
        "refused",
    ]
    assert journal[-1].details["attempted"] == "complete"
    assert "job is completed" in (journal[-1].note or "")
    assert any("refused" in r.getMessage() for r in caplog.records)


async def test_periodic_reclaim_of_a_dead_workers_job(client: vr.Client, queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Echo(text="orphan"))
    # A "ghost" worker claims with a short lease and then never comes back.
    call = calls.claim(queue.keys, "", count=1, worker="ghost", token_base="tok", default_lease_ms=200)
    await client.sender.call(call)
    assert (await queue.get(job_id)).state == vr.JobState.RUNNING  # type: ignore[union-attr]
    worker = make_worker(queue, EchoJob, reclaim_interval=0.1, poll_interval=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        info = await wait_for(queue, job_id, lambda i: i.state == vr.JobState.COMPLETED)
        worker.shutdown()
    assert (info.run_count, info.failures) == (2, 1)
    journal = await queue.journal(job_id)
    expired = [e for e in journal if e.event == "lease_expired"]
    assert len(expired) == 1 and expired[0].details["worker"] == "ghost"


async def test_repeated_lease_expiry_reaches_the_backstop(client: vr.Client, queue: vr.Queue) -> None:
    now = [1_900_000_000_000]
    clocked = vr.Client(client.redis, clock=lambda: now[0])
    q = clocked.queue(queue.name)
    job_id = await q.enqueue(Echo(text="poison"), max_failures=3)
    for round_ in range(3):
        claim = calls.claim(
            q.keys, clocked._now_arg(), count=1, worker=f"w{round_}", token_base="t", default_lease_ms=1000
        )
        reply = await clocked.sender.call(claim)
        assert reply[2:3] == [job_id.encode()]
        now[0] += 1001  # the worker died: its lease runs out
        reclaim = calls.reclaim(q.keys, clocked._now_arg(), batch=100, max_failures="25")
        out = calls.reclaimed(await clocked.sender.call(reclaim))
        assert out.ids == [job_id]
    info = await q.get(job_id)
    assert info is not None and (info.state, info.failures) == (vr.JobState.DEAD, 3)
    journal = await q.journal(job_id)
    assert [e.event for e in journal].count("lease_expired") == 3
    assert journal[-1].event == "dead" and journal[-1].details["reason"] == "max_failures"


async def test_shutdown_releases_running_jobs_with_their_carry(queue: vr.Queue) -> None:
    stubborn = await queue.enqueue(Hang())
    polite = await queue.enqueue(Hang(cooperative=True))
    worker = make_worker(queue, HangJob, shutdown_grace=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        for job_id in (stubborn, polite):
            await wait_for(queue, job_id, lambda i: i.state == vr.JobState.RUNNING)
        await anyio.sleep(0.05)
        worker.shutdown()
    s, p = await queue.get(stubborn), await queue.get(polite)
    assert s is not None and p is not None
    assert (s.state, s.failures, s.carry) == (vr.JobState.PENDING, 0, {"pids": [os.getpid()]})
    assert (await events(queue, stubborn))[-1] == "released"
    assert (p.state, p.failures, p.note) == (vr.JobState.PENDING, 0, "checkpointed on shutdown")
    assert (await events(queue, polite))[-1] == "paused"
    assert (await queue.counts())["running"] == 0


async def test_a_shutdown_before_run_gets_going_is_kept_and_the_worker_runs_again(queue: vr.Queue) -> None:
    # An app's lifespan: start_soon(worker.run), and a server stopped at once
    # calls shutdown() before run() has started. It must not wait for another.
    worker = make_worker(queue, EchoJob, state={})
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            worker.shutdown()
    assert not worker.stopping  # cleared when run() ended: the worker can run again
    job_id = await queue.enqueue(Echo(text="again"))
    with anyio.fail_after(30):
        await worker.run(until_idle=True)
    info = await queue.get(job_id)
    assert info is not None and info.state == vr.JobState.COMPLETED


async def test_idle_worker_is_woken_by_enqueue(queue: vr.Queue) -> None:
    worker = make_worker(queue, EchoJob, poll_interval=60, state={})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.3)  # let it go idle: its next poll is a minute away
        job_id = await queue.enqueue(Echo(text="wake"))
        await wait_for(queue, job_id, lambda i: i.state == vr.JobState.COMPLETED, timeout=5)
        worker.shutdown()


async def test_one_worker_several_queues_and_isolation(client: vr.Client, queue_name: str) -> None:
    reports, default = client.queue(queue_name + "-reports"), client.queue(queue_name + "-default")
    r = await reports.enqueue_many([Echo(text=f"r{i}") for i in range(5)])
    d = await default.enqueue_many([Echo(text=f"d{i}") for i in range(5)])
    await drain(reports, EchoJob, state={})  # a worker for "reports" alone
    assert [(await reports.get(i)).state for i in r] == [vr.JobState.COMPLETED] * 5  # type: ignore[union-attr]
    assert [(await default.get(i)).state for i in d] == [vr.JobState.PENDING] * 5  # type: ignore[union-attr]
    state: dict[str, Any] = {}
    await drain([reports, default], EchoJob, state=state)
    assert sorted(state["ran"]) == [f"d{i}" for i in range(5)]


async def test_concurrency_is_respected(queue: vr.Queue) -> None:
    live = {"now": 0, "max": 0}

    class Busy(vr.Task):
        KIND: ClassVar[str] = "busy"

    class BusyJob(Busy, vr.Handler[None]):
        async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
            await anyio.sleep(0.01)
            live["now"] -= 1
            return vr.Outcome.completed()

    await queue.enqueue_many([Busy() for _ in range(60)])
    await drain(queue, BusyJob, concurrency=4)
    assert live["max"] == 4
    assert (await queue.counts())["completed"] == 60


async def test_killed_worker_process_job_runs_again_elsewhere(
    redis_server: RedisServer, queue_name: str
) -> None:
    """SIGKILL a worker mid-job: after its lease expires another worker runs the job."""
    client = vr.Client.from_url(redis_server.url)
    queue = client.queue(queue_name)
    try:
        job_id = await queue.enqueue(Hang())
        with worker_process(redis_server.url, queue_name, lease=1.0) as proc:
            assert proc.stdout is not None
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
            assert line.strip() == f"READY {job_id}"
            proc.kill()
            proc.wait()

        class Finish(Hang, vr.Handler[None]):
            async def handle(self, ctx: vr.Context[Any], state: None) -> vr.Outcome:
                ctx.carry.pids.append(os.getpid())
                return vr.Outcome.completed()

        worker = make_worker(queue, Finish, reclaim_interval=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            info = await wait_for(queue, job_id, lambda i: i.state == vr.JobState.COMPLETED, timeout=15)
            worker.shutdown()
        assert (
            info.carry["pids"][-1] == os.getpid() and len(info.carry["pids"]) == 1
        )  # the killed run saved nothing
        assert [e.event for e in await queue.journal(job_id)] == [
            "enqueued",
            "claimed",
            "lease_expired",
            "claimed",
            "completed",
        ]
    finally:
        await client.aclose()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_starts_a_graceful_shutdown(
    redis_server: RedisServer, queue_name: str, signum: int
) -> None:
    client = vr.Client.from_url(redis_server.url)
    queue = client.queue(queue_name)
    try:
        job_id = await queue.enqueue(Hang(cooperative=True))
        with worker_process(redis_server.url, queue_name, lease=30) as proc:
            assert proc.stdout is not None
            assert (await anyio.to_thread.run_sync(proc.stdout.readline)).strip() == f"READY {job_id}"
            proc.send_signal(signum)
            out = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=10)[0])
            assert "STOPPED" in out and proc.returncode == 0
        info = await queue.get(job_id)
        assert info is not None and (info.state, info.failures) == (vr.JobState.PENDING, 0)
        assert info.note == "checkpointed on shutdown"
    finally:
        await client.aclose()


async def test_queues_by_name(client: vr.Client, queue_name: str) -> None:
    a, b = client.queue(queue_name + "-a"), client.queue(queue_name + "-b")
    await a.enqueue(Echo(text="a"))
    await b.enqueue(Echo(text="b"))
    state: dict[str, Any] = {}
    await drain([queue_name + "-a", b], EchoJob, state=state, client=client)  # type: ignore[list-item]
    assert sorted(state["ran"]) == ["a", "b"]
    with pytest.raises(vr.ConfigurationError, match="client"):
        vr.Worker("reports", handle_signals=False)


# -- the garbage collector ------------------------------------------------------------------


class GcProbe(vr.Task):
    KIND: ClassVar[str] = "worker.gc_probe"


class GcProbeJob(GcProbe, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["frozen while running"] = gc.get_freeze_count()
        state["threshold while running"] = gc.get_threshold()
        return vr.Outcome.completed()


@pytest.fixture
def collector() -> Iterator[None]:
    """The process's collector as a test found it, put back whatever the test did: nothing
    frozen but what CPython froze itself (3.12: gc_tuning.INTERPRETER_FROZEN), or less once a
    test unfroze that too."""
    assert gc.get_freeze_count() <= gc_tuning.INTERPRETER_FROZEN and gc.isenabled()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector")
async def test_a_running_worker_keeps_the_objects_it_started_with_out_of_full_collections(
    queue: vr.Queue,
) -> None:
    await queue.enqueue(GcProbe())
    state: dict[str, Any] = {}
    await drain(queue, GcProbeJob, state=state)
    assert state["frozen while running"] > 1000  # imports, the test process, the worker itself
    assert gc.get_freeze_count() == 0  # unfrozen when it stopped


@pytest.mark.usefixtures("collector")
@pytest.mark.parametrize("process", ["freeze_gc=False", "gc disabled", "already frozen"])
async def test_a_worker_leaves_the_collector_alone_when_told_or_when_the_process_runs_its_own(
    queue: vr.Queue, process: str
) -> None:
    options: dict[str, Any] = {}
    if process == "freeze_gc=False":
        options["freeze_gc"] = False
    elif process == "gc disabled":
        gc.disable()
    else:
        gc.freeze()
    before = gc.get_freeze_count()
    await queue.enqueue(GcProbe())
    state: dict[str, Any] = {}
    await drain(queue, GcProbeJob, state=state, **options)
    # Nothing frozen by the worker (frozen objects that die leave the count), nothing unfrozen.
    assert state["frozen while running"] <= before
    if process == "already frozen":
        assert gc.get_freeze_count() > gc_tuning.INTERPRETER_FROZEN
    else:
        assert before == state["frozen while running"] == gc.get_freeze_count()
        assert before <= gc_tuning.INTERPRETER_FROZEN  # nothing frozen by the process
    assert gc.isenabled() == (process != "gc disabled")


@pytest.mark.usefixtures("collector")
async def test_a_worker_freezes_beside_what_the_interpreter_froze_itself(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython 3.12 starts with objects of its own in the permanent generation (375 tuples on
    3.12.1): that is not a process running its collector its own way, and a worker freezes there
    as on 3.11 and 3.13 (it froze nothing on 3.12 before). Here the objects frozen before the
    worker starts stand for the interpreter's own, on every Python."""
    gc.freeze()
    before = gc.get_freeze_count()
    monkeypatch.setattr(gc_tuning, "INTERPRETER_FROZEN", before)
    await queue.enqueue(GcProbe())
    state: dict[str, Any] = {}
    await drain(queue, GcProbeJob, state=state)
    assert state["frozen while running"] > before  # the worker's own start-up frozen too
    assert gc.get_freeze_count() == 0  # unfrozen when it stopped


class _Cycle:
    """An object only the cycle collector frees."""

    def __init__(self) -> None:
        self.me = self


class FirstJob(vr.Task):
    KIND: ClassVar[str] = "worker.first_job"


class FirstJobProbe(FirstJob, vr.Handler[dict[str, Any]]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["old garbage there at the first job"] = state["old garbage"]() is not None
        state["full collections before the first job"] = len(state["full collections"])
        return vr.Outcome.completed()


@pytest.mark.usefixtures("collector")
async def test_a_worker_starts_on_its_backlog_and_collects_old_garbage_once_it_is_idle(
    queue: vr.Queue,
) -> None:
    # No collection during the test but the worker's own.
    gc.set_threshold(1_000_000, 1_000, 1_000)
    old = _Cycle()
    gc.collect()  # it survives: now in the oldest generation...
    state: dict[str, Any] = {"old garbage": weakref.ref(old), "full collections": []}
    del old  # ... and garbage there, which only a full collection frees

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            state["full collections"].append(info)

    await queue.enqueue(FirstJob())
    worker = make_worker(queue, FirstJobProbe, state=state)
    gc.callbacks.append(seen)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(10):
                while state["old garbage"]() is not None:
                    await anyio.sleep(0.01)
            frozen_after_the_collection = gc.get_freeze_count()
            worker.shutdown()
    finally:
        gc.callbacks.remove(seen)
    # The backlog's first job ran before any full collection (a young one
    # only, at the start), and the old garbage was collected, not frozen, as
    # soon as the worker had nothing to run: once.
    assert state["old garbage there at the first job"] is True
    assert state["full collections before the first job"] == 0
    assert len(state["full collections"]) == 1
    assert frozen_after_the_collection > 1000  # frozen again after it
    assert gc.get_freeze_count() == 0


async def test_an_idle_worker_has_the_scripts_of_its_jobs_path_expanded_before_its_first_job(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its completion and lease renewal are expanded at its first idle moment,
    not by the first job's completion (the jobs enqueued meanwhile wait it out)."""
    fresh = ScriptSet()  # nothing expanded yet (the process-wide set is, by other tests)
    monkeypatch.setattr(queue.store.sender, "_scripts", fresh)
    worker = make_worker(queue, EchoJob, poll_interval=5, state={})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            while "complete" not in fresh._scripts:  # no job: only the idle moment expands it
                await anyio.sleep(0.01)
        worker.shutdown()
    assert {"claim", "complete", "extend"} <= set(fresh._scripts)


@pytest.mark.usefixtures("collector")
@pytest.mark.parametrize(
    ("process", "option", "while_running"),
    [
        ("default thresholds", 5_000, 5_000),
        ("default thresholds", 2_000, 2_000),
        ("default thresholds", None, 700),  # told to leave it
        ("threshold of its own, higher", 5_000, 20_000),  # never lowered
        ("gc disabled", 5_000, 700),
    ],
)
async def test_a_running_worker_raises_the_young_generation_threshold_and_puts_it_back(
    queue: vr.Queue, process: str, option: int | None, while_running: int
) -> None:
    gc.set_threshold(700, 10, 10)  # CPython 3.11's defaults
    if process == "threshold of its own, higher":
        gc.set_threshold(20_000, 10, 10)
    elif process == "gc disabled":
        gc.disable()
    before = gc.get_threshold()
    await queue.enqueue(GcProbe())
    state: dict[str, Any] = {}
    await drain(queue, GcProbeJob, state=state, gc_threshold=option)
    assert state["threshold while running"] == (while_running, 10, 10)
    assert gc.get_threshold() == before  # put back when it stopped


@pytest.mark.parametrize("bad", [0, -5])
async def test_a_gc_threshold_below_one_is_refused(queue: vr.Queue, bad: int) -> None:
    with pytest.raises(vr.ConfigurationError, match="gc_threshold must be >= 1"):
        vr.Worker(queue, gc_threshold=bad)
