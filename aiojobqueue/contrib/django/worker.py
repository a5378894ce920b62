"""The worker side of the Django backend: a ``JobQueue`` serving the backend's tasks, each
run as Django runs a request (``close_old_connections`` before and after) between
``task_started`` and ``task_finished``. Plain tasks run in worker threads (threads.py),
async ones on the loop."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from ...executor import JobContext
from ...queue import JobQueue
from ...threads import ThreadContext
from . import compat
from .backend import TaskBackend

__all__ = ["build_queue"]

#: OPTIONS of the backend that are JobQueue options (the worker's settings)
_QUEUE_OPTIONS = ("capacity", "concurrency", "group_limits", "lease_ttl", "heartbeat_interval",
                  "poll_interval", "shutdown_timeout", "retry_backoff", "retry_backoff_max",
                  "max_attempts")


def build_queue(backend: TaskBackend, **overrides: Any) -> JobQueue:
    """A JobQueue on ``backend``'s database with a handler for each task it knows."""
    from ...dialects.urls import async_url_of

    opts = {k: backend.options[k] for k in _QUEUE_OPTIONS if k in backend.options}
    opts.update({k: v for k, v in overrides.items() if v is not None})
    q = JobQueue(async_url_of(backend.url()), prefix=backend.prefix, **opts)
    for path, task in backend.tasks.items():
        q.handler(path)(_handler(backend, task))
    return q


def _running(backend: TaskBackend, task: Any, job_id: int, attempt: int, worker: str,
             args: list[Any], kwargs: dict[str, Any]) -> Any:
    now = timezone.now()
    return compat.TaskResult(
        task=task, id=str(job_id), status=compat.TaskResultStatus.RUNNING, enqueued_at=None,
        started_at=now, finished_at=None, last_attempted_at=now, args=args, kwargs=kwargs,
        backend=backend.alias, errors=[], worker_ids=[worker] * attempt)


def _ended(result: Any, failed: bool) -> Any:
    status = compat.TaskResultStatus.FAILED if failed else compat.TaskResultStatus.SUCCESSFUL
    for name, value in (("status", status), ("finished_at", timezone.now())):
        object.__setattr__(result, name, value)
    return result


def _handler(backend: TaskBackend, task: Any) -> Callable[..., Any]:
    sender = type(backend)
    fn = task.func

    def call_args(result: Any, args: list[Any]) -> list[Any]:
        return [compat.TaskContext(task_result=result), *args] if task.takes_context else args

    if inspect.iscoroutinefunction(fn):
        async def run_async(ctx: JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
            worker = ctx.queue.worker_id
            result = _running(backend, task, ctx.job_id, ctx.attempt, worker, args, kwargs)
            await sync_to_async(close_old_connections)()
            await sync_to_async(compat.task_started.send)(sender, task_result=result)
            try:
                value = await fn(*call_args(result, args), **kwargs)
            except Exception:
                await sync_to_async(compat.task_finished.send)(
                    sender, task_result=_ended(result, True))
                raise
            finally:
                await sync_to_async(close_old_connections)()
            await sync_to_async(compat.task_finished.send)(
                sender, task_result=_ended(result, False))
            return {"return_value": value, "worker_id": worker}

        return run_async

    def run(ctx: ThreadContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
        worker = ctx.queue.worker_id
        result = _running(backend, task, ctx.job_id, ctx.attempt, worker, args, kwargs)
        close_old_connections()  # as Django's request cycle does, in this worker thread
        try:
            compat.task_started.send(sender, task_result=result)
            try:
                value = fn(*call_args(result, args), **kwargs)
            except Exception:
                compat.task_finished.send(sender, task_result=_ended(result, True))
                raise
            compat.task_finished.send(sender, task_result=_ended(result, False))
        finally:
            close_old_connections()
        return {"return_value": value, "worker_id": worker}

    return run
