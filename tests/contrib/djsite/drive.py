"""Drives the test project from outside its workers: ``python drive.py SCENARIO [ARG]``
prints one JSON object (tests/contrib/test_django.py reads it)."""

import json
import os
import sys
import time
from datetime import datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djsite.settings")

import django

django.setup()

from django.db import transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop import tasks  # noqa: E402

from aiojobqueue.contrib.django import compat  # noqa: E402


def view() -> dict:
    return json.loads(Client().post("/enqueue/").content)


def results(ids: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        out = json.loads(Client().get("/results/", {"ids": ids}).content)
        if all(r["status"] in ("SUCCESSFUL", "FAILED") for r in out.values()):
            return out
        if time.monotonic() > deadline:
            return {"timeout": out}
        time.sleep(0.1)


def slow() -> dict:
    return {"id": tasks.slow.enqueue(2.0).id}


def exists(rid: str, args: list) -> bool:
    """Is there a task ``rid`` with these args? (SQLite may give a rolled-back row's id
    to the next insert.)"""
    try:
        return tasks.add.get_backend().get_result(rid).args == args
    except compat.TaskResultDoesNotExist:
        return False


class Rollback(Exception):
    pass


def checks() -> dict:
    out: dict = {}
    backend = tasks.add.get_backend()
    # a rolled-back atomic() block takes its task with it; a committed one keeps it
    try:
        with transaction.atomic():
            out["joined"] = backend._joins.joinable()
            rolled = tasks.add.enqueue(100, 1).id
            raise Rollback
    except Rollback:
        pass
    with transaction.atomic():
        kept = tasks.add.enqueue(200, 2).id
    out["rolled_exists"] = exists(rolled, [100, 1])
    out["kept_exists"] = exists(kept, [200, 2])
    # Django's validation (ported from django-tasks's backend tests)
    strict = compat.task_backends["strict"]
    cases = {
        "priority_high": lambda: tasks.add.using(priority=101),
        "priority_low": lambda: tasks.add.using(priority=-101),
        "priority_float": lambda: tasks.add.using(priority=3.5),
        "naive_run_after": lambda: tasks.add.using(run_after=datetime.now()),
        "unknown_queue": lambda: tasks.add.using(queue_name="nope", backend="strict"),
        "bad_weight": lambda: tasks.report.using(weight=0),
    }
    for name, make in cases.items():
        try:
            make()
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
    out["strict_known_queue"] = tasks.add.using(queue_name="emails", backend="strict"
                                                ).enqueue(1, 1).status == "READY"
    out["strict_is_backend"] = type(strict).__name__
    for name, rid in (("missing", "999999999"), ("not_a_number", "abc")):
        try:
            backend.get_result(rid)
            out[name] = None
        except compat.TaskResultDoesNotExist as exc:
            out[name] = type(exc).__name__
    # capability flags, priority and the extra keywords as stored
    out["flags"] = [backend.supports_defer, backend.supports_async_task,
                    backend.supports_get_result, backend.supports_priority]
    a = tasks.aadd.enqueue(1, 2)
    job = backend.queue.get(int(a.id))
    out["aadd_job"] = {"priority": job.priority, "group": job.group, "type": job.type}
    r = tasks.report.enqueue("acme")
    job = backend.queue.get(int(r.id))
    out["report_job"] = {"group": job.group, "weight": job.weight, "max_attempts":
                         job.max_attempts}
    first = tasks.part.enqueue("t", 2)
    dep = tasks.part.using(depends_on=[first]).enqueue("t", 3)
    out["depends_on"] = [list(backend.queue.get(int(dep.id)).depends_on), int(first.id)]
    when = timezone.now() + timedelta(seconds=1.5)
    d = tasks.add.using(run_after=when).enqueue(5, 5)
    out["deferred"] = {"id": d.id, "run_after": when.timestamp()}
    return out


def started_at(rid: str) -> dict:
    r = results(json.dumps({"x": rid}))["x"]
    got = tasks.add.get_backend().get_result(rid)
    return {"status": r["status"], "started_at": got.started_at.timestamp()}


if __name__ == "__main__":
    scenario = sys.argv[1]
    fn = {"view": view, "results": results, "slow": slow, "checks": checks,
          "started_at": started_at}[scenario]
    print(json.dumps(fn(*sys.argv[2:]), default=str))
