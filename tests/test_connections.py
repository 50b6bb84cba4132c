"""How many Redis connections each part holds, and what each does at the server's ``maxclients``.

docs/deployment.md, "Connections each part holds", has the table these tests
count against: each part runs as a user runs it (a burst of concurrent calls,
threads, a worker whose handlers use the queue, tabs on the dashboard), with
``client_name`` in its URL, and its connections are counted on the server
(``CLIENT LIST``) while it runs. Then a redis-server with a low ``maxclients``
is filled, and each part must say so clearly or keep working, never lose a
job or run one twice.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer
from tests.tasks import Echo, EchoJob
from venturi_redis._transport import redispy

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "deployment.md"


# -- the table -----------------------------------------------------------------------------------

_TABLE_RE = re.compile(r"<!-- connections -->\n((?:\|.*\n)+)")


def table() -> dict[str, int]:
    """Each part of docs/deployment.md's table (its first column) -> its figure (the bold number)."""
    match = _TABLE_RE.search(DOC.read_text())
    assert match, "docs/deployment.md has no <!-- connections --> table"
    rows = [line.split("|")[1:-1] for line in match[1].splitlines()[2:]]
    figures: dict[str, int] = {}
    for part, figure, *_ in rows:
        number = re.search(r"\*\*(?:P \u00d7 )?(\d+)\*\*", figure)
        assert number, f"no **figure** for {part.strip()!r}"
        figures[part.strip()] = int(number[1])
    return figures


def figure(part: str) -> int:
    """The table's figure for the row whose part starts with ``part``."""
    (found,) = [n for name, n in table().items() if name.startswith(part)]
    return found


def test_the_table_names_every_part() -> None:
    assert [name.split(" ")[0] for name in table()] == [
        "`vr.Client`",
        "`queue.wait`,",
        "`vr.resolve`",
        "`vr.SyncClient`",
        "Django's",
        "`vr.Worker`,",
        "`venturi",
        "`venturi",
    ]


# -- counting ------------------------------------------------------------------------------------


def named(server: RedisServer, name: str) -> int:
    """How many connections called ``name`` the server has now."""
    with redis.Redis(port=server.port, decode_responses=True, **server.connect_kwargs()) as admin:
        return sum(1 for c in admin.client_list() if c.get("name") == name)


def blocked(server: RedisServer, name: str) -> int:
    """How many connections called ``name`` block in a ``BLPOP`` now."""
    with redis.Redis(port=server.port, decode_responses=True, **server.connect_kwargs()) as admin:
        return sum(1 for c in admin.client_list() if c.get("name") == name and c["cmd"] == "blpop")


@contextlib.contextmanager
def peak(server: RedisServer, name: str) -> Iterator[list[int]]:
    """The most connections called ``name`` seen at once while the block runs (``[n]``), from a thread
    that reads ``CLIENT LIST`` over and over; and at the end, those still open."""
    seen = [0]
    done = threading.Event()

    def sample() -> None:
        with redis.Redis(port=server.port, decode_responses=True, **server.connect_kwargs()) as admin:
            while not done.is_set():
                now = sum(1 for c in admin.client_list() if c.get("name") == name)
                seen[0] = max(seen[0], now)
                done.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()
        seen[0] = max(seen[0], named(server, name))


def url_of(server: RedisServer, name: str, **query: str | float) -> str:
    return server.url_with(client_name=name, **query)


def tag() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


class Parent(vr.Task):
    """A job whose handler uses the queue as users' handlers do: progress, a child, a wait on it."""

    KIND: ClassVar[str] = "conns.parent"
    n: int


class ParentJob(Parent, vr.Handler[vr.Queue]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], queue: vr.Queue) -> vr.Outcome:
        await ctx.report_progress({"step": 1})
        child = await queue.enqueue(Echo(text=f"child of {self.n}"))
        with contextlib.suppress(TimeoutError):  # the child may not have run yet: the wait is the point
            await queue.wait(child, timeout=0.2)
        await ctx.report_progress({"step": 2})
        return vr.Outcome.completed()


# -- a producer ----------------------------------------------------------------------------------


async def test_a_client_under_a_burst_holds_what_the_table_says(redis_server: RedisServer) -> None:
    """A web server's burst: 1,000 concurrent enqueues, then 1,000 concurrent reads (asyncio.gather).

    Before the pool had a bound that waits, redis-py 8 failed the reads past
    its 100 connections ("Too many connections"), and redis-py 5 to 7 opened
    one per read.
    """
    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name)) as client:
        queue = client.queue(name)
        with peak(redis_server, name) as most:
            ids = await _gather(*(queue.enqueue(Echo(text=str(i))) for i in range(1000)))
            infos = await _gather(*(queue.get(job_id) for job_id in ids))
            await _gather(*(queue.counts() for _ in range(200)))
        assert all(info is not None and info.state == vr.JobState.PENDING for info in infos)
        # The pool reached its bound (the burst was big enough), and no more.
        assert named(redis_server, name) == most[0] == figure("`vr.Client`") == 21
    assert named(redis_server, name) == 0  # aclose() closed them all


async def test_the_bound_comes_from_the_url_or_the_keyword(redis_server: RedisServer) -> None:
    name = tag()
    for url, options, bound in (
        (url_of(redis_server, name, max_connections=3), {}, 3),
        (url_of(redis_server, name), {"max_connections": 4}, 4),
        (url_of(redis_server, name, max_connections=2), {"max_connections": 9}, 2),  # the URL wins
    ):
        async with vr.Client.from_url(url, **options) as client:
            queue = client.queue(name)
            await queue.enqueue(Echo(text="lane"))
            await _gather(*(queue.get("01NOSUCHJOB0000000000000000") for _ in range(300)))
            assert named(redis_server, name) == bound + 1  # and the lane
    if redispy.release() >= (8, 2):  # Redis Cluster's floor: its own bound per node, given the same way
        cluster = vr.Client.from_url("redis+cluster://127.0.0.1:1", max_connections=7)
        assert [n.max_connections for n in cluster.redis.nodes_manager.startup_nodes.values()] == [7]
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(vr.ConfigurationError, match="max_connections"):
            vr.Client.from_url(redis_server.url, max_connections=bad)
    for bad_query in ("0", "x", "-2"):
        with pytest.raises(vr.ConfigurationError, match="max_connections"):
            vr.Client.from_url(f"{redis_server.url}?max_connections={bad_query}")


def test_a_sync_client_shared_by_many_threads_holds_what_the_table_says(redis_server: RedisServer) -> None:
    """Django or Flask: 64 threads enqueue at once (each on a connection of its own), then read.

    Before, each thread enqueueing at once held a connection (redis-py 8
    failed past 100 threads).
    """
    name = tag()
    with vr.SyncClient(url_of(redis_server, name)) as sc, peak(redis_server, name) as most:
        queue = sc.queue(name)
        barrier = threading.Barrier(64)

        def work(i: int) -> list[str]:
            barrier.wait()
            ids = [queue.enqueue(Echo(text=f"{i}-{k}")) for k in range(10)]
            for job_id in ids:
                assert queue.get(job_id) is not None
            return ids

        with ThreadPoolExecutor(64) as pool:
            ids = [job_id for batch in pool.map(work, range(64)) for job_id in batch]
        assert len(set(ids)) == 640 and queue.counts()["pending"] == 640
    assert 40 <= most[0] <= figure("`vr.SyncClient`") == 41  # both pools at their bound, no more


def test_django_s_backend_holds_what_the_table_says(redis_server: RedisServer) -> None:
    """One SyncClient per process and URL (``OPTIONS["url"]``, its bound in it): the SyncClient's figure."""
    from venturi_redis.contrib.django import _backend

    url = url_of(redis_server, tag(), max_connections=3)
    try:
        sc = _backend.sync_client(url)
        assert _backend.sync_client(url) is sc
        assert sc.client.redis.connection_pool.max_connections == 3
    finally:
        _backend._clients.pop(url).close()
    assert figure("Django's") == figure("`vr.SyncClient`")


# -- waiting and following -----------------------------------------------------------------------


async def test_waiters_and_followers_share_one_reader(redis_server: RedisServer) -> None:
    """200 requests in ``queue.wait`` and 20 followers of ``queue.events()``, on a client of 2 connections.

    Before, each held a connection of the pool while it blocked: the pool
    ran out (redis-py 8: "Too many connections"), and a bound would have
    left no connection for the reads.
    """
    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name, max_connections=2)) as client:
        queue = client.queue(name)
        ids = await _gather(*(queue.enqueue(Echo(text=str(i))) for i in range(200)))
        followed: list[set[str]] = []

        async def follow() -> None:
            seen: set[str] = set()
            followed.append(seen)
            async for event in queue.events():
                if event.event == "completed":
                    seen.add(event.job_id)
                    if seen >= set(ids):
                        return

        async with vr.Client.from_url(redis_server.url) as other:
            worker = make_worker(other.queue(name), EchoJob, concurrency=20)
            with peak(redis_server, name) as most, anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for _ in range(20):
                        tg.start_soon(follow)
                    await _until(lambda: len(followed) == 20)
                    waits = [_later(queue.wait(job_id, timeout=30)) for job_id in ids]
                    await anyio.sleep(0.2)  # every wait is in place before the first job runs
                    tg.start_soon(worker.run)
                    infos = await _gather(*waits)
                    worker.shutdown()
        assert [i.state for i in infos] == [vr.JobState.COMPLETED] * 200
        assert all(seen == set(ids) for seen in followed)  # every follower saw every completion
        # The pool's 2, the lane's 1, the queue's reader's 1.
        assert most[0] <= 2 + 1 + figure("`queue.wait`,") == 4


async def test_a_quiet_reader_keeps_its_connection_under_a_short_socket_timeout(
    redis_server: RedisServer,
) -> None:
    """``?socket_timeout=1``: the queue's reader blocks for less than that, so a quiet stream costs no
    reconnects (a read past the timeout failed, and dropped its connection, every second)."""
    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name, socket_timeout=1)) as client:
        queue = client.queue(name)
        readers: set[str] = set()
        with anyio.fail_after(20):
            async with contextlib.aclosing(queue.events()) as events:

                async def watch_then_enqueue() -> None:
                    with redis.Redis(port=redis_server.port, decode_responses=True) as admin:
                        for _ in range(60):  # 3 s of quiet: three socket timeouts
                            readers.update(
                                c["id"]
                                for c in admin.client_list()
                                if c.get("name") == name and c["cmd"] == "xread"
                            )
                            await anyio.sleep(0.05)
                    await queue.enqueue(Echo(text="late"))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch_then_enqueue)
                    event = await anext(events)
        assert event.event == "enqueued" and len(readers) == 1


async def test_resolves_never_stall_on_a_small_pool(redis_server: RedisServer) -> None:
    """Six resolves on a client of 2 connections: each subscription beside the pool, so the reads go on.

    Before, each subscription held a pooled connection while its resolve
    waited for another to read its snapshot: past the bound, none could.
    """
    name = tag()

    async def double(n: int) -> int:
        return 2 * n

    fn = vr.offload(queue=name, kind="conns.double")(double)
    async with vr.Client.from_url(url_of(redis_server, name, max_connections=2)) as client:
        handles = [await fn.offload(client, n) for n in range(6)]
        async with vr.Client.from_url(redis_server.url) as other:
            worker = make_worker(other.queue(name), fn)
            with peak(redis_server, name) as most:
                async with anyio.create_task_group() as tg:
                    with anyio.fail_after(30):
                        resolving = [_later(vr.resolve(client, h, timeout=20)) for h in handles]
                        tg.start_soon(worker.run)
                        results = await _gather(*resolving)
                        worker.shutdown()
    assert [(r.status, r.value) for r in results] == [("completed", 2 * n) for n in range(6)]
    assert most[0] <= 2 + 1 + 6 * figure("`vr.resolve`")


# -- a worker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 10, 100])
async def test_a_worker_holds_what_the_table_says(redis_server: RedisServer, concurrency: int) -> None:
    """Handlers that report progress, enqueue a child and wait on it, at concurrency 1, 10 and 100.

    Before, the pool grew with the handlers' calls (one connection each at
    100), and at 100 ran out: lease renewals and reclaims failed with "Too
    many connections".
    """
    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name)) as client:
        queue = client.queue(name)
        await queue.enqueue_many([Parent(n=i) for i in range(3 * concurrency)])
        worker = make_worker(queue, ParentJob, EchoJob, state=queue, concurrency=concurrency)
        with peak(redis_server, name) as most, anyio.fail_after(60):
            await worker.run(until_idle=True)
        counts = await queue.counts()
    assert counts["completed"] == 6 * concurrency and counts["dead"] == 0
    assert most[0] <= figure("`vr.Worker`,") == 23


async def test_a_worker_on_many_queues_holds_what_the_table_says(redis_server: RedisServer) -> None:
    """40 queues: past 8, the worker's idle claims wait in groups of 32 (_worker/waiting.py), one
    connection a group (2), not one a queue (40); its handlers wait on one queue (1 reader)."""
    from venturi_redis._worker.waiting import GROUP_FROM, GROUP_SIZE

    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name)) as client:
        queues = [client.queue(f"{name}-{i}") for i in range(40)]
        for i, q in enumerate(queues):
            await q.enqueue(Parent(n=i))
        worker = make_worker(queues, ParentJob, EchoJob, state=queues[0], concurrency=4)
        groups = -(-len(queues) // GROUP_SIZE)
        assert len(queues) > GROUP_FROM and groups == 2
        with peak(redis_server, name) as most, anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                while sum([(await q.counts())["completed"] for q in queues]) < 80:  # and the children
                    await anyio.sleep(0.05)
                # Idle: each group blocks on its own connection, and no queue on one of its own.
                await _until(lambda: blocked(redis_server, name) == groups)
                await anyio.sleep(1.0)
                assert blocked(redis_server, name) == groups
                worker.shutdown()
    # The table's one-queue figure has 1 idle-claim connection: a group's takes its place.
    assert most[0] <= figure("`vr.Worker`,") - 1 + groups
    row = next(row for row in DOC.read_text().splitlines() if row.startswith("| `vr.Worker`,"))
    assert "1 connection per group of up to 32 queues (40 queues: 2" in row


def test_processes_hold_what_the_table_says_and_the_supervisor_none(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = tag()
    env = {
        **os.environ,
        "REDIS_URL": url_of(redis_server, name),
        "VENTURI_QUEUE": name,
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "supervisor.log"
    cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.pworker:make_worker"]
    with log.open("wb") as out:
        sup = subprocess.Popen([*cmd, "--processes", "2"], cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        with vr.SyncClient(redis_server.url) as sc:
            deadline = time.monotonic() + 60
            while len(sc.queue(name).workers()) < 2:
                assert time.monotonic() < deadline and sup.poll() is None, log.read_text()
                time.sleep(0.05)
            from tests.procs.pworker import Stamp

            ids = [sc.queue(name).enqueue(Stamp(seconds=0.05)) for _ in range(40)]
            while any((i := sc.queue(name).get(j)) is None or i.state != vr.JobState.COMPLETED for j in ids):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            held = named(redis_server, name)
    finally:
        sup.terminate()
        sup.wait(60)
    per_worker = figure("`vr.Worker`,")
    assert 2 <= held <= 2 * per_worker
    row = next(row for row in DOC.read_text().splitlines() if row.startswith("| `venturi worker"))
    assert f"**P \u00d7 {per_worker}**" in row


# -- the dashboard -------------------------------------------------------------------------------


async def test_the_dashboard_with_tabs_open_holds_what_the_table_says(redis_server: RedisServer) -> None:
    """Ten tabs on one queue's live page and a burst of 200 page and API requests."""
    from venturi_redis.dashboard import _live, create_app

    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name)) as client:
        queue = client.queue(name)
        job_id = await queue.enqueue(Echo(text="seen live"))
        app = create_app(client)
        frames: list[bytes] = []

        async def receive() -> dict[str, Any]:
            await anyio.sleep_forever()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            frames.append(message.get("body", b""))

        with peak(redis_server, name) as most:
            async with anyio.create_task_group() as tg:
                for _ in range(10):  # the tabs: each an EventSource on the queue's feed
                    feed = _live.EventFeed(queue, "0", heartbeat=0.05, lifetime=2.0)
                    tg.start_soon(feed, {"type": "http"}, receive, send)
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
                    paths = [f"/queues/{name}", "/api/queues", f"/api/queues/{name}/scale"] * 67
                    pages = await _gather(*(h.get(p) for p in paths[:200]))
        assert {p.status_code for p in pages} == {200}
        assert sum(job_id.encode() in f for f in frames) == 10  # each tab got the event
        assert most[0] <= figure("`venturi dashboard`") == 22


# -- at the server's limits ----------------------------------------------------------------------


async def test_a_full_pool_says_which_bound_to_raise(redis_server: RedisServer) -> None:
    """Every connection held by blocking commands of the user's own: the call waits, then says why."""
    name = tag()
    async with vr.Client.from_url(url_of(redis_server, name, max_connections=2)) as client:
        client.redis.connection_pool.wait_seconds = 0.5
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(client.redis.blpop, f"{name}:nothing:{i}", 5)
            await _until(lambda: named(redis_server, name) == 2)
            with pytest.raises(vr.PoolExhaustedError) as err:
                await client.queue(name).get("01NOSUCHJOB0000000000000000")
            tg.cancel_scope.cancel()
    message = str(err.value)
    assert "max_connections" in message and "all 2" in message and "127.0.0.1:" in message
    assert isinstance(err.value, RedisConnectionError)  # the worker's loops retry it


@pytest.fixture
def small_server() -> Iterator[RedisServer]:
    """A redis-server that takes 12 clients at most."""
    with RedisServer("--maxclients", "12") as server:
        yield server


def fill(server: RedisServer, hogs: list[redis.Redis]) -> None:
    """Take every free client slot of ``server`` with a connection of ``hogs``."""
    while True:
        hog = redis.Redis(port=server.port, socket_connect_timeout=2)
        try:
            hog.ping()
        except RedisConnectionError as exc:
            hog.close()
            refused = str(exc)
            break
        hogs.append(hog)
    assert "max number of clients reached" in refused


@contextlib.contextmanager
def filled(server: RedisServer) -> Iterator[list[redis.Redis]]:
    """Every free client slot of ``server`` taken, until the block ends."""
    hogs: list[redis.Redis] = []
    try:
        fill(server, hogs)
        yield hogs
    finally:
        for hog in hogs:
            hog.close()


async def test_a_client_without_a_connection_says_the_server_is_full(small_server: RedisServer) -> None:
    async with vr.Client.from_url(small_server.url) as client:
        with filled(small_server):
            with pytest.raises(vr.MaxClientsError) as err:
                await client.queue("full").enqueue(Echo(text="refused"))
            with pytest.raises(vr.MaxClientsError):
                await client.queue("full").counts()
        message = str(err.value)
        assert f"127.0.0.1:{small_server.port}" in message and "maxclients" in message
        assert "docs/deployment.md" in message
        assert isinstance(err.value, RedisConnectionError)
        # Once the server takes connections again, the same client works.
        assert await client.queue("full").enqueue(Echo(text="accepted"))
    with filled(small_server), vr.SyncClient(small_server.url) as sc, pytest.raises(vr.MaxClientsError):
        sc.queue("full").enqueue(Echo(text="refused"))


async def test_a_client_with_connections_keeps_working_at_maxclients(small_server: RedisServer) -> None:
    """A burst needs more connections than the client has; the server refuses them: the burst waits
    for the client's own, and every call succeeds, the enqueue lane's too."""
    async with vr.Client.from_url(small_server.url) as client:
        queue = client.queue("keeps")
        await _gather(*(queue.get("01NOSUCHJOB0000000000000000") for _ in range(3)))  # 3 pooled
        with filled(small_server):
            ids = [await queue.enqueue(Echo(text="one by one")) for _ in range(5)]  # the lane is refused
            ids += await _gather(*(queue.enqueue(Echo(text=str(i))) for i in range(300)))
            infos = await _gather(*(queue.get(job_id) for job_id in ids))
        assert all(i is not None for i in infos) and (await queue.counts())["pending"] == 305
    with filled(small_server):
        pass  # (the hogs of the block above are gone: the server takes clients again)
    async with vr.Client.from_url(small_server.url) as fresh:
        await fresh.queue("sync-keeps").counts()
    with vr.SyncClient(small_server.url) as sc:
        sq = sc.queue("sync-keeps")
        sq.counts()  # the loop's connection
        first = sq.enqueue(Echo(text="direct"))  # the direct enqueue's connection
        with filled(small_server), ThreadPoolExecutor(8) as pool:
            more = list(pool.map(lambda i: sq.enqueue(Echo(text=str(i))), range(40)))
        assert len({first, *more}) == 41


async def test_a_worker_started_at_maxclients_waits_then_runs_every_job_once(
    small_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling deploy's new pod: the server is full when the worker starts. It waits, within its
    ``startup_wait`` (one WARNING, one INFO: the wait for a Redis that cannot be reached yet), starts
    when connections come free, and runs every job once. Before, it exited at its start-up check."""
    caplog.set_level(logging.INFO, logger="venturi_redis")
    async with vr.Client.from_url(small_server.url) as producer:
        ids = await producer.queue("deploy").enqueue_many([Echo(text=str(i)) for i in range(50)])
    async with vr.Client.from_url(small_server.url) as client:
        queue = client.queue("deploy")
        worker = make_worker(queue, EchoJob, concurrency=4)
        with filled(small_server) as hogs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(worker.run, until_idle=True))
                await _until(lambda: bool(_start_lines(caplog, worker.id)))
                await anyio.sleep(1.0)  # it keeps waiting, quietly
                for hog in hogs:
                    hog.close()
                with anyio.fail_after(30):
                    await _wait_done(queue, ids)
        infos = [await queue.get(job_id) for job_id in ids]
    assert [(i.state, i.run_count, i.failures) for i in infos if i] == [(vr.JobState.COMPLETED, 1, 0)] * 50
    lines = _start_lines(caplog, worker.id)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    assert "refuses new connections" in lines[0][1] and "maxclients" in lines[0][1]
    assert "--startup-wait" in lines[0][1] and "answered after" in lines[1][1]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _start_lines(caplog: pytest.LogCaptureFixture, worker_id: str) -> list[tuple[int, str]]:
    """The start-up wait's lines of this worker (_worker/startup.py): its WARNING, then its INFO."""
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if worker_id in r.getMessage() and "Redis at" in r.getMessage()
    ]


async def test_a_worker_asked_to_stop_while_it_waits_stops(small_server: RedisServer) -> None:
    """A shutdown() (SIGTERM) during the start-up wait ends run() at once, having claimed nothing,
    not after ``startup_wait`` (30 s)."""
    async with vr.Client.from_url(small_server.url) as client:
        worker = make_worker(client.queue("stopping"), EchoJob)
        with filled(small_server), anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await anyio.sleep(0.3)
                worker.shutdown()
        # And it can run later, when the server takes it.
        await client.queue("stopping").enqueue(Echo(text="later"))
        with anyio.fail_after(20):
            await worker.run(until_idle=True)
        assert (await client.queue("stopping").counts())["completed"] == 1


async def test_a_running_worker_keeps_working_at_maxclients(
    small_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server fills while a worker runs; then its idle-claim connection drops (a network blip),
    and its handlers start to use the queue: the worker goes on with the connections it has, every
    job runs once, nothing is logged as lost.

    Before, the refused idle-claim connection made the worker drop its pooled
    ones, and its handlers' calls, its completions and its leases then failed.
    """
    caplog.set_level(logging.WARNING, logger="venturi_redis")
    async with vr.Client.from_url(small_server.url) as client:
        queue = client.queue("running")
        worker = make_worker(queue, ParentJob, EchoJob, state=queue, concurrency=8, lease=3.0)
        first = await queue.enqueue_many([Echo(text=str(i)) for i in range(8)])
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                await _wait_done(queue, first)
                idle = await _until_blocked(client)
            with filled(small_server) as hogs:
                hogs[0].execute_command("CLIENT", "KILL", "ID", idle)
                fill(small_server, hogs)  # the slot it freed: taken before the worker reconnects
                more = await queue.enqueue_many([Parent(n=i) for i in range(32)])
                with anyio.fail_after(60):
                    await _wait_done(queue, more)
                    await anyio.sleep(3.5)  # past a lease: nothing expires
            worker.shutdown()
        infos = [await queue.get(job_id) for job_id in first + more]
        assert [(i.run_count, i.failures) for i in infos if i] == [(1, 0)] * 40
        assert (await queue.counts())["completed"] == 72  # and the parents' children
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    refused = [r for r in caplog.records if "max number of clients reached" in r.message]
    # One WARNING: its idle claims wait on a pooled connection. No claim,
    # completion or lease renewal failed for want of one.
    assert [r.message.split(" (")[0] for r in refused] == [
        "queue running: Redis refused this worker's idle-claim connection"
    ]


@pytest.fixture
def roomy_server() -> Iterator[RedisServer]:
    """A redis-server that takes 40 clients at most: a worker's whole pool fits before it is filled."""
    with RedisServer("--maxclients", "40") as server:
        yield server


async def test_a_worker_with_many_queues_keeps_waking_at_maxclients(
    roomy_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, for a worker with 10 queues, whose idle queues wait in a group (_worker/waiting.py)
    on a connection of the group's own. The server is full when the group asks for it (the worker's
    second run: its client's pool kept the connections of the first). The group blocks on a pooled
    connection meanwhile, with one WARNING; its wake-ups still come (an idle queue claims only every
    45 to 60 s here), the pool's connections are kept, every job runs once.

    Before, each BLPOP was a failure logged (one a retry), and the group dropped the pool's idle
    connections, which the server did not give back.
    """
    caplog.set_level(logging.WARNING, logger="venturi_redis")
    async with vr.Client.from_url(roomy_server.url) as client:
        queues = [client.queue(f"grouped-{i}") for i in range(10)]
        worker = make_worker(queues, EchoJob, concurrency=4, poll_interval=60.0, blocked_loop_warning=None)
        first = [await q.enqueue(Echo(text=q.name)) for q in queues]
        with anyio.fail_after(30):
            await worker.run(until_idle=True)  # the pool's connections made
        with filled(roomy_server), anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await _until(lambda: any("max number of clients" in r.getMessage() for r in caplog.records))
                # Jobs for idle queues now: a wake-up popped by the pooled BLPOP claims them (not
                # the claim every poll_interval).
                more = [(q, await q.enqueue(Echo(text=q.name))) for q in queues[1::3] for _ in range(3)]
                with anyio.fail_after(20):
                    for q, job_id in more:
                        await _wait_done(q, [job_id])
                worker.shutdown()
        infos = [await q.get(job_id) for q, job_id in [*zip(queues, first, strict=True), *more]]
        assert [(i.run_count, i.failures) for i in infos if i] == [(1, 0)] * 19
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    warned = [r.getMessage().split(" (")[0] for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["queue grouped-0: Redis refused the idle-wait connection of 10 queue(s) of this worker"]


async def _until_blocked(client: vr.Client) -> int:
    """The id of the idle worker's blocked connection (its idle claim's BLPOP)."""
    while True:
        blocked = [c for c in await client.redis.client_list() if c["cmd"] == "blpop"]
        if blocked:
            return int(blocked[0]["id"])
        await anyio.sleep(0.02)


# -- helpers -------------------------------------------------------------------------------------


async def _gather(*awaitables: Any) -> list[Any]:
    """``asyncio.gather``, as a web framework's burst is."""
    import asyncio

    return list(await asyncio.gather(*awaitables))


def _later(awaitable: Any) -> Any:
    """``awaitable`` as a task started now, awaited later (its connection, if any, taken now)."""
    import asyncio

    return asyncio.ensure_future(awaitable)


async def _until(condition: Any, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def _wait_done(queue: vr.Queue, ids: list[str]) -> None:
    while True:
        infos = [await queue.get(job_id) for job_id in ids]
        if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
            return
        await anyio.sleep(0.05)
