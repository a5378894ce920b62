"""The dashboard's policy routes: ``GET /api/policy`` (the stored policy as JSON) and the
overview's edits, ``POST /policy`` (global cap, rate), ``/policy/group`` (a group's or the
``"*"`` row's weight, cap, rate), ``/policy/pause`` and ``/policy/resume`` (a group, a
type, or the whole queue).

Edits take ``full`` access and a same-origin request (the retry/cancel check,
``Dashboard.may_act``), and go through the public ``JobQueue`` methods. A form field left
out leaves its value as it is; a field sent empty (or ``none``) clears it. Bad input is a
400 with the sentence of ``policy_text``/``stored_policy``, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..errors import ConfigurationError
from ..policy_text import parse_count, parse_rate, policy_data


class Board(Protocol):
    """What the routes need of ``app.Dashboard`` (no import of it: no cycle)."""

    q: Any

    async def level(self, request: Request) -> str: ...

    async def may_act(self, request: Request) -> None: ...


def routes(board: Board) -> list[Route]:
    """The policy routes of ``board`` (the ``Dashboard``)."""

    def edit(change: Callable[[Any, FormData], Awaitable[None]]) -> Any:
        async def endpoint(request: Request) -> Response:
            await board.may_act(request)
            form = await request.form()
            try:
                await change(board.q, form)
            except ConfigurationError as exc:  # nothing was written
                raise HTTPException(400, str(exc)) from None
            return RedirectResponse(str(request.url_for("overview")) + "#policy", 303)

        return endpoint

    async def api(request: Request) -> Response:
        await board.level(request)
        return JSONResponse(policy_data(await board.q.policy()),
                            headers={"Cache-Control": "no-store"})

    return [
        Route("/policy", edit(_set_policy), methods=["POST"], name="policy_set"),
        Route("/policy/group", edit(_set_group), methods=["POST"], name="policy_group"),
        Route("/policy/pause", edit(_pause), methods=["POST"], name="policy_pause"),
        Route("/policy/resume", edit(_resume), methods=["POST"], name="policy_resume"),
        Route("/api/policy", api, name="api_policy"),
    ]


def _text(form: FormData, name: str) -> str | None:
    v = form.get(name)
    return None if v is None else str(v)


def _fields(form: FormData, **parsers: Callable[[str], Any]) -> dict[str, Any]:
    """The fields the form sent, parsed (absent: left as it is)."""
    out = {}
    for name, parse in parsers.items():
        v = _text(form, name)
        if v is not None:
            out[name] = parse(v)
    return out


async def _set_policy(q: Any, form: FormData) -> None:
    kw = _fields(form, concurrency=lambda v: parse_count(v, "concurrency", 1), rate=parse_rate)
    if not kw:
        raise ConfigurationError("nothing to set: send concurrency and/or rate")
    await q.set_policy(**kw)


async def _set_group(q: Any, form: FormData) -> None:
    name = (_text(form, "name") or "").strip()
    kw = _fields(form, weight=lambda v: parse_count(v, "weight", 1),
                 cap=lambda v: parse_count(v, "cap", 0), rate=parse_rate)
    if not kw:
        raise ConfigurationError("nothing to set: send weight, cap and/or rate")
    await q.set_group(name, **kw)


def _target(form: FormData) -> dict[str, str | None]:
    """The group or type a pause/resume names; a form without either names the whole
    queue. A field sent empty is an error, never the whole queue."""
    out: dict[str, str | None] = {}
    for key in ("group", "type"):
        v = _text(form, key)
        if v is not None and not v.strip():
            raise ConfigurationError(f"name the {key} to pause or resume")
        out[key] = None if v is None else v.strip()
    return out


async def _pause(q: Any, form: FormData) -> None:
    await q.pause(**_target(form))


async def _resume(q: Any, form: FormData) -> None:
    await q.resume(**_target(form))
