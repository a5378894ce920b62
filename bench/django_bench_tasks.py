"""The task bench/django_plain.py enqueues (a Django task must live at module level)."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(a: int, b: int) -> int:
    return a + b
