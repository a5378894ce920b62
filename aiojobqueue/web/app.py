"""The Starlette application: routes, access levels, the cross-site check, rendering."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..attempts import attempts_short, attempts_text
from ..errors import (
    ConfigurationError,
    InvalidJobError,
    InvalidStateError,
    JobNotFoundError,
    ScheduleNotFoundError,
)
from ..retention import last_sweep
from . import dag as D
from . import data as Q
from . import policy as P
from . import times as T
from . import views as V
from .external import end_step
from .live import Hub

if TYPE_CHECKING:
    from ..queue import JobQueue

log = logging.getLogger("aiojobqueue.web")

#: ``access(request)`` -> "full" (everything), "read" (no actions) or None (403).
Access = Callable[[Request], "str | Awaitable[str | None] | None"]
LEVELS = ("full", "read")


def dashboard(queue: JobQueue, *, access: Access, live_interval: float = 1.0) -> Starlette:
    """The dashboard of ``queue`` as an ASGI app, to mount anywhere (``app.mount("/queue",
    dashboard(queue, access=...))``) or serve alone (``aiojobqueue dashboard``).

    ``access(request)`` (sync or async) decides per request: ``"full"`` may act (retry,
    cancel, bulk, edit the policy), ``"read"`` sees every page but no action, ``None`` gets
    403. The queue must be started (``async with queue``) before the first request.
    ``live_interval``: the most often, in seconds, the live-update watcher reads the
    database (one watcher per app, whatever the number of open pages)."""
    if not callable(access):
        raise ConfigurationError("access must be a callable: access(request) -> 'full' | "
                                 "'read' | None")
    if live_interval <= 0:
        raise ConfigurationError(f"live_interval must be > 0 seconds: {live_interval!r}")
    return Dashboard(queue, access, live_interval).app


class Dashboard:
    """The routes of one dashboard and what they share (data layer, hub, templates)."""

    def __init__(self, queue: JobQueue, access: Access, live_interval: float) -> None:
        self.q = queue
        self.access = access
        self.data = Q.Data(queue)
        self.hub = Hub(self.data, interval=live_interval, push_backstop=max(live_interval, 2.0))
        self.env = Environment(loader=PackageLoader("aiojobqueue.web", "templates"),
                               autoescape=select_autoescape(["html"]), trim_blocks=True,
                               lstrip_blocks=True)
        self.env.filters.update(ago=T.ago, dur=T.dur, when=T.when, pretty=_pretty, rel=T.rel,
                                times=T.times, attempts_short=attempts_short,
                                attempts_text=attempts_text)
        self.env.globals.update(STATES=V.STATES, CAP=V.CAP, GROUP_CAP=V.GROUP_CAP)
        routes = [
            Route("/", self.overview, name="overview"),
            Route("/jobs", self.jobs, name="jobs"),
            Route("/jobs/retry", self.bulk, methods=["POST"], name="bulk_retry"),
            Route("/jobs/cancel", self.bulk, methods=["POST"], name="bulk_cancel"),
            Route("/jobs/{job_id:int}", self.job, name="job"),
            Route("/jobs/{job_id:int}/dag", self.dag, name="dag"),
            Route("/jobs/{job_id:int}/retry", self.one, methods=["POST"], name="retry"),
            Route("/jobs/{job_id:int}/cancel", self.one, methods=["POST"], name="cancel"),
            Route("/jobs/{job_id:int}/complete", self.one, methods=["POST"], name="complete"),
            Route("/jobs/{job_id:int}/fail", self.one, methods=["POST"], name="fail"),
            Route("/workers", self.workers, name="workers"),
            Route("/schedules", self.schedules, name="schedules"),
            Route("/schedules/{action:str}", self.schedule_action, methods=["POST"],
                  name="schedule_action"),
            Route("/events", self.events, name="events"),
            Route("/api/overview", self.api_overview),
            Route("/api/jobs", self.api_jobs),
            Route("/api/jobs/{job_id:int}", self.api_job),
            Route("/api/jobs/{job_id:int}/dag", self.api_dag),
            Route("/api/workers", self.api_workers),
            Route("/api/schedules", self.api_schedules),
            *P.routes(self),  # the stored policy: /api/policy, the overview's edits
            Mount("/static", StaticFiles(packages=[("aiojobqueue.web", "static")]),
                  name="static"),
        ]
        metrics = _metrics_route(queue, self)
        if metrics is not None:
            routes.append(metrics)
        self.app = Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_error, InvalidJobError: self._bad_input,
            JobNotFoundError: self._not_found, InvalidStateError: self._conflict,
            ScheduleNotFoundError: self._not_found,
        }, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Only when served alone: a mounted app gets no lifespan, and its watcher stops
        # with its last subscriber anyway.
        yield
        await self.hub.close()

    # -- access and rendering ---------------------------------------------------------------
    async def level(self, request: Request) -> str:
        """The caller's access level; raises HTTP 403 for None."""
        got = self.access(request)
        if inspect.isawaitable(got):
            got = await got
        if got is None:
            raise HTTPException(403, "you may not see this dashboard")
        if got not in LEVELS:
            raise ConfigurationError(f"access() must return 'full', 'read' or None: {got!r}")
        return str(got)

    async def may_act(self, request: Request) -> None:
        """Actions: full access only, and never from another site (CSRF)."""
        if await self.level(request) != "full":
            raise HTTPException(403, "read-only access: actions are refused")
        if not same_origin(request):
            raise HTTPException(403, "cross-site request refused")

    def render(self, request: Request, name: str, level: str, status: int = 200,
               **ctx: Any) -> HTMLResponse:
        fragment = request.headers.get("x-ajq-fragment") == "1"
        html = self.env.get_template(name).render(
            request=request, level=level, fragment=fragment, url=request.url_for,
            prefix=self.q.prefix, qs=_qs, **ctx)
        return HTMLResponse(html, status, headers={
            "Cache-Control": "no-store", "Vary": "X-AJQ-Fragment",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "style-src 'self'; script-src 'self'; "
                                       "frame-ancestors 'self'"})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self._message(request, exc.status_code, str(exc.detail))

    async def _bad_input(self, request: Request, exc: Exception) -> Response:
        return self._message(request, 400, str(exc))

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return self._message(request, 404, str(exc))

    async def _conflict(self, request: Request, exc: Exception) -> Response:
        return self._message(request, 409, str(exc))

    def _message(self, request: Request, status: int, text: str) -> Response:
        if request.url.path.startswith(_api_path(request)):
            return JSONResponse({"error": text, "status": status}, status)
        return self.render(request, "message.html", "", status, title=f"{status}",
                           message=text)

    # -- pages ------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        level = await self.level(request)
        return self.render(request, "overview.html", level, ov=await self.data.overview(),
                           sweep=await last_sweep(self.q._started().db))

    async def jobs(self, request: Request) -> Response:
        level = await self.level(request)
        f = Q.Filters.parse(request.query_params)
        before = _before(request)
        page = await self.data.jobs(f, before)
        return self.render(request, "jobs.html", level, f=f, page=page, before=before)

    async def job(self, request: Request) -> Response:
        level = await self.level(request)
        jid = _job_id(request)
        detail = await self.data.job(jid)  # one read: state, facts and why agree
        return self.render(request, "job.html", level, d=detail, j=detail.job, why=detail.why)

    async def dag(self, request: Request) -> Response:
        level = await self.level(request)
        jid = _job_id(request)
        expand = request.query_params.get("expand") == "all"  # a collapsed group's link
        graph = await self.data.dag(jid, children=V.DAG_FETCH if expand else None)
        lay = D.layout(graph, expand=expand)
        job_url = str(request.url_for("dag", job_id=0)).replace("/0/dag", "/{id}/dag")
        all_url = str(request.url_for("dag", job_id=jid)) + "?expand=all"
        picture = D.svg(graph, lay, job_url, None if expand else all_url)
        counts = Q.group_states(graph.nodes.values())
        return self.render(request, "dag.html", level, g=graph, lay=lay, picture=picture,
                           focus=graph.nodes[jid], counts=counts, expand=expand,
                           all_url=all_url)

    async def workers(self, request: Request) -> Response:
        level = await self.level(request)
        return self.render(request, "workers.html", level, workers=await self.data.workers())

    async def schedules(self, request: Request) -> Response:
        level = await self.level(request)
        return self.render(request, "schedules.html", level,
                           schedules=await self.data.schedules())

    async def events(self, request: Request) -> Response:
        """Server-sent events: ``change`` after anything changed (pages then re-render)."""
        await self.level(request)

        async def stream() -> AsyncIterator[dict[str, str]]:
            async with self.hub.subscribe() as box:
                yield {"event": "hello", "data": str(self.hub.version)}
                while True:
                    version = await box.get()
                    yield {"event": "change", "data": str(version)}

        return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store"})

    # -- actions ----------------------------------------------------------------------------
    async def one(self, request: Request) -> Response:
        await self.may_act(request)
        jid = _job_id(request)
        action = request.url.path.rsplit("/", 1)[1]
        if action == "retry":
            await self.q.retry(jid)
        elif action in ("complete", "fail"):  # an external step (web/external.py)
            await end_step(self.q, request, jid, action)
        else:
            await self.q.cancel(jid)
        return RedirectResponse(request.url_for("job", job_id=jid), 303)

    async def bulk(self, request: Request) -> Response:
        """Bulk retry/cancel of what the filters match: first a page with the count that asks
        to confirm, then (``confirm`` posted) the action."""
        await self.may_act(request)
        action = request.url.path.rsplit("/", 1)[1]
        form = await request.form()
        f = Q.Filters.parse(form)
        states = Q.RETRYABLE if action == "retry" else Q.CANCELLABLE
        ids, count = await self.data.match_ids(f, states)
        if form.get("confirm") != "yes":
            return self.render(request, "confirm.html", "full", f=f, action=action,
                               count=count, states=states, bulk_max=Q.BULK_MAX)
        changed, problems = await Q.act(self.q, action, ids)
        return self.render(request, "done.html", "full", f=f, action=action,
                           changed=changed, problems=problems, more=count.capped)

    async def schedule_action(self, request: Request) -> Response:
        """Pause, resume or trigger the schedule named by the form's ``name`` (full access,
        same site only); back to the schedules page, or to the job a trigger enqueued."""
        await self.may_act(request)
        action = request.path_params["action"]
        name = str((await request.form()).get("name") or "")
        if action == "trigger":
            job_id = await self.q.trigger_schedule(name)
            return RedirectResponse(request.url_for("job", job_id=job_id), 303)
        if action == "pause":
            await self.q.pause_schedule(name)
        elif action == "resume":
            await self.q.resume_schedule(name)
        else:
            raise HTTPException(404, f"no schedule action {action!r}")
        return RedirectResponse(request.url_for("schedules"), 303)

    # -- JSON -------------------------------------------------------------------------------
    async def api_overview(self, request: Request) -> Response:
        await self.level(request)
        return _json(await self.data.overview())

    async def api_jobs(self, request: Request) -> Response:
        await self.level(request)
        f = Q.Filters.parse(request.query_params)
        return _json(await self.data.jobs(f, _before(request)))

    async def api_job(self, request: Request) -> Response:
        await self.level(request)
        jid = _job_id(request)
        detail = await self.data.job(jid)
        why = detail.why
        detail.why = None
        out = _plain(detail)
        out["explain"] = None if why is None else {
            "text": str(why), "reasons": _plain(getattr(why, "reasons", []))}
        return _json(out)

    async def api_dag(self, request: Request) -> Response:
        await self.level(request)
        graph = await self.data.dag(_job_id(request))
        return _json({"focus": graph.focus, "nodes": list(graph.nodes.values()),
                      "edges": graph.edges, "hidden_children": graph.hidden_children,
                      "truncated": graph.truncated})

    async def api_workers(self, request: Request) -> Response:
        await self.level(request)
        return _json(await self.data.workers())

    async def api_schedules(self, request: Request) -> Response:
        await self.level(request)
        return _json(await self.data.schedules())


def same_origin(request: Request) -> bool:
    """Whether a POST comes from the dashboard's own pages. Browsers send ``Sec-Fetch-Site``
    (and ``Origin`` on every cross-origin POST); a request with neither is no browser's, so
    it cannot carry a victim's cookies for another site."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin != "null" and urlsplit(origin).netloc == host


def _metrics_route(queue: JobQueue, board: Dashboard) -> Route | None:
    """``/metrics`` when the prometheus extra and aiojobqueue.metrics are installed."""
    try:
        import prometheus_client  # type: ignore[import-not-found,unused-ignore]

        from .. import metrics  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    registry = prometheus_client.CollectorRegistry()
    metrics.register(queue, registry=registry)

    async def serve(request: Request) -> Response:
        await board.level(request)
        return Response(prometheus_client.generate_latest(registry),
                        media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return Route("/metrics", serve, name="metrics")


def _api_path(request: Request) -> str:
    return str(request.scope.get("root_path", "")) + "/api/"


def _job_id(request: Request) -> int:
    jid = request.path_params["job_id"]
    if not 0 < jid < 2**63:
        raise JobNotFoundError(f"no job with id {jid}")
    return int(jid)


def _before(request: Request) -> int | None:
    v = request.query_params.get("before")
    return None if not v else Q.parse_id(v, "before")


def _qs(params: dict[str, Any], **more: Any) -> str:
    merged = {**params, **{k: v for k, v in more.items() if v is not None}}
    return urlencode(merged)


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_plain(x) for x in v]
    if isinstance(v, Q.Count):
        return v.json()
    if isinstance(v, datetime):
        return v.isoformat()
    if hasattr(v, "_asdict"):
        return _plain(v._asdict())
    return v


def _json(v: Any) -> Response:
    body = json.dumps(_plain(v), default=str, separators=(",", ":"))
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def _pretty(v: Any) -> str:
    return json.dumps(v, indent=2, sort_keys=True, default=str, ensure_ascii=False)


__all__ = ["Dashboard", "dashboard", "same_origin"]
