from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import escape

from . import tasks


def home(request: HttpRequest) -> HttpResponse:
    links = "".join(f'<li><form method="post" action="/start/{t}/"><button>start {t}'
                    "</button></form></li>" for t in ("acme", "globex", "initech"))
    return HttpResponse(f"<h1>Reports</h1><ul>{links}</ul>")


def start(request: HttpRequest, tenant: str) -> HttpResponse:
    """Enqueue the tenant's DAG: load (which fans out), then summarize after it. Inside
    atomic(): the tasks are inserted in the same transaction as anything else this view
    writes (on SQLite, PostgreSQL and MySQL/MariaDB with Django's own drivers)."""
    with transaction.atomic():
        first = tasks.load.using(queue_name=tenant).enqueue(tenant, 5)
        last = tasks.summarize.using(queue_name=tenant, depends_on=[first]).enqueue(tenant)
    return HttpResponseRedirect(f"/results/?ids={first.id},{last.id}")


def results(request: HttpRequest) -> HttpResponse:
    """Each task's status, attempts and return value (refresh to follow them)."""
    rows = []
    backend = tasks.load.get_backend()
    ids = [i for i in request.GET.get("ids", "").split(",") if i]
    while ids:
        r = backend.get_result(ids.pop(0))
        value = r.return_value if r.status == "SUCCESSFUL" else ""
        if r.task.name == "load" and r.status == "SUCCESSFUL":
            ids.extend(value)  # show the fanned-out tasks too
        errors = "; ".join(e.exception_class_path for e in r.errors)
        rows.append(f"<tr><td>{r.id}</td><td>{r.task.name}</td><td>{escape(r.args)}</td>"
                    f"<td>{r.status}</td><td>{r.attempts}</td><td>{escape(value)}</td>"
                    f"<td>{escape(errors)}</td></tr>")
    head = ("<tr><th>id</th><th>task</th><th>args</th><th>status</th><th>attempts</th>"
            "<th>result</th><th>errors</th></tr>")
    return HttpResponse(f"<h1>Results</h1><table>{head}{''.join(rows)}</table>")
