import json

from django.http import HttpRequest, JsonResponse

from . import tasks


def enqueue(request: HttpRequest) -> JsonResponse:
    """POST: enqueue one of each task, answer their result ids."""
    ids = {
        "add": tasks.add.enqueue(2, 3).id,
        "aadd": tasks.aadd.enqueue(a=4, b=5).id,
        "boom": tasks.boom.enqueue().id,
        "ctx": tasks.with_context.enqueue(7).id,
        "fan": tasks.fan_out.using(queue_name="acme").enqueue("acme", 3).id,
    }
    return JsonResponse(ids)


def results(request: HttpRequest) -> JsonResponse:
    out = {}
    for name, rid in json.loads(request.GET["ids"]).items():
        r = tasks.add.get_backend().get_result(rid)
        out[name] = {
            "status": str(r.status), "attempts": r.attempts, "worker_ids": r.worker_ids,
            "errors": [{"path": e.exception_class_path, "tb": e.traceback} for e in r.errors],
            "value": r.return_value if str(r.status) == "SUCCESSFUL" else None,
            "task": r.task.module_path, "args": r.args, "kwargs": r.kwargs,
        }
    return JsonResponse(out)
