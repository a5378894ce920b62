"""``python manage.py aiojobqueue_worker``: run the tasks of a Django task backend of
aiojobqueue's until SIGTERM or SIGINT (then it stops as ``aiojobqueue worker`` does:
running tasks get ``shutdown_timeout`` to finish, the rest are released to run again)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import autodiscover_modules, import_module

from .....runner import run_worker
from ...backend import TaskBackend
from ...compat import task_backends
from ...worker import build_queue


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the tasks of an aiojobqueue task backend (until SIGTERM)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default="default",
                            help="the TASKS alias (default: default)")
        parser.add_argument("--capacity", type=int, default=None,
                            help="tasks at once in this process (default: OPTIONS or 10)")
        parser.add_argument("--module", action="append", default=[],
                            help="a module defining tasks, besides each app's tasks.py")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = task_backends[options["backend"]]
        if not isinstance(backend, TaskBackend):
            raise CommandError(f"TASKS[{options['backend']!r}] is not aiojobqueue's backend")
        # tasks register with the backend when they are defined: import where they live
        autodiscover_modules("tasks")
        for name in options["module"] + list(backend.options.get("modules", [])):
            import_module(name)
        if not backend.tasks:
            raise CommandError("no task found (define them in an app's tasks.py, or --module)")
        if options["verbosity"] > 0:
            logging.basicConfig(level=logging.INFO,
                                format="%(asctime)s %(name)s %(levelname)s %(message)s")
        asyncio.run(self._serve(backend, options["capacity"]))

    async def _serve(self, backend: TaskBackend, capacity: int | None) -> None:
        q = build_queue(backend, capacity=capacity)
        await q.start()
        self.stdout.write(f"aiojobqueue worker {q.worker_id}: {len(backend.tasks)} tasks",
                          ending="\n")
        self.stdout.flush()
        try:
            await run_worker(q)
        finally:
            await q.close()
