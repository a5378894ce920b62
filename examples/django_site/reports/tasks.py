"""A per-tenant pipeline: ``load`` fans out one ``score`` per row, ``summarize`` runs once
``load`` has succeeded. Each tenant's tasks run in its own queue (= fair-share group), so
one big tenant does not starve the others."""

import time

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2 + the django-tasks backport


@task()
def score(tenant: str, row: int) -> int:
    """A plain function: it runs in a worker thread (blocking calls are fine)."""
    time.sleep(0.05)
    return row * row


@task()
def load(tenant: str, rows: int) -> list[str]:
    """Fan out: one ``score`` task per row, in the tenant's queue; returns their ids."""
    return [score.using(queue_name=tenant).enqueue(tenant, r).id for r in range(rows)]


@task(timeout=60, max_attempts=5)
async def summarize(tenant: str) -> str:
    """An async task: it runs on the worker's event loop."""
    return f"{tenant}: loaded and scored"
