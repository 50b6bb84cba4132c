"""``python manage.py venturi_worker``: run the tasks of one ``VenturiBackend`` until SIGTERM."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run a venturi worker for a Django Tasks backend (graceful on SIGTERM / SIGINT)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias (default: default).")
        parser.add_argument("--concurrency", type=int, default=None, help="Tasks at once, per queue.")

    def handle(self, *args: Any, **options: Any) -> None:
        from ...worker import make_worker

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        extra: dict[str, Any] = {}
        if options["concurrency"] is not None:
            extra["concurrency"] = options["concurrency"]

        async def main() -> None:
            worker = make_worker(options["backend"], **extra)
            queues = ", ".join(q.name for q in worker.queues)
            tasks = ", ".join(sorted(worker.state.tasks)) or "none found"
            self.stdout.write(f"venturi worker for TASKS[{options['backend']!r}] on {queues}; tasks: {tasks}")
            self.stdout.flush()
            try:
                await worker.run()
            finally:
                for client in {id(q.client): q.client for q in worker.queues}.values():
                    await client.aclose()

        anyio.run(main)
