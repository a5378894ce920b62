import json
import os
import time

from django.apps import AppConfig


def note(ev: str, **kw: object) -> None:
    """One JSON line in AJQ_DJ_LOG (O_APPEND: lines of several processes never mix)."""
    path = os.environ.get("AJQ_DJ_LOG")
    if path:
        rec = {"t": time.time(), "pid": os.getpid(), "ev": ev, **kw}
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(rec) + "\n").encode())
        finally:
            os.close(fd)


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self) -> None:
        from aiojobqueue.contrib.django.compat import task_finished, task_started

        def started(sender: object, task_result: object, **kw: object) -> None:
            note("signal_started", id=task_result.id, status=str(task_result.status))  # type: ignore[attr-defined]

        def finished(sender: object, task_result: object, **kw: object) -> None:
            note("signal_finished", id=task_result.id, status=str(task_result.status))  # type: ignore[attr-defined]

        task_started.connect(started, weak=False)
        task_finished.connect(finished, weak=False)
