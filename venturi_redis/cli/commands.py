"""The ``venturi`` command, assembled: importing this module registers every command on ``app``.

Conventions every command follows:

- ``--redis URL`` (default: ``REDIS_URL``, then ``redis://127.0.0.1:6379/0``);
- ``--json`` prints one JSON document on stdout instead of tables;
- exit status 0 on success, 1 when the operation could not be done (unknown
  job, wrong state, Redis unreachable, a worker refused to start), 2 for a
  usage error;
- strings that come from users or from Redis (kinds, notes, payloads, ids)
  are printed with control characters escaped, never interpreted, so a job
  cannot rewrite the operator's terminal.

Where things are: ``app.py`` (the typer app, shared options, the one error
mapping), ``output.py`` (safe text, tables, JSON, job documents),
``reading.py`` (stats, jobs, job show), ``admin.py`` (job retry, cancel and
update; queue pause, resume, events), ``bulk.py`` (bulk actions by filter:
dead retry, cancel, purge), ``worker.py`` (``venturi worker``),
``dashboard.py`` (``venturi dashboard``), ``events.py`` (``venturi events``:
follow a queue live), ``schedules.py`` (``venturi schedules``,
``venturi schedule remove|pause|resume|trigger``), ``limits.py`` (``venturi limits``,
``venturi limit set|clear``), ``history.py`` (``venturi stats --history``,
``venturi queue history on|off``: the metrics history), ``queues.py`` (``venturi queues rebuild``: the
registry of queues refilled by one SCAN, the only one).
"""

from __future__ import annotations

from . import admin, bulk, dashboard, events, history, limits, queues, reading, schedules, worker  # noqa: F401 - importing a module registers its commands
from .app import app

__all__ = ["app"]
