"""The blocked-loop watch: says when a handler blocks the worker's event loop, where, and for how long.

A worker claims, renews leases and writes endings on the one event loop its
async handlers run on. An ``async def handle`` that blocks it (``time.sleep``,
CPU-bound work, a blocking client) stops all of that until it returns
(docs/guarantees.md, "Handlers that block the event loop"). Past the lease,
another worker runs the job again and this run's outcome is refused: the
journal shows ``lease_expired`` and ``refused``, and nothing said why.

Two halves, one per thread:

- on the loop, a task that notes the time every ``period`` (a quarter of the
  threshold): its beat. When a beat comes late by the threshold or more, the
  loop has just run again after a block, and it logs how long that was;
- a daemon thread that wakes every ``period`` and, when the beat is overdue
  by the threshold, logs once for that block, while it lasts: the job the
  loop is running (the ``job`` of ``execute``'s frame on the loop thread's
  stack) and the lines it is blocked on (``sys._current_frames``).

A process that was stopped or starved as a whole (SIGSTOP, a paused VM, a
CPU quota) stops both threads: the watch thread then wakes late itself, and
that block is not reported as a handler's. A loop that is not running (kept
between two ``run_until_complete`` calls) is not blocked either, and a loop
closed under a run that was never cancelled ends the thread. Nothing of this
runs per job.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import anyio

from .guarded import observer_raised

log = logging.getLogger("venturi_redis.worker")

# Frames of these directories are the worker's (and its loop's), not the handler's.
_PACKAGE = str(Path(__file__).resolve().parent.parent)
_INNERMOST = 12  # at most this many of the handler's frames in a warning
_ADVICE = (
    "An async handler must not block: make its handle() a plain def (it then runs in a "
    "thread) or await anyio.to_thread.run_sync(...) around the blocking call"
)


class LoopWatch:
    """Watches one worker's event loop (``Worker(blocked_loop_warning=...)``).

    Args:
        worker_id: Named in every message.
        threshold: Seconds without a beat that count as a blocked loop.
        lease_s: The worker's lease, for what a block of that length means.
        running: The jobs the worker holds, named when the stack shows none.
        run_frames: The code of the function that runs a job, with the name
            of its local holding the job (``execute``'s ``job``).
        observer: The worker's observer; its ``loop_blocked(seconds)``, when
            it has one, is told of each block once it ended.
        noted: Told of each block once it ended too (the worker's
            registration counts them for ``venturi workers``).
    """

    def __init__(
        self,
        worker_id: str,
        threshold: float,
        lease_s: float,
        running: Callable[[], Iterable[Any]],
        run_frames: dict[CodeType, str],
        observer: Callable[[], Any] = lambda: None,
        noted: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.worker_id = worker_id
        self.threshold = threshold
        self.period = threshold / 4
        self.lease_s = lease_s
        self.running = running
        self.run_frames = run_frames
        self.observer = observer
        self.noted = noted
        self._beat = time.monotonic()
        self._reported = -1.0  # the beat whose block the thread reported
        self._loop_thread = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()

    async def run(self) -> None:
        """Beat until cancelled, with the watch thread beside."""
        self._loop_thread = threading.get_ident()
        self._loop = asyncio.get_running_loop()
        self._beat = time.monotonic()
        self._stop.clear()
        thread = threading.Thread(
            target=self._watch, name=f"venturi-loop-watch:{self.worker_id}", daemon=True
        )
        thread.start()
        try:
            while True:
                await anyio.sleep(self.period)
                now = time.monotonic()
                # The block began between the last beat and the period after
                # it (the timer would have run first otherwise): its middle.
                blocked = now - self._beat - self.period / 2
                reported = self._reported == self._beat
                self._beat = now
                if reported:
                    self._ended(blocked)
        finally:
            self._stop.set()
            thread.join(timeout=1.0)

    def _ended(self, blocked: float) -> None:
        """The loop ran again after a block the thread reported."""
        if blocked >= self.lease_s:
            what = (
                f"longer than the {self.lease_s:g} s lease: its jobs' leases may have expired, another "
                "worker may be running them again, and their outcome here will then be refused"
            )
        elif blocked >= self.lease_s / 3:
            what = f"lease renewals (every {self.lease_s / 3:g} s) were late meanwhile"
        else:
            what = "no other job ran meanwhile"
        again = "the event loop ran again after about %.1f s blocked"
        log.warning("worker %s: " + again + "; %s", self.worker_id, blocked, what)
        self.noted(blocked)
        told = getattr(self.observer(), "loop_blocked", None)
        if told is not None:
            try:
                told(blocked)
            except Exception as exc:  # noqa: BLE001 - the application's observer
                observer_raised("loop_blocked", exc)

    def _watch(self) -> None:
        """The thread: reports a beat overdue by the threshold, once per block."""
        woke = time.monotonic()
        loop = self._loop
        while not self._stop.wait(self.period):
            if loop is None or loop.is_closed():
                return  # run() was abandoned with its loop (never cancelled): nothing left to watch
            if not loop.is_running():
                continue  # a loop kept between runs (run_until_complete): not blocked, stopped
            now = time.monotonic()
            overslept = now - woke - self.period
            woke = now
            beat = self._beat
            if overslept >= self.threshold / 2 or beat == self._reported:
                continue  # the whole process stood still (not a handler's block), or told already
            if now - beat - self.period >= self.threshold:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is None or _idle(frame):
                    continue
                self._reported = beat
                log.warning("%s", self.describe(frame, now - beat - self.period))

    def describe(self, frame: FrameType, blocked: float) -> str:
        """The warning for a loop blocked ``blocked`` seconds, whose thread is at ``frame``."""
        job = self._job_on(frame)
        if job is not None:
            where = f"running job {job.id} ({job.kind}) of queue {job.queue.name}"
        else:
            held = list(self.running())
            kinds = sorted({j.kind for j in held})
            where = f"holding {len(held)} job(s) ({', '.join(kinds[:5]) or 'none'})"
        lines = "".join(traceback.format_list(_handler_frames(frame))).rstrip()
        return (
            f"worker {self.worker_id}: the event loop has been blocked for at least {blocked:.1f} s, "
            f"{where}; "
            f"no lease is renewed and no other job runs until it returns (lease {self.lease_s:g} s). "
            f"{_ADVICE}. Blocked at:\n{lines}"
        )

    def _job_on(self, frame: FrameType) -> Any:
        f: FrameType | None = frame
        while f is not None:
            name = self.run_frames.get(f.f_code)
            if name is not None:
                return f.f_locals.get(name)
            f = f.f_back
        return None


def _idle(frame: FrameType) -> bool:
    """Whether the loop's thread is waiting for I/O (the loop itself, not a handler)."""
    return frame.f_code.co_filename.endswith("selectors.py")


def _handler_frames(frame: FrameType) -> traceback.StackSummary:
    """The innermost frames past the worker's own: the handler's code and what it called."""
    frames = traceback.extract_stack(frame)
    ours = [i for i, f in enumerate(frames) if f.filename.startswith(_PACKAGE)]
    inner = frames[ours[-1] + 1 :] if ours and ours[-1] + 1 < len(frames) else frames[-_INNERMOST:]
    return traceback.StackSummary.from_list(inner[-_INNERMOST:])
