"""``TaskBackend``: Django's task API on aiojobqueue. A task is a job whose type is the
task's module path (``myapp.tasks.send_mail``) and whose args are ``{"args": [...],
"kwargs": {...}}``; ``queue_name`` is its group. A finished job's result is
``{"return_value": ..., "worker_id": ...}``.

Enqueue goes through a ``SyncQueue`` on the backend's database (its own connections), or on
Django's own connection inside ``transaction.atomic()`` (connection.py)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from ...errors import InvalidJobError, JobNotFoundError
from ...models import Job, JobState
from ...sync import SyncQueue
from . import compat
from .connection import DjangoConnections, url_of

__all__ = ["Task", "TaskBackend"]

_STATUS = {
    JobState.DONE: "SUCCESSFUL", JobState.FAILED: "FAILED", JobState.CANCELLED: "FAILED",
    JobState.RUNNING: "RUNNING",
}
#: ``Task`` fields that are Django's own; the others are aiojobqueue's enqueue options
_EXTRA = ("group", "weight", "key", "timeout", "max_attempts", "depends_on")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Task(compat.Task):  # type: ignore[misc]
    """Django's Task with aiojobqueue's enqueue options, set by ``@task(...)`` (Django 6.1
    passes unknown keywords to the backend's task class) or ``.using(...)``:
    ``group`` (default: ``queue_name``), ``weight``, ``key``, ``timeout`` (seconds),
    ``max_attempts``, and ``depends_on`` (TaskResult ids: runs once they succeeded)."""

    group: str | None = None
    weight: int | None = None
    key: str | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    depends_on: tuple[str, ...] = ()

    def using(self, **changes: Any) -> Task:
        """A copy with other defaults: Django's (priority, queue_name, run_after, backend)
        and aiojobqueue's (see the class)."""
        extra = {k: changes.pop(k) for k in list(changes) if k in _EXTRA}
        if "depends_on" in extra:
            extra["depends_on"] = tuple(str(getattr(d, "id", d)) for d in extra["depends_on"])
        base = compat.Task.using(self, **changes)
        return dataclasses.replace(base, **extra) if extra else base  # type: ignore


class TaskBackend(compat.BaseTaskBackend):  # type: ignore[misc]
    """``"BACKEND": "aiojobqueue.contrib.django.TaskBackend"``. ``OPTIONS``: ``database``
    (a ``DATABASES`` alias, default ``"default"``) or ``url`` (any aiojobqueue URL),
    ``prefix`` (table prefix), ``max_attempts`` (default 3), and for the worker
    ``capacity``, ``concurrency``... (any ``JobQueue`` option, see worker.py).
    ``"QUEUES": []`` accepts any queue name (each is a group)."""

    task_class = Task
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        opts = self.options
        self.database: str | None = None if "url" in opts else opts.get("database", "default")
        self.prefix: str = opts.get("prefix", "ajq_")
        #: the tasks this process has seen, by module path (the worker serves these)
        self.tasks: dict[str, Any] = {}
        self._queue: SyncQueue | None = None
        self._lock = threading.Lock()
        self._joins = DjangoConnections(self.database) if self.database else None

    # -- configuration --------------------------------------------------------------------
    def url(self) -> str:
        """The database URL (default drivers) of this backend."""
        if self.database is None:
            return str(self.options["url"])
        from django.db import connections

        return url_of(connections[self.database].settings_dict)

    @property
    def queue(self) -> SyncQueue:
        """The SyncQueue enqueues and reads go through (built on first use)."""
        q = self._queue
        if q is None:
            with self._lock:
                if self._queue is None:
                    self._queue = SyncQueue(
                        self.url(), prefix=self.prefix,
                        max_attempts=int(self.options.get("max_attempts", 3)))
                q = self._queue
        return q

    def validate_task(self, task: Any) -> None:
        """Django's checks (priority, run_after, queue name...), then aiojobqueue's."""
        super().validate_task(task)
        for name, kind in (("weight", int), ("max_attempts", int), ("timeout", (int, float))):
            v = getattr(task, name, None)
            if v is not None and (not isinstance(v, kind) or isinstance(v, bool) or v <= 0):
                raise compat.InvalidTask(f"{name} must be a positive number: {v!r}")
        self.tasks.setdefault(task.module_path, task)

    # -- enqueue --------------------------------------------------------------------------
    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Insert the task's job (in Django's transaction inside ``atomic()``, where the
        database driver allows it) and return its READY ``TaskResult``. (The task was
        validated when it was made: ``@task`` and ``.using()`` build a new one.)"""
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False
            run_after = timezone.make_aware(run_after)
        opts: dict[str, Any] = {
            "group": getattr(task, "group", None) or task.queue_name,
            "priority": task.priority, "run_after": run_after,
            "weight": getattr(task, "weight", None), "key": getattr(task, "key", None),
            "timeout": getattr(task, "timeout", None),
            "max_attempts": getattr(task, "max_attempts", None),
            "depends_on": [_job_id(d) for d in getattr(task, "depends_on", ())],
        }
        payload = {"args": list(args), "kwargs": dict(kwargs)}
        joins = self._joins
        if joins is not None and joins.joinable():
            with joins.connection() as conn:
                jid = self.queue.enqueue(task.module_path, payload, connection=conn, **opts)
        else:
            jid = self.queue.enqueue(task.module_path, payload, **opts)
        result = compat.TaskResult(
            task=task, id=str(jid), status=compat.TaskResultStatus.READY,
            enqueued_at=timezone.now(), started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[])
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    # -- results --------------------------------------------------------------------------
    def get_result(self, result_id: str) -> Any:
        """The task's ``TaskResult`` now; TaskResultDoesNotExist for an id that is no task
        of this backend's."""
        try:
            job = self.queue.get(_job_id(result_id))
        except (InvalidJobError, JobNotFoundError):
            raise compat.TaskResultDoesNotExist(result_id) from None
        return self.result_of(job)

    def result_of(self, job: Job) -> Any:
        """``job`` as Django's ``TaskResult``."""
        task = self.tasks.get(job.type)
        if task is None:
            try:
                task = import_string(job.type)
            except ImportError:
                task = None
        if not isinstance(task, compat.Task) or not {"args", "kwargs"} <= job.args.keys():
            raise compat.TaskResultDoesNotExist(str(job.id))
        status = _STATUS.get(job.state, "READY")
        errors = [compat.TaskError(
            exception_class_path=_exception_path(e.get("traceback") or "", e.get("type") or ""),
            traceback=e.get("traceback") or e.get("message") or "") for e in job.errors]
        workers = [str(e.get("worker")) for e in job.errors]
        done = job.result if isinstance(job.result, dict) else {}
        if job.state == JobState.DONE and "worker_id" in done:
            workers.append(str(done["worker_id"]))
        elif job.state == JobState.RUNNING and job.lease_owner:
            workers.append(job.lease_owner)
        result = compat.TaskResult(
            task=task, id=str(job.id), status=compat.TaskResultStatus[status],
            enqueued_at=job.created_at, started_at=job.started_at,
            finished_at=job.finished_at if job.terminal else None,
            last_attempted_at=job.started_at, args=job.args["args"],
            kwargs=job.args["kwargs"], backend=self.alias, errors=errors, worker_ids=workers)
        if job.state == JobState.DONE:
            object.__setattr__(result, "_return_value", done.get("return_value"))
        return result

    def close(self) -> None:
        """Close the backend's connections (Django calls it on ``task_backends.close_all``)."""
        if self._queue is not None:
            self._queue.close()
            self._queue = None


def _job_id(result_id: Any) -> int:
    try:
        return int(str(getattr(result_id, "id", result_id)))
    except ValueError:
        raise InvalidJobError(f"not a task result id of aiojobqueue: {result_id!r}") from None


def _exception_path(tb: str, name: str) -> str:
    """The exception's class path, read from the traceback's last line (``pkg.mod.Error:
    message``; a builtin one is shown by its bare name)."""
    lines = [ln for ln in tb.splitlines() if ln and not ln.startswith(" ")]
    last = lines[-1].split(":", 1)[0].strip() if lines else name
    if not last or " " in last:
        last = name
    return last if "." in last else f"builtins.{last}"


