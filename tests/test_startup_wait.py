"""A worker started before its Redis answers (``Worker(startup_wait=...)``, _worker/startup.py).

A pod started beside the Redis it depends on (docker compose, a Helm chart),
a Redis restarting or failing over as the pods roll: the worker keeps trying
for ``startup_wait`` seconds (30 by default) with one WARNING, then serves.
``0`` raises at once, as before; a wrong password is raised at once whatever
the wait.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

import venturi_redis as vr
from tests.helpers import make_worker
from tests.servers import RedisServer, free_port, redis_server_binary
from tests.tasks import Echo, EchoJob

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
LOG = "venturi_redis.worker"


@pytest.fixture
def backend() -> str:
    return "redis"


@pytest.fixture
def late_server() -> Iterator[RedisServer]:
    """A server on a port of its own that the test starts when it chooses."""
    server = RedisServer(port=free_port())
    yield server
    server.stop()


def wait_lines(caplog: pytest.LogCaptureFixture, worker_id: str) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == LOG and worker_id in r.getMessage() and "Redis at" in r.getMessage()
    ]


async def test_a_worker_started_before_its_redis_serves_once_it_answers(
    late_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    async with vr.Client.from_url(late_server.url) as client:
        queue = client.queue("startup-wait")
        worker = make_worker(queue, EchoJob, startup_wait=30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                while not wait_lines(caplog, worker.id):  # it tried, and warned
                    await anyio.sleep(0.05)
                await anyio.sleep(0.5)  # and tries again meanwhile, without a second warning
                await anyio.to_thread.run_sync(late_server.start)
                while True:  # the producer waits too, as an application would
                    try:
                        job_id = await queue.enqueue(Echo(text="after the wait"))
                        break
                    except RedisConnectionError:
                        await anyio.sleep(0.1)
                while (info := await queue.get(job_id)) is None or info.state != vr.JobState.COMPLETED:
                    await anyio.sleep(0.05)
            worker.shutdown()
    lines = wait_lines(caplog, worker.id)
    # One warning for the whole wait, however many tries, and one line once it answered.
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    assert "cannot reach Redis at redis://127.0.0.1:" in lines[0][1]
    assert "trying again for up to 30 s" in lines[0][1] and "--startup-wait" in lines[0][1]
    assert "answered after" in lines[1][1]


async def test_a_redis_still_loading_its_data_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted Redis answers LOADING until its data set is read back: a worker waits it out."""
    caplog.set_level(logging.INFO, logger=LOG)
    with RedisServer() as first:
        admin = redis.Redis(host="127.0.0.1", port=first.port)
        pipe = admin.pipeline(transaction=False)
        for i in range(20_000):
            pipe.set(f"filler:{i}", "x" * 20)
        pipe.execute()
        admin.save()
        admin.close()
        port = first.port
        shutil.copy(first.dir / "dump.rdb", tmp_path / "dump.rdb")  # its directory goes with it
    # Read back slowly (key-load-delay, µs a key), answering clients every KiB read meanwhile.
    slow = ["--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024"]
    args = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
        "--save",
        "",
    ]
    proc = subprocess.Popen([*args, *slow], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while not (await _ping(port)).startswith(b"-LOADING"):  # until the server answers LOADING
                await anyio.sleep(0.01)
        async with vr.Client.from_url(f"redis://127.0.0.1:{port}/0") as client:
            queue = client.queue("startup-loading")
            worker = make_worker(queue, EchoJob, startup_wait=60)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(60):
                    while not [line for line in wait_lines(caplog, worker.id) if "answered after" in line[1]]:
                        await anyio.sleep(0.05)
                    job_id = await queue.enqueue(Echo(text="loaded"))
                    while (info := await queue.get(job_id)) is None or info.state != vr.JobState.COMPLETED:
                        await anyio.sleep(0.05)
                worker.shutdown()
    finally:
        proc.kill()
        proc.wait()
    lines = wait_lines(caplog, worker.id)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    assert "loading the dataset" in lines[0][1], lines


async def _ping(port: int) -> bytes:
    """The server's raw reply to PING (no client's retries in between), b"" while it refuses."""
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await conn.send(b"PING\r\n")
            reply = await conn.receive()
    except OSError:
        return b""
    assert reply != b"+PONG\r\n", "the data set was read back before the worker could try"
    return reply


async def test_a_shutdown_during_the_wait_ends_run_at_once(
    late_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM while a worker waits for its Redis: run() returns, having claimed nothing, and the
    worker can run again later."""
    caplog.set_level(logging.INFO, logger=LOG)
    async with vr.Client.from_url(late_server.url) as client:
        queue = client.queue("startup-stop")
        worker = make_worker(queue, EchoJob, startup_wait=300)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                while not wait_lines(caplog, worker.id):
                    await anyio.sleep(0.05)
                worker.shutdown()
        assert [level for level, _ in wait_lines(caplog, worker.id)] == [logging.WARNING]
        await anyio.to_thread.run_sync(late_server.start)
        job_id = await queue.enqueue(Echo(text="later"))
        with anyio.fail_after(30):
            await worker.run(until_idle=True)
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED


async def test_no_wait_raises_at_once(late_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    async with vr.Client.from_url(late_server.url) as client:
        worker = make_worker(client.queue("startup-wait"), EchoJob, startup_wait=0)
        with pytest.raises(RedisConnectionError):
            await worker.run()
    assert wait_lines(caplog, worker.id) == []


async def test_the_wait_ends_with_the_last_error(
    late_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    async with vr.Client.from_url(late_server.url) as client:
        worker = make_worker(client.queue("startup-wait"), EchoJob, startup_wait=0.6)
        with pytest.raises(RedisConnectionError):
            await worker.run()
    lines = wait_lines(caplog, worker.id)
    assert [level for level, _ in lines] == [logging.WARNING], lines


async def test_a_wrong_password_is_not_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with RedisServer(password="right") as server:
        wrong = server.url.replace(":right@", ":wrong@")
        async with vr.Client.from_url(wrong) as client:
            worker = make_worker(client.queue("startup-wait"), EchoJob, startup_wait=300)
            with anyio.fail_after(60), pytest.raises(AuthenticationError):
                await worker.run()
    assert wait_lines(caplog, worker.id) == []


async def test_a_certificate_that_does_not_verify_is_not_waited_for(
    tls_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    async with vr.Client.from_url(f"rediss://127.0.0.1:{tls_server.port}/0") as client:  # no CA given
        worker = make_worker(client.queue("startup-wait"), EchoJob, startup_wait=300)
        with anyio.fail_after(60), pytest.raises(RedisConnectionError):
            await worker.run()
    assert wait_lines(caplog, worker.id) == []


APP = textwrap.dedent(
    """
    import os
    import venturi_redis as vr
    from tests.tasks import EchoJob

    def make_worker():
        client = vr.Client.from_url(os.environ["REDIS_URL"])
        worker = vr.Worker(client.queue("startup-cli"))
        worker.register(EchoJob)
        return worker
    """
)


def test_venturi_worker_started_before_redis(late_server: RedisServer, tmp_path: Path) -> None:
    """`venturi worker` (default wait) rides out a Redis that starts after it; `--startup-wait 0`
    exits 1 with the one line it always printed."""
    (tmp_path / "lateapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    command = [
        sys.executable,
        "-m",
        "venturi_redis.cli",
        "worker",
        "lateapp:make_worker",
        "--redis",
        late_server.url,
    ]
    at_once = subprocess.run(
        [*command, "--startup-wait", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert at_once.returncode == 1, at_once.stderr
    assert (
        at_once.stderr.strip()
        .splitlines()[-1]
        .startswith("venturi: worker lateapp:make_worker cannot start: cannot reach Redis: Error 111")
    ), at_once.stderr
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        while not any("cannot reach Redis at redis://127.0.0.1:" in line for line in seen):
            line = proc.stderr.readline()  # the worker's warning, before the server starts
            assert line, "".join(seen)
            seen.append(line)
        late_server.start()
        with vr.SyncClient(late_server.url) as sc:
            queue = sc.queue("startup-cli")
            job_id = queue.enqueue(Echo(text="late"))
            info = queue.wait(job_id, timeout=30)
            assert info.state == vr.JobState.COMPLETED, info
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert "cannot reach Redis at redis://127.0.0.1:" in err and "answered after" in err, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_venturi_worker_waits_for_redis_stops_it_cleanly(
    late_server: RedisServer, tmp_path: Path, signum: signal.Signals
) -> None:
    """A pod stopped before its Redis ever answered: before, the signal's default action killed
    `venturi worker` mid-wait (exit -15, nothing said); now it stops as a serving worker does."""
    (tmp_path / "lateapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    command = [sys.executable, "-m", "venturi_redis.cli", "worker", "lateapp:make_worker"]
    proc = subprocess.Popen(
        [*command, "--redis", late_server.url, "--startup-wait", "300"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        while not any("cannot reach Redis at redis://127.0.0.1:" in line for line in seen):
            line = proc.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
    finally:
        proc.send_signal(signum)
        _, rest = proc.communicate(timeout=30)
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert f"{signum.name} received while waiting for Redis; stopping (nothing claimed)" in err, err
    assert "Traceback" not in err, err
