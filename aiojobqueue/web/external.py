"""The job page's actions on an external step: complete (with a JSON result) and fail
(with a message), full access only, POST, never cross-site (``Dashboard.may_act``)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from ..errors import InvalidJobError
from ..queue import JobQueue


async def end_step(q: JobQueue, request: Request, job_id: int, action: str) -> None:
    """``complete`` or ``fail`` ``job_id`` from the job page's form (fields ``result``:
    JSON, empty for null; ``message``). Bad JSON: InvalidJobError (a 400, nothing changed);
    a step that is not external: InvalidStateError (a 409, nothing changed)."""
    form = await request.form()
    if action == "complete":
        text = str(form.get("result") or "").strip()
        value: Any = None
        if text:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise InvalidJobError(f"the result is not JSON: {exc}") from None
        await q.complete(job_id, value)
    else:
        await q.fail(job_id, str(form.get("message") or "") or None)
