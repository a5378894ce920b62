"""The Django app: ``"aiojobqueue.contrib.django"`` in ``INSTALLED_APPS`` brings the
``aiojobqueue_worker`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class AioJobQueueConfig(AppConfig):  # type: ignore[misc]
    """aiojobqueue's Django app (no models: the queue's tables are its own)."""

    name = "aiojobqueue.contrib.django"
    label = "aiojobqueue"
    verbose_name = "aiojobqueue"
