"""``venturi worker MODULE:ATTR --processes N`` as a user runs it: real processes, real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import venturi_redis as vr
from tests.procs.pworker import Stamp
from tests.servers import RedisServer
from venturi_redis.cli import processes

ROOT = Path(__file__).resolve().parent.parent
STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


def wait_for(log: Path, pattern: str, count: int = 1, timeout: float = 60.0) -> list[re.Match[str]]:
    deadline = time.monotonic() + timeout
    while True:
        found = list(re.finditer(pattern, log.read_text()))
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"no {count} x {pattern!r} in:\n{log.read_text()}"
        time.sleep(0.05)


def wait_finished(queue: vr.SyncQueue, ids: list[str], timeout: float = 60.0) -> list[vr.JobInfo]:
    deadline = time.monotonic() + timeout
    while True:
        infos = [queue.get(i) for i in ids]
        if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
            return [i for i in infos if i is not None]
        assert time.monotonic() < deadline, [i.state if i else None for i in infos]
        time.sleep(0.05)


def test_two_processes_survive_a_sigkill_and_stop_gracefully_on_sigterm(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = f"procs-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": redis_server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "supervisor.log"
    cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.pworker:make_worker"]
    with log.open("wb") as out:
        sup = subprocess.Popen(
            [*cmd, "--processes", "2", "--concurrency", "1"], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        with vr.SyncClient(redis_server.url) as client:
            q = client.queue(name)
            started = {int(m[1]): int(m[2]) for m in wait_for(log, STARTED.pattern, 2)}
            for pid in started.values():
                wait_for(log, rf":{pid}:\w+ starting on {name}")
            # One job at a time per process: two slow jobs run one in each.
            ids = [q.enqueue(Stamp(seconds=1.0)) for _ in range(2)]
            assert {i.result for i in wait_finished(q, ids)} == set(started.values())

            os.kill(started[0], signal.SIGKILL)
            wait_for(log, rf"worker 0 \(pid {started[0]}\) killed by SIGKILL; restarting in")
            restarted = [m for m in wait_for(log, STARTED.pattern, 3) if int(m[1]) == 0][-1]
            new_pid = int(restarted[2])
            assert new_pid != started[0]
            wait_for(log, rf":{new_pid}:\w+ starting on {name}")
            ids = [q.enqueue(Stamp(seconds=1.0)) for _ in range(2)]
            assert {i.result for i in wait_finished(q, ids)} == {new_pid, started[1]}

            # SIGTERM while each process runs a job: both finish, nothing is left running.
            ids = [q.enqueue(Stamp(seconds=1.5)) for _ in range(2)]
            deadline = time.monotonic() + 30
            while q.counts()["running"] < 2:
                assert time.monotonic() < deadline, q.counts()
                time.sleep(0.02)
            sup.send_signal(signal.SIGTERM)
            assert sup.wait(timeout=60) == 0, log.read_text()
            infos = [q.get(i) for i in ids]
            assert [(i.state, i.failures) for i in infos if i] == [(vr.JobState.COMPLETED, 0)] * 2
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    text = log.read_text()
    assert "SIGTERM received, forwarding to 2 worker(s)" in text
    assert "every worker stopped" in text
    for pid in (new_pid, started[1]):  # the children are gone too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_usage_error_is_not_restarted(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "venturi_redis.cli", "worker", "no-colon-here", "--processes", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "a usage error, restarting cannot help" in proc.stderr


GIVE_UP = """
import logging, sys, time
from venturi_redis.cli import processes
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
processes.BACKOFF_FIRST = 0.01
die = [sys.executable, "-c", "import sys; sys.exit(3)"]
live = [sys.executable, "-c", "import time; time.sleep(60)"]
t0 = time.monotonic()
code = processes.supervise([die, live])
print(f"supervise returned {code} after {time.monotonic() - t0:.1f}s")
"""


def test_a_child_that_keeps_dying_makes_the_supervisor_give_up() -> None:
    # The supervisor in a process of its own, as `venturi worker --processes`
    # runs it (signal handlers, children), not inside the test runner; its log
    # is kept, so a supervisor that does not give up fails with what it did.
    try:
        proc = subprocess.run(
            [sys.executable, "-c", GIVE_UP], cwd=ROOT, capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"the supervisor did not give up within 90 s; its log:\n{err}")
    assert proc.returncode == 0, proc.stderr
    assert "supervise returned 1" in proc.stdout, proc.stderr  # and the live one was stopped
    assert proc.stderr.count("exited with status 3; restarting") == processes.MAX_QUICK_DEATHS - 1
    assert "died 5 times in a row" in proc.stderr


class _FakeChild:
    """A child process for ``supervise(spawn=...)``: one that exits at once with
    ``code``, or (``code`` None) one that runs until SIGTERM ends it at once."""

    pids = iter(range(1000, 2000))

    def __init__(self, code: int | None) -> None:
        self.pid = next(self.pids)
        self.code = code

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, signum: int) -> None:
        self.code = -signum

    def kill(self) -> None:
        self.code = -9

    def wait(self) -> int | None:
        return self.code


def test_a_worker_stopped_by_the_give_up_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the subprocess test above met on a loaded machine: the healthy
    child, SIGTERMed when its sibling died once too often, ended before the
    supervisor's next pass, in the same pass, and was taken for a death and
    restarted (the failure forgotten): the supervisor never returned."""
    monkeypatch.setattr(processes, "BACKOFF_FIRST", 0.0)
    monkeypatch.setattr(processes, "_TICK", 0.001)
    started: list[str] = []

    def spawn(argv: Sequence[str]) -> Any:
        started.append(argv[0])
        return _FakeChild(3 if argv[0] == "die" else None)

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"supervise never returned; it started {started}")

    # In the main thread, as it runs (it sets signal handlers); an alarm ends a hang.
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        code = processes.supervise([["die"], ["live"]], spawn=spawn)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert code == 1
    assert started.count("die") == processes.MAX_QUICK_DEATHS
    assert started.count("live") == 1


def test_children_get_their_own_metrics_port() -> None:
    cmds = processes.child_commands("m:w", 3, options=["--json"], metrics_port=9464)
    assert [c[c.index("--metrics-port") + 1] for c in cmds] == ["9464", "9465", "9466"]
    assert all(c[1:5] == ["-m", "venturi_redis.cli", "worker", "m:w"] and "--json" in c for c in cmds)


FORWARD = """
import logging, sys
from venturi_redis.cli import processes
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
child = r'''
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGINT, lambda *a: (out.write_text("SIGINT"), sys.exit(0)))
out.write_text("ready")
time.sleep(60)
'''
print("supervise returned", processes.supervise([[sys.executable, "-c", child, p] for p in sys.argv[1:]]))
"""


def test_sigint_is_forwarded_to_every_child_and_a_clean_stop_exits_0(tmp_path: Path) -> None:
    # Ctrl-C: the children are in sessions of their own, so each gets the
    # supervisor's one forwarded SIGINT (and exits 0 on it here).
    marks = [tmp_path / "a", tmp_path / "b"]
    sup = subprocess.Popen(
        [sys.executable, "-c", FORWARD, *map(str, marks)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not all(m.exists() and m.read_text() == "ready" for m in marks):
            assert sup.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        sup.send_signal(signal.SIGINT)
        out, err = sup.communicate(timeout=60)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert (sup.returncode, out.strip()) == (0, "supervise returned 0"), err
    assert "SIGINT received, forwarding to 2 worker(s)" in err
    assert "every worker stopped" in err
    assert [m.read_text() for m in marks] == ["SIGINT", "SIGINT"]


def test_restarts_back_off_doubling_to_the_cap_and_reset_after_a_stable_run() -> None:
    slot = processes._Slot(0)
    waits = []
    for now in range(8):  # each death right after its start
        slot.started = float(now)
        slot.quick_deaths = 0  # only the backoff is looked at here
        assert processes._died(slot, "worker 0 (pid 1) killed by SIGKILL", -9, now + 0.1) is None
        assert slot.restart_at is not None
        waits.append(round(slot.restart_at - (now + 0.1), 3))
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    slot.started = 0.0  # a child that ran longer than STABLE starts over
    processes._died(slot, "worker 0 (pid 1) exited with status 1", 1, processes.STABLE + 1)
    assert (slot.quick_deaths, slot.backoff) == (1, 2 * processes.BACKOFF_FIRST)


def test_a_sigkilled_supervisor_takes_its_children_down_gracefully(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Issue 38's probe: the children (in sessions of their own) outlived a SIGKILLed
    supervisor as orphans, still claiming, and its restart started N more. Now each
    sees its lifeline close, and stops as on SIGTERM: its running job finishes."""
    name = f"procs-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": redis_server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "supervisor.log"
    cmd = [sys.executable, "-m", "venturi_redis.cli", "worker", "tests.procs.pworker:make_worker"]
    with log.open("wb") as out:
        sup = subprocess.Popen(
            [*cmd, "--processes", "2", "--concurrency", "1"], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    children: list[int] = []
    try:
        with vr.SyncClient(redis_server.url) as client:
            q = client.queue(name)
            children = [int(m[2]) for m in wait_for(log, STARTED.pattern, 2)]
            for pid in children:
                wait_for(log, rf":{pid}:\w+ starting on {name}")
            ids = [q.enqueue(Stamp(seconds=1.5)) for _ in range(2)]
            deadline = time.monotonic() + 30
            while q.counts()["running"] < 2:
                assert time.monotonic() < deadline, q.counts()
                time.sleep(0.02)
            sup.kill()
            sup.wait(timeout=30)
            deadline = time.monotonic() + 60
            while any(_alive(pid) for pid in children):
                assert time.monotonic() < deadline, f"orphans left running:\n{log.read_text()}"
                time.sleep(0.05)
            infos = [q.get(i) for i in ids]
            assert [(i.state, i.failures) for i in infos if i] == [(vr.JobState.COMPLETED, 0)] * 2
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert log.read_text().count("is gone: stopping as on SIGTERM") == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


UNSPAWNABLE = """
import logging, subprocess, sys
from venturi_redis.cli import processes
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
processes.BACKOFF_FIRST = 0.01
refusals = int(sys.argv[1])

def spawn(argv):
    global refusals
    if argv[-1] == "flaky" and refusals > 0:
        refusals -= 1
        raise OSError(11, "Resource temporarily unavailable")
    return subprocess.Popen(list(argv[:-1]), start_new_session=True)

live = [sys.executable, "-c", "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"]
print("supervise returned", processes.supervise([[*live, "steady"], [*live, "flaky"]], spawn=spawn))
"""


@pytest.mark.parametrize("refusals", [2, 99])
def test_a_child_that_cannot_be_spawned_is_a_quick_death_not_a_crash(refusals: int) -> None:
    """A fork refused (EAGAIN, ENOMEM) crashed the supervisor with a traceback,
    SIGKILLing the healthy children. Now it is retried with the backoff, and
    given up on like a child that keeps dying (the others stopped by SIGTERM)."""
    sup = subprocess.Popen(
        [sys.executable, "-c", UNSPAWNABLE, str(refusals)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if refusals == 2:  # started at the third try: it runs
            deadline = time.monotonic() + 180  # a bound against a hang, not a timing
            err = ""
            while "worker 1 started" not in err:
                assert sup.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
                err = _peek(sup)
            sup.send_signal(signal.SIGTERM)
        seen = _peek(sup) if refusals == 2 else ""
        out, rest = sup.communicate(timeout=60)
        err = seen + rest
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert "Traceback" not in err, err
    retried = "worker 1 could not be started ([Errno 11] Resource temporarily unavailable); restarting in"
    assert err.count(retried) == min(refusals, processes.MAX_QUICK_DEATHS - 1), err
    if refusals == 2:
        assert out.strip() == "supervise returned 0", err
    else:
        assert out.strip() == "supervise returned 1", err
        assert "died 5 times in a row" in err and "status -9" not in err


_peeked: dict[subprocess.Popen[str], list[bytes]] = {}


ONE_CHILD = """
import logging, sys
from venturi_redis.cli import processes
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
print("supervise returned", processes.supervise([[sys.executable, "-c", sys.argv[1]]]))
"""
# Still importing: no handler of its own yet, so the forwarded SIGTERM ends it.
STARTING = "import time; time.sleep(60)"
# Its handler installed, then a bad end on shutdown: an exit status, or a SIGKILL.
_HANDLED = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: {end}); "
    "print('handler on', file=sys.stderr, flush=True); time.sleep(60)"
)


@pytest.mark.parametrize(
    ("child", "ready", "status", "logged"),
    [
        (STARTING, "worker 0 started", 0, "stopped by SIGTERM while starting"),
        (_HANDLED.format(end="sys.exit(3)"), "handler on", 1, "worker 0 ended with status 3 on shutdown"),
        (
            _HANDLED.format(end="os.kill(os.getpid(), signal.SIGKILL)"),
            "handler on",
            1,
            "worker 0 ended with status -9 on shutdown",
        ),
    ],
    ids=["still-starting", "exit-3", "sigkill"],
)
def test_a_child_ended_by_the_forwarded_signal_while_starting_stopped_cleanly(
    child: str, ready: str, status: int, logged: str
) -> None:
    """A SIGTERM soon after start (a rolling restart) reached a child still
    importing, which died of it (status -15): the supervisor exited 1, "ended
    badly on shutdown", for a stop that went as asked. Now a child ended by
    the very signal forwarded to it is a clean stop; any other bad end on
    shutdown (an exit status, a SIGKILL) still makes it exit 1."""
    sup = subprocess.Popen(
        [sys.executable, "-c", ONE_CHILD, child],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180  # a bound against a hang, not a timing
        err = ""
        while ready not in err:
            assert sup.poll() is None and time.monotonic() < deadline, err
            time.sleep(0.05)
            err = _peek(sup)
        sup.send_signal(signal.SIGTERM)
        out, rest = sup.communicate(timeout=60)
        err += rest
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert out.strip() == f"supervise returned {status}", err
    assert logged in err, err
    assert "Traceback" not in err, err


def _peek(proc: subprocess.Popen[str]) -> str:
    """What the supervisor logged so far (stderr read without blocking).

    Read from the descriptor, never through ``proc.stderr``'s buffers: a
    ``readline`` there takes in every line the pipe holds and returns one,
    and ``select`` on the descriptor cannot see the rest. "worker 1 started"
    then waited, unseen, for the next line the supervisor wrote: the steady
    child's death when its sleep ran out, a minute later, after which the
    test's SIGTERM met its replacement before it could handle it (status
    -15: supervise returned 1). ``communicate`` reads what is left. Kept by
    process, not by pid (a pid is reused within a long run).
    """
    import select

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    chunks = _peeked.setdefault(proc, [])
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_one_process_unless_asked() -> None:
    # A pod is usually one process: --processes defaults to 1 (only N > 1 starts a supervisor).
    import inspect

    from venturi_redis.cli.worker import worker

    assert inspect.signature(worker).parameters["processes"].default == 1
