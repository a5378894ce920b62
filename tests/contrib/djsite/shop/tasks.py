"""The test project's tasks: plain and async, failing, with context, slow, fanning out."""

import asyncio
import threading
import time

from django.db import connection

from aiojobqueue.contrib.django.compat import task_backends

from .apps import note

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


class Boom(Exception):
    pass


@task()
def add(a: int, b: int) -> dict:
    with connection.cursor() as cur:  # Django's own connection, from a worker thread
        cur.execute("SELECT 1")
        one = cur.fetchone()[0]
    return {"sum": a + b, "thread": threading.current_thread().name, "one": one}


@task(priority=10, queue_name="emails")
async def aadd(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(max_attempts=2)
def boom() -> None:
    raise Boom("no luck")


@task(takes_context=True)
def with_context(context: object, x: int) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id, "x": x}  # type: ignore[attr-defined]


@task()
def slow(seconds: float) -> str:
    note("slow_start")
    time.sleep(seconds)
    note("slow_end")
    return "slept"


@task()
def part(tenant: str, n: int) -> int:
    return n * n


@task()
def fan_out(tenant: str, n: int) -> list:
    """Enqueue one ``part`` per item, each in the tenant's group."""
    return [part.using(queue_name=tenant).enqueue(tenant, i).id for i in range(n)]


@task(group="reports", weight=2, timeout=30.0)
def report(tenant: str) -> str:
    return f"report for {tenant}"


__all__ = ["task_backends"]
