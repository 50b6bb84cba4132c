"""Recycling: a worker that stops by itself, to be started afresh, after so many runs or so much memory.

Handlers that leak (a library's cache, a C extension, a growing module
global) grow a long-lived worker until its pod is OOM-killed, mid-job. Celery
users set ``--max-tasks-per-child`` and ``--max-memory-per-child`` for this,
RQ users ``--max-jobs``. ``Worker(max_runs=..., max_memory_mib=...)`` is
ours: once the worker has claimed ``max_runs`` runs, or its resident memory
is above ``max_memory_mib``, it claims no more, lets every running job
finish (however long: no grace applies, and no handler is asked to stop), and
``run()`` returns. ``venturi worker`` then exits 0, and ``--processes``
starts a fresh child at once (cli/processes.py); under Kubernetes or
systemd, the container or unit restarts.

The run budget is taken before each claim (``reserve``) and what the claim
did not use is given back (``settle``), so queues claiming at once never
overshoot it. Nothing of this runs when neither is set.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from collections.abc import Callable

import anyio

log = logging.getLogger("venturi_redis.worker")

MEMORY_CHECK_EVERY = 1.0  # seconds between two reads of the resident memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mib() -> float:
    """This process's resident memory now, in MiB (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except OSError:  # not Linux: the peak, which getrusage gives in KiB here, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class Recycling:
    """A worker's ``max_runs`` budget and ``max_memory_mib`` bound.

    Args:
        max_runs: Runs the worker claims before it stops; None: no bound.
        max_memory_mib: Resident memory above which it stops; None: no bound.
        stop: Called once, with the reason, when a bound is reached.
    """

    def __init__(self, max_runs: int | None, max_memory_mib: int | None, stop: Callable[[str], None]) -> None:
        self.max_runs = max_runs
        self.runs_left = max_runs
        self.max_memory_mib = max_memory_mib
        self.stop = stop

    def reserve(self, want: int) -> int:
        """How many of ``want`` jobs a claim may take; taken from the budget until ``settle``."""
        if self.runs_left is None:
            return want
        n = min(want, self.runs_left)
        self.runs_left -= n
        return n

    def settle(self, reserved: int, claimed: int) -> None:
        """A claim of ``reserved`` returned ``claimed`` jobs: the rest goes back; stop once all is used."""
        if self.runs_left is None:
            return
        self.runs_left += reserved - claimed
        if self.runs_left <= 0 and claimed:
            self.stop(f"claimed {self.max_runs} runs (max_runs={self.max_runs})")

    async def watch_memory(self) -> None:
        """Read the resident memory every ``MEMORY_CHECK_EVERY`` s; stop the worker above the bound."""
        limit = self.max_memory_mib
        if limit is None:
            return
        while True:
            await anyio.sleep(MEMORY_CHECK_EVERY)
            rss = resident_mib()
            if rss > limit:
                self.stop(f"its resident memory is {rss:.0f} MiB, above max_memory_mib={limit}")
                return
