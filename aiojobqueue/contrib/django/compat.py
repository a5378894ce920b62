"""Django 6's ``django.tasks`` or, before it (Django 5.2), the ``django-tasks`` backport:
the same API under two names. Everything else in this package imports it from here."""

from __future__ import annotations

try:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    BACKPORT = False
except ImportError:  # Django < 6: the backport
    from django_tasks import (
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import (
        task_enqueued,
        task_finished,
        task_started,
    )

    BACKPORT = True

__all__ = [
    "BACKPORT", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError",
    "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "task_backends",
    "task_enqueued", "task_finished", "task_started",
]

