"""``venturi worker ... --processes N``: N worker processes under one supervisor.

The supervisor imports nothing of the user's: each child is ``python -m
venturi_redis.cli worker ...`` with the same options (less ``--processes``),
in a session of its own, so a Ctrl-C in the terminal reaches the supervisor
alone and the children get exactly one signal each, forwarded. Then:

- a child that exits while no shutdown was asked for is restarted after a
  backoff (0.5 s, doubling to 30 s; back to 0.5 s once a child has run a
  minute), and the death is logged with its exit status; but one that exits
  0 stopped by itself (``--max-runs``, ``--max-memory-mib``: recycle.py), so
  a fresh one starts at once, and that is no death;
- SIGTERM or SIGINT is forwarded to every child; the supervisor waits for all
  of them (each lets its running jobs finish within its grace) and exits 0
  when they all stopped cleanly: with status 0, or, for a child still
  starting (its imports; a worker installs its handler before its first
  claim), ended by the forwarded signal itself;
- a child that cannot be kept alive (``MAX_QUICK_DEATHS`` deaths in a row,
  each within ``STABLE`` seconds of its start, or a usage error, status 2)
  makes the supervisor stop the others and exit 1; a child that cannot even
  be spawned (``fork`` or ``exec`` refused: out of processes, memory, file
  descriptors) counts as a quick death, instead of the supervisor crashing
  and SIGKILLing the healthy ones;
- ``--reload`` (development): a thread watches the ``.py`` files under the
  given directories (``watchfiles``, the ``reload`` extra); when some change,
  every child gets SIGTERM, stops gracefully, and a fresh one starts at once
  with the new code (no death, no backoff);
- a supervisor that dies without a word (SIGKILL, the OOM killer) takes its
  children down gracefully: each holds the read end of a pipe whose write end
  only the supervisor holds (``LIFELINE_ENV`` names the descriptor), sees its
  end of file when the supervisor is gone, and stops as on SIGTERM
  (``watch_lifeline``). Before, the children lived on as orphans, and the
  restarted supervisor started N more.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

log = logging.getLogger("venturi_redis.processes")

BACKOFF_FIRST = 0.5
BACKOFF_CAP = 30.0
STABLE = 60.0  # a child that ran this long has its backoff and death count reset
MAX_QUICK_DEATHS = 5
_TICK = 0.05
# The environment variable that tells a child which descriptor is its lifeline.
LIFELINE_ENV = "VENTURI_SUPERVISOR_FD"


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = None
    reloading: bool = False  # stopped for new code: started again at once when it exits
    # Read when the slot is made, so a test (or a tuned deployment) may set BACKOFF_FIRST.
    backoff: float = field(default_factory=lambda: BACKOFF_FIRST)


def child_commands(
    target: str,
    processes: int,
    *,
    options: Sequence[str],
    metrics_port: int | None,
) -> list[list[str]]:
    """One command line per child: this Python, the CLI's module, ``worker``, the options.

    Child ``i`` serves metrics on ``metrics_port + i`` (each process counts
    its own jobs; port 0 lets each pick a free one).
    """
    out = []
    for i in range(processes):
        argv = [sys.executable, "-m", "venturi_redis.cli", "worker", target, *options]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port + i if metrics_port else 0)]
        out.append(argv)
    return out


def supervise(
    commands: Sequence[Sequence[str]],
    *,
    spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] | None = None,
    reload: Sequence[Path] = (),
) -> int:
    """Run one child per command, keep them alive, stop them all on SIGTERM/SIGINT.

    ``reload``: directories whose ``.py`` files, when changed, make every
    child stop gracefully and start again with the new code (``--reload``).

    Returns the supervisor's exit status: 0 after a clean shutdown, 1 when a
    child could not be kept alive or a child ended badly on shutdown.
    """
    # The lifeline: the supervisor holds the write end (never inherited, PEP 446)
    # for as long as it lives; each child gets the read end.
    lifeline_r, lifeline_w = os.pipe()

    def spawn_child(argv: Sequence[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, LIFELINE_ENV: str(lifeline_r)}
        return subprocess.Popen(list(argv), start_new_session=True, pass_fds=(lifeline_r,), env=env)

    start = spawn or spawn_child
    slots = [_Slot(i) for i in range(len(commands))]
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    forwarded = 0
    failed: str | None = None
    changed: list[str] = []  # paths the watch thread saw change, not yet acted on
    watching = threading.Event()  # set: the watch thread stops
    if reload:
        _watch_files(reload, changed, watching)
    try:
        for slot in slots:
            failed = failed or _start(slot, commands[slot.index], start, time.monotonic())
        if failed is not None:
            log.error("supervisor: %s; stopping the other workers", failed)
            _terminate(slots)
        while True:
            now = time.monotonic()
            if forwarded < len(received):
                # Each signal is forwarded once to every child: a second one
                # makes the children skip their grace, as it would a worker's.
                for signum in received[forwarded:]:
                    log.warning(
                        "supervisor: %s received, forwarding to %d worker(s)", _name(signum), _alive(slots)
                    )
                    for slot in slots:
                        if slot.proc is not None and slot.proc.poll() is None:
                            slot.proc.send_signal(signum)
                forwarded = len(received)
            stopping = bool(received) or failed is not None
            if changed and not stopping:
                n = len(changed)  # what the watch thread adds meanwhile waits for the next pass
                paths = sorted({os.path.relpath(p) for p in changed[:n]})
                del changed[:n]
                shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
                log.warning("supervisor: %s changed; restarting the workers with the new code", shown)
                for slot in slots:
                    slot.reloading = slot.proc is not None
                _terminate(slots)
            for slot in slots:
                proc = slot.proc
                if proc is None:
                    if not stopping and slot.restart_at is not None and now >= slot.restart_at:
                        failed = _start(slot, commands[slot.index], start, now)
                        if failed is not None:
                            log.error("supervisor: %s; stopping the other workers", failed)
                            _terminate(slots)
                            stopping = True  # the slots after this one are stopping too
                    continue
                code = proc.poll()
                if code is None:
                    if now - slot.started >= STABLE:
                        slot.quick_deaths, slot.backoff = 0, BACKOFF_FIRST
                    continue
                slot.proc = None
                if not stopping and (slot.reloading or code == 0):
                    # Stopped for new code (--reload), or by itself, its jobs finished
                    # (--max-runs, --max-memory-mib): no death, a fresh one now.
                    why = "stopped for the new code" if slot.reloading else "recycled itself"
                    slot.reloading = False
                    fresh = "supervisor: worker %d (pid %d) %s; starting a fresh one"
                    log.info(fresh, slot.index, proc.pid, why)
                    slot.restart_at = now
                    continue
                if stopping:
                    if code < 0 and -code in received:
                        # Ended by the very signal forwarded to it: a child still
                        # starting, its handler not installed yet (a worker
                        # installs it before its first claim). Stopped as asked.
                        log.info(
                            "supervisor: worker %d (pid %d) stopped by %s while starting",
                            slot.index,
                            proc.pid,
                            _name(-code),
                        )
                    elif code != 0:
                        log.warning(
                            "supervisor: worker %d (pid %d) ended with status %s", slot.index, proc.pid, code
                        )
                        failed = failed or f"worker {slot.index} ended with status {code} on shutdown"
                    continue
                how = f"killed by {_name(-code)}" if code < 0 else f"exited with status {code}"
                failed = _died(slot, f"worker {slot.index} (pid {proc.pid}) {how}", code, now)
                if failed is not None:
                    log.error("supervisor: %s; stopping the other workers", failed)
                    _terminate(slots)
                    # From here on in this pass too: a later slot's child, ended by
                    # that SIGTERM before the next pass, is stopping, not a death
                    # to restart (which would also forget the failure).
                    stopping = True
            if stopping and all(slot.proc is None for slot in slots):
                break
            time.sleep(_TICK)
    finally:
        watching.set()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for slot in slots:  # only on an error of our own: never leave children behind
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        os.close(lifeline_r)
        os.close(lifeline_w)
    if failed is not None:
        log.error("supervisor: exiting with status 1: %s", failed)
        return 1
    log.info("supervisor: every worker stopped")
    return 0


def _start(
    slot: _Slot,
    command: Sequence[str],
    start: Callable[[Sequence[str]], subprocess.Popen[bytes]],
    now: float,
) -> str | None:
    """Start the slot's child; the reason to give up, if it cannot be spawned once too often."""
    slot.started = now
    try:
        slot.proc = start(command)
    except OSError as exc:  # fork/exec refused: a death before birth, retried with the backoff
        slot.proc = None
        return _died(slot, f"worker {slot.index} could not be started ({exc})", 1, now)
    slot.restart_at = None
    log.info("supervisor: worker %d started (pid %d)", slot.index, slot.proc.pid)
    return None


def _died(slot: _Slot, what: str, code: int, now: float) -> str | None:
    """Schedule the slot's restart; the reason to give up instead, if there is one."""
    if code == 2:
        return f"{what}: a usage error, restarting cannot help"
    if now - slot.started < STABLE:
        slot.quick_deaths += 1
    else:
        slot.quick_deaths, slot.backoff = 1, BACKOFF_FIRST
    if slot.quick_deaths >= MAX_QUICK_DEATHS:
        return (
            f"worker {slot.index} died {slot.quick_deaths} times in a row, each within {STABLE:g}s "
            f"of its start (last: {what})"
        )
    slot.restart_at = now + slot.backoff
    log.warning("supervisor: %s; restarting in %.1fs", what, slot.backoff)
    slot.backoff = min(slot.backoff * 2, BACKOFF_CAP)
    return None


def _watch_files(paths: Sequence[Path], changed: list[str], stop: threading.Event) -> None:
    """A daemon thread that appends the ``.py`` files changed under ``paths`` to ``changed``."""
    import watchfiles  # the reload extra; the CLI checked it is there

    def watch() -> None:
        for changes in watchfiles.watch(
            *paths, watch_filter=watchfiles.PythonFilter(), stop_event=stop, raise_interrupt=False
        ):
            changed.extend(path for _, path in changes)

    threading.Thread(target=watch, name="venturi-reload", daemon=True).start()


def _terminate(slots: Sequence[_Slot]) -> None:
    for other in slots:
        if other.proc is not None and other.proc.poll() is None:
            other.proc.send_signal(signal.SIGTERM)


def watch_lifeline() -> None:
    """In a child of the supervisor: stop as on SIGTERM once the supervisor is gone.

    A daemon thread blocks reading the lifeline (``LIFELINE_ENV``), which the
    supervisor never writes: the read returns end of file when the last
    write end closes, that is when the supervisor exits, however it died.
    The descriptor is kept from this process's own children.
    """
    raw = os.environ.pop(LIFELINE_ENV, "")
    if not raw.isdigit():
        return
    fd = int(raw)
    try:
        os.set_inheritable(fd, False)
    except OSError:  # not open here (a command line copied by hand): nothing to watch
        return

    parent = os.getppid()

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        log.warning("supervisor (pid %d) is gone: stopping as on SIGTERM", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="venturi-lifeline", daemon=True).start()


def _alive(slots: Sequence[_Slot]) -> int:
    return sum(1 for s in slots if s.proc is not None and s.proc.poll() is None)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
