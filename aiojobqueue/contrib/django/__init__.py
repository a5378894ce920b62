"""aiojobqueue as a ``django.tasks`` backend (Django 6, and Django 5.2 with the
``django-tasks`` backport); see docs/django.md.

    TASKS = {"default": {"BACKEND": "aiojobqueue.contrib.django.TaskBackend",
                         "QUEUES": [], "OPTIONS": {"database": "default"}}}
    INSTALLED_APPS = [..., "aiojobqueue.contrib.django"]   # python manage.py aiojobqueue_worker
"""

from __future__ import annotations

from typing import Any

__all__ = ["Task", "TaskBackend"]


def __getattr__(name: str) -> Any:
    # Imported lazily: INSTALLED_APPS imports this package before settings are read.
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(name)
