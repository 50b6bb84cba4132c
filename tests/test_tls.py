"""``rediss://``: the whole queue over TLS, against a redis-server that speaks only TLS.

Managed Redis services mostly require TLS. The lane tests (tests/test_lane.py)
run over TLS too; these cover the rest of the path a user takes: enqueue one
and many, a worker draining with pauses and carry, the journal, an offloaded
function's result by ``resolve``, and the blocking ``SyncClient``.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.helpers import drain, events, make_worker
from tests.servers import RedisServer, make_tls_files
from tests.tasks import Echo, EchoJob, Steps, StepsJob
from tests.test_offload import Report, on, run_until_idle
from venturi_redis._transport import redispy

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """On asyncio's own loop and on uvloop, which has a TLS layer of its own."""
    if request.param == "uvloop":
        return ("asyncio", {"use_uvloop": True})
    return "asyncio"


@pytest.fixture
async def client(tls_server: RedisServer) -> AsyncIterator[vr.Client]:
    """A client over ``rediss://`` (this module's own ``client``)."""
    client = vr.Client.from_url(tls_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_queue_runs_end_to_end_over_tls(client: vr.Client) -> None:
    q = client.queue(f"tls-{uuid.uuid4().hex[:8]}")
    one = await q.enqueue(Echo(text="one"))
    many = await q.enqueue_many([Echo(text=str(i)) for i in range(50)])
    stepped = await q.enqueue(Steps(steps=3))
    await drain(q, EchoJob, StepsJob)
    for job_id in [one, *many, stepped]:
        info = await q.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
    info = await q.get(stepped)
    assert info is not None and info.run_count == 3 and info.note == "done"
    assert (await events(q, stepped)).count("paused") == 2
    lane = client.sender.lane
    assert lane is not None and lane.direct  # the single enqueue's fast path holds on TLS
    conn = await redispy.pooled_connection(client.redis.connection_pool)
    try:
        assert conn._writer.transport.get_extra_info("sslcontext") is not None  # really TLS
    finally:
        await client.redis.connection_pool.release(conn)


async def test_an_idle_worker_is_woken_over_tls_and_stops_at_once(client: vr.Client) -> None:
    """The idle worker's BLPOP on the wake list, with its claim pipelined behind, on a TLS socket."""
    q = client.queue(f"tls-{uuid.uuid4().hex[:8]}")
    worker = make_worker(q, EchoJob, poll_interval=60, state={})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.3)  # idle, blocked on the wake list, a minute from its next poll
        start = time.monotonic()
        job_id = await q.enqueue(Echo(text="wake"))
        with anyio.fail_after(30):
            while (await q.counts())["completed"] < 1:
                await anyio.sleep(0.01)
        woken = time.monotonic() - start
        await anyio.sleep(0.3)  # idle again
        start = time.monotonic()
        worker.shutdown()
    # Not the minute's poll: woken by the push (a bound far from the poll, not a timing).
    assert woken < 30 and time.monotonic() - start < 30
    assert (await q.get(job_id)).state == vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_an_offloaded_result_resolves_over_tls(client: vr.Client) -> None:
    q = client.queue(f"tls-{uuid.uuid4().hex[:8]}")
    fn = on(q)
    handle = await fn.offload(client, tenant_id=4, month=9)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_until_idle, q, fn)
        res = await vr.resolve(client, handle, timeout=10)  # blocks on the TLS socket
    assert res == vr.OffloadResult(
        "completed", value=Report(tenant_id=4, month=9, total=6.0), job_id=handle.job_id
    )


def test_the_sync_client_enqueues_over_tls(tls_server: RedisServer) -> None:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(tls_server.url) as client:
        job_id = client.queue(name).enqueue(Echo(text="from a script"))
        info = client.queue(name).get(job_id)
    assert info is not None and info.state == vr.JobState.PENDING


async def test_a_server_certificate_the_client_cannot_verify_is_refused(tls_server: RedisServer) -> None:
    """No silent downgrade: without the CA, the handshake fails and nothing is written."""
    client = vr.Client.from_url(f"rediss://127.0.0.1:{tls_server.port}/0")
    name = f"tls-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(RedisConnectionError) as refused:
            await client.queue(name).enqueue(Echo(text="x"))
        assert "certificate verify failed: self-signed" in _verify_error(refused.value)
    finally:
        await client.aclose()
    assert await _keys_of(tls_server, name) == []


async def test_a_server_certificate_for_another_host_name_is_refused(tls_server: RedisServer) -> None:
    """The certificate names 127.0.0.1 only: reached as localhost, it is refused though its CA is trusted."""
    url = tls_server.url.replace("127.0.0.1", "localhost")
    client = vr.Client.from_url(url)
    name = f"tls-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(RedisConnectionError) as refused:
            await client.queue(name).enqueue(Echo(text="x"))
        # redis-py before 6.0 checks no host name unless told: Client.from_url tells it.
        assert "Hostname mismatch" in _verify_error(refused.value)
    finally:
        await client.aclose()
    assert await _keys_of(tls_server, name) == []


def _verify_error(exc: BaseException) -> str:
    """The certificate error under redis-py's ``ConnectionError`` (before 6.0 its message omits it)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    assert cause is not None, f"no certificate error under {exc!r}"
    return str(cause)


async def _keys_of(server: RedisServer, name: str) -> list[bytes]:
    admin = aioredis.Redis(host="127.0.0.1", port=server.port, **server.connect_kwargs())
    try:
        return list(await admin.keys(f"*{name}*"))
    finally:
        await admin.aclose()


def test_the_cli_reads_a_queue_over_tls(tls_server: RedisServer) -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    name = f"tls-{uuid.uuid4().hex[:8]}"
    with vr.SyncClient(tls_server.url) as client:
        job_id = client.queue(name).enqueue(Echo(text="seen by the CLI"), priority="high")
    res = CliRunner().invoke(app, ["stats", "--redis", tls_server.url, "--queue", name, "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["queue"] == name and row["pending"]["high"] == 1
    shown = CliRunner().invoke(
        app, ["job", "show", job_id, "--redis", tls_server.url, "--json", "--show-payload"]
    )
    assert shown.exit_code == 0, shown.output  # found in the registry, over TLS
    doc = json.loads(shown.stdout)
    assert doc["job"]["queue"] == name and doc["job"]["payload"] == {"text": "seen by the CLI"}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three masters that speak only TLS, to clients and on the cluster bus."""
    files = make_tls_files(Path(tmp_path_factory.mktemp("tls-cluster")))
    with LocalCluster(masters=3, tls=files) as cluster:
        yield cluster


async def test_a_queue_runs_on_redis_cluster_over_tls(tls_cluster: LocalCluster) -> None:
    assert tls_cluster.url.startswith("rediss+cluster://")
    client = vr.Client.from_url(tls_cluster.url)
    try:
        queues = [client.queue(f"tls-{uuid.uuid4().hex[:8]}") for _ in range(3)]  # spread over slots
        ids = {q.name: [await q.enqueue(Echo(text=str(i))) for i in range(5)] for q in queues}
        fn = on(queues[0])
        handle = await fn.offload(client, tenant_id=2, month=1)
        await drain(queues, EchoJob, fn)
        for q in queues:
            for job_id in ids[q.name]:
                assert (await q.get(job_id)).state == vr.JobState.COMPLETED  # type: ignore[union-attr]
        res = await vr.resolve(client, handle, timeout=5)
        assert res.status == "completed" and res.value == Report(tenant_id=2, month=1, total=3.0)
    finally:
        await client.aclose()
