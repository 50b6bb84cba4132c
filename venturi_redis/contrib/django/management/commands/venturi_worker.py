"""``python manage.py venturi_worker``: run the tasks of one ``VenturiBackend`` until SIGTERM.

The options follow the existing ``venturi worker`` and django-tasks' database
worker (``db_worker``): ``--backend``, ``--queue-name`` (comma-separated
Django queue names, ``*`` for all), ``--batch`` (RQ's ``--burst`` is accepted
as the same flag), ``--concurrency``, ``--shutdown-grace``.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ....._model.errors import ConfigurationError
from ... import _compat


class Command(BaseCommand):
    help = "Run a venturi worker for a Django Tasks backend (graceful on SIGTERM / SIGINT)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias (default: default).")
        parser.add_argument(
            "--queue-name",
            default="*",
            help="The Django queue names to run, comma-separated; '*' (the default): every one in the "
            "backend's QUEUES.",
        )
        parser.add_argument(
            "--batch",
            "--burst",
            dest="batch",
            action="store_true",
            help="Run the tasks that are due, then exit (a task whose run_after is ahead is not waited for).",
        )
        parser.add_argument("--concurrency", type=int, default=None, help="Tasks at once, per queue.")
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            default=None,
            help="Seconds running tasks get to finish after SIGTERM (default 10); a second signal skips it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from ...worker import make_worker, run_worker

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        extra: dict[str, Any] = {}
        if options["concurrency"] is not None:
            extra["concurrency"] = options["concurrency"]
        if options["shutdown_grace"] is not None:
            extra["shutdown_grace"] = options["shutdown_grace"]
        names = [n.strip() for n in options["queue_name"].split(",") if n.strip()]
        alias = options["backend"]

        async def main() -> None:
            try:
                worker = make_worker(alias, queue_names=names, **extra)
            except (ConfigurationError, TypeError, _compat.InvalidTaskBackendError) as exc:
                raise CommandError(str(exc)) from None
            queues = ", ".join(q.name for q in worker.queues)
            tasks = ", ".join(sorted(worker.state.tasks)) or "none found"
            self.stdout.write(f"venturi worker for TASKS[{alias!r}] on {queues}; tasks: {tasks}")
            self.stdout.flush()
            try:
                await run_worker(worker, batch=options["batch"])
            finally:
                for client in {id(q.client): q.client for q in worker.queues}.values():
                    await client.aclose()
            if options["batch"]:
                self.stdout.write(f"venturi worker {worker.id}: no more tasks due on {queues}; exiting")

        anyio.run(main)
