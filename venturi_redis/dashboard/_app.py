"""The dashboard's pages, their JSON twins, and ``create_app``, which serves them beside the actions.

Pages are rendered on the server (Jinja2, autoescaped: a payload or note
holding ``<script>`` shows as text). Live parts poll with htmx, which swaps in
the same page's fragment (``hx-select``), so there is one renderer per page.
The actions and the login are ``_actions.py``'s (a mixin of ``Dashboard``);
``read_only`` leaves the action routes out altogether.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import jinja2
from redis.exceptions import RedisError, ResponseError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.staticfiles import StaticFiles

from .._model.enums import JobState
from .._model.errors import ConfigurationError, VenturiError
from .._producer.events import events_cap
from .._producer.history import point_dict
from .._producer.reads import LISTINGS
from . import _data, _history, _listing, _live, _overview, _render, _scale
from ._actions import MESSAGES, Actions
from ._security import (
    CSRF_FIELD,
    Guard,
    Hosts,
    Keys,
    checked_host,
    mount_path,
    wants_json,
)

if TYPE_CHECKING:
    from .._model.task import Task
    from .._producer.client import Client, Queue

log = logging.getLogger("venturi_redis.dashboard")
_HERE = Path(__file__).parent
PAGE_SIZE = 50


class Dashboard(Actions):
    """The state the routes share: the client, the options, the templates."""

    def __init__(
        self,
        client: Client,
        *,
        read_only: bool,
        keys: Keys,
        redaction: _data.Redaction,
        discovery_interval: float,
    ) -> None:
        self.client = client
        self.overview_rows = _overview.Overview(client, discovery_interval)
        self.read_only = read_only
        self.keys = keys
        self.redaction = redaction
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters.update(_render.FILTERS)
        self.router = Router()  # create_app sets the app's own
        self.env.tests["job_id"] = lambda value: bool(_data.JOB_ID_RE.fullmatch(str(value or "")))

    # -- helpers -----------------------------------------------------------------

    def url(self, request: Request, name: str, **params: Any) -> str:
        """The path of route ``name`` as the browser sees it (below the mount point).

        Resolved by the dashboard's own router, not ``request.url_for``: that
        asks the outermost router, which cannot see our routes when the app is
        mounted wrapped in a middleware (an application's own authentication).
        """
        return mount_path(request.scope) + self.router.url_path_for(name, **params)

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        def url(name: str, **params: Any) -> str:
            return self.url(request, name, **params)

        html = self.env.get_template(template).render(
            url=url,
            csrf=request.state.csrf,
            csrf_field=CSRF_FIELD,
            read_only=self.read_only,
            login=self.keys.token is not None,
            message=MESSAGES.get(request.query_params.get("done", "")),
            **context,
        )
        return Response(html, status_code=status, media_type="text/html; charset=utf-8")

    def queue_of(self, name: str) -> Queue:
        if not _data.valid_queue_name(name):
            raise HTTPException(404, f"no queue named {name[:80]!r}")
        return self.client.queue(name)

    async def known_queue(self, name: str) -> Queue:
        queue = self.queue_of(name)
        if not await _data.queue_exists(queue):
            raise HTTPException(404, f"no queue named {name!r} (nothing in Redis under its keys)")
        return queue

    # -- pages and their JSON ------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        number, match = _overview.page_asked(request.query_params)
        rows, broken, page = await self.overview_rows.rows(number, match)
        if request.url.path.endswith("/api/queues") or wants_json(request.scope):
            return JSONResponse(
                {
                    "queues": [r.to_dict() for r in rows],
                    "unreadable": [{"queue": q, "error": e} for q, e in sorted(broken.items())],
                    **page.to_dict(),
                }
            )
        return self.page(request, "overview.html", rows=rows, broken=sorted(broken.items()), at=page)

    async def jobs(self, request: Request) -> Response:
        queue = await self.known_queue(request.path_params["queue"])
        q = request.query_params
        try:
            state = _data.parse_state(q.get("state"))
        except ValueError:
            raise HTTPException(400, f"unknown state {q.get('state', '')[:40]!r}") from None
        kind = q.get("kind") or None
        search = (q.get("q") or "").strip()
        found: list[str] = []
        page = _listing.Page([], None, 0)
        if search:
            found = await self._search(queue, search, kind)
        else:
            try:
                page = await _listing.page_jobs(
                    queue, state=state, kind=kind, cursor=q.get("cursor") or None, limit=PAGE_SIZE
                )
            except _listing.BadCursor as exc:
                raise HTTPException(400, str(exc)) from None
        if request.url.path.startswith(self.url(request, "api_queues")):
            return JSONResponse(
                {
                    "queue": queue.name,
                    "jobs": [_data.job_dict(j, self.redaction) for j in page.jobs],
                    "next_cursor": page.next_cursor,
                    "found": found,
                }
            )
        filters = {"state": str(state) if state else "", "kind": kind or ""}
        next_url = None
        if page.next_cursor:
            params = {k: v for k, v in filters.items() if v}
            next_url = "?" + urlencode({**params, "cursor": page.next_cursor})
        stats = await queue.stats()
        # "retry these N": the dead jobs of the kind filtered on, when the page was read.
        at_ms = int(stats.at.timestamp() * 1000)
        dead_of_kind = await _data.dead_of_kind(queue, kind, at_ms) if kind and stats.dead else None
        limits = [_data.limit_dict(x) for x in await queue.limits()]
        workers = [_data.worker_dict(w) for w in await queue.workers()]
        return self.page(
            request,
            "queue.html",
            queue=queue.name,
            stats=stats,
            limits=limits,
            workers=workers,
            schedules=await queue.client.redis.scard(queue.keys.schedules),
            events_on=await events_cap(queue) > 0,
            jobs=page.jobs,
            scanned=page.scanned,
            next_url=next_url,
            first_page=not q.get("cursor"),
            filters=filters,
            states=LISTINGS,
            heading=_render.jobs_heading(filters["state"], filters["kind"]),
            search=search,
            found=found,
            dead_of_kind=dead_of_kind,
            dead_cap=_data.DEAD_COUNT_CAP,
            at_ms=at_ms,
        )

    async def _search(self, queue: Queue, text: str, kind: str | None) -> list[str]:
        ids: list[str] = []
        if _data.JOB_ID_RE.fullmatch(text) and await queue.get(text) is not None:
            ids.append(text)
        for job_id in await _data.find_by_dedup(queue, text, kind):
            if job_id not in ids:
                ids.append(job_id)
        return ids

    async def job(self, request: Request) -> Response:
        queue = self.queue_of(request.path_params["queue"])
        job_id = request.path_params["job_id"]
        if not _data.JOB_ID_RE.fullmatch(job_id):
            raise HTTPException(404, "not a job id")
        try:
            info = await queue.get(job_id)
            journal = await queue.journal(job_id) if info is not None else []
        except ResponseError as exc:
            # WRONGTYPE: the job's key (or journal) holds something else.
            raise HTTPException(404, f"job {job_id} is corrupt: its keys hold no job ({exc})") from None
        if info is None:
            raise HTTPException(404, f"no job {job_id} in queue {queue.name!r}")
        doc = _data.job_dict(info, self.redaction)
        doc["batch"] = await _data.batch_of(queue, job_id, journal)
        entries = [_data.entry_dict(e, info.kind, self.redaction) for e in journal]
        if request.url.path.startswith(self.url(request, "api_queues")):
            return JSONResponse({"job": doc, "journal": entries})
        # How long the run going on has taken: since its last `claimed` entry.
        claims = [e.at for e in journal if e.event == "claimed"]
        elapsed = time.time() - claims[-1].timestamp() if info.state is JobState.RUNNING and claims else None
        return self.page(
            request,
            "job.html",
            queue=queue.name,
            job=doc,
            journal=entries,
            elapsed=elapsed,
            fields=_render.FIELD_LABELS,
        )

    async def schedules(self, request: Request) -> Response:
        queue = await self.known_queue(request.path_params["queue"])
        rows = [_data.schedule_dict(s) for s in await queue.schedules()]
        if request.url.path.startswith(self.url(request, "api_queues")):
            return JSONResponse({"queue": queue.name, "schedules": rows})
        return self.page(request, "schedules.html", queue=queue.name, schedules=rows)

    async def limits(self, request: Request) -> Response:
        queue = await self.known_queue(request.path_params["queue"])
        stats = await queue.stats()
        rows = [_data.limit_dict(x) for x in await queue.limits()]
        return JSONResponse({"queue": queue.name, "limited": stats.limited, "limits": rows})

    async def workers(self, request: Request) -> Response:
        queue = await self.known_queue(request.path_params["queue"])
        rows = [_data.worker_dict(w) for w in await queue.workers()]
        return JSONResponse({"queue": queue.name, "workers": rows})

    async def history(self, request: Request) -> Response:
        """The metrics history's chart (a fragment for htmx, else a page) or, under /api, its points."""
        queue = await self.known_queue(request.path_params["queue"])
        q = request.query_params
        got = await _history.read(queue, q.get("span", "1h"), q.get("kind"))
        if "/api/queues/" in request.url.path or wants_json(request.scope):
            return JSONResponse({**got, "points": [point_dict(p) for p in got["points"]]})
        template = "_history.html" if request.headers.get("hx-request") else "history.html"
        return self.page(request, template, spans=list(_history.SPANS), refresh=_history.REFRESH_S, **got)

    async def scale(self, request: Request) -> Response:
        return await _scale.one_queue(self.queue_of(request.path_params["queue"]))

    async def scale_many(self, request: Request) -> Response:
        return await _scale.many_queues(self.client, request)

    async def events(self, request: Request) -> Response:
        queue = await self.known_queue(request.path_params["queue"])
        if await events_cap(queue) <= 0:
            # 204 tells a browser's EventSource to stop (not to reconnect).
            return Response(status_code=204)
        return _live.EventFeed(queue, _live.resume_point(request.headers.get("last-event-id")))

    # -- errors --------------------------------------------------------------------

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.error(request, exc.status_code, str(exc.detail))

    async def bad_request(self, request: Request, exc: Exception) -> Response:
        return self.error(request, 400, str(exc))

    async def redis_error(self, request: Request, exc: Exception) -> Response:
        log.warning("dashboard: Redis error on %s: %s", request.url.path, exc)
        return self.error(request, 503, f"Redis did not answer as expected: {type(exc).__name__}")

    async def server_error(self, request: Request, exc: Exception) -> Response:
        log.exception("dashboard: error on %s", request.url.path, exc_info=exc)
        return self.error(request, 500, "the dashboard failed on this page (its log has the details)")

    def error(self, request: Request, status: int, detail: str) -> Response:
        if wants_json(request.scope):
            return JSONResponse({"error": detail}, status_code=status)
        return self.page(request, "error.html", status=status, status_code=status, detail=detail)


def create_app(
    client: Client,
    *,
    read_only: bool = False,
    token: str | None = None,
    show_payloads: bool = False,
    tasks: Sequence[type[Task[Any]]] = (),
    discovery_interval: float = 30.0,
    close_client: bool = False,
    allowed_hosts: Sequence[str] = (),
) -> Starlette:
    """The dashboard as an ASGI application, to serve or to mount under any path.

    Args:
        client: The client whose queues it shows (its namespace and Redis).
        read_only: Leave out every action (routes and buttons).
        token: When set, every request needs it: ``Authorization: Bearer TOKEN``,
            or the login form's session cookie.
        show_payloads: Show the values of payloads, carries, results, outputs
            and attachments (masked as ``***`` by default, keys kept).
        tasks: Task classes whose sensitive fields stay masked when
            ``show_payloads`` is on (matched by KIND; nothing is imported by a
            name read from Redis).
        discovery_interval: Seconds the overview keeps the queue names it read
            from the registry of queues before it reads them again (one
            command, and one per queue); the counts are read fresh on every
            request. ``0`` reads them every time.
        close_client: Close ``client`` when the app shuts down (the CLI's case).
        allowed_hosts: Host names (or addresses) the dashboard answers to
            besides the address its server listens on (and ``localhost``
            when that is a loopback address); ``["*"]``: any. Without a
            token, a request whose ``Host`` header names another host gets
            ``421``, against DNS rebinding; with a token, the names are
            checked only when some are given.

    Raises:
        ConfigurationError: A blank ``token``, or an allowed host that is
            no host name (a scheme or a port in it).
    """
    if token is not None and not token.strip():
        raise ConfigurationError("token is blank: give a token, or None for none (bind loopback only)")
    if isinstance(allowed_hosts, str):
        raise ConfigurationError(f"allowed_hosts must be a list of host names, got {allowed_hosts!r}")
    try:
        hosts = Hosts(frozenset(checked_host(h) for h in allowed_hosts))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    dash = Dashboard(
        client,
        read_only=read_only,
        keys=Keys.make(token.strip() if token is not None else None),
        redaction=_data.Redaction.build(show_payloads, tasks),
        discovery_interval=discovery_interval,
    )
    routes: list[Route | Mount] = [
        Route("/", dash.overview, name="overview"),
        Route("/queues/{queue}", dash.jobs, name="jobs"),
        Route("/queues/{queue}/jobs/{job_id}", dash.job, name="job"),
        Route("/api/queues", dash.overview, name="api_queues"),
        Route("/api/queues/{queue}/jobs", dash.jobs, name="api_jobs"),
        Route("/api/queues/{queue}/jobs/{job_id}", dash.job, name="api_job"),
        Route("/queues/{queue}/schedules", dash.schedules, name="schedules"),
        Route("/api/queues/{queue}/schedules", dash.schedules, name="api_schedules"),
        Route("/api/queues/{queue}/limits", dash.limits, name="api_limits"),
        Route("/api/queues/{queue}/workers", dash.workers, name="api_registry"),
        Route("/api/queues/{queue}/scale", dash.scale, name="api_scale"),
        Route("/api/scale", dash.scale_many, name="api_scale_many"),
        Route("/queues/{queue}/events", dash.events, name="events"),
        Route("/queues/{queue}/history", dash.history, name="history"),
        Route("/api/queues/{queue}/history", dash.history, name="api_history"),
        Route("/login", dash.login_form, name="login_form"),
        Route("/login", dash.login, methods=["POST"], name="login"),
        Route("/logout", dash.logout, methods=["POST"], name="logout"),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    if not read_only:
        routes += [
            Route("/queues/{queue}/jobs/{job_id}/retry", dash.retry, methods=["POST"], name="retry"),
            Route("/queues/{queue}/jobs/{job_id}/cancel", dash.cancel, methods=["POST"], name="cancel"),
            Route("/queues/{queue}/pause", dash.pause, methods=["POST"], name="pause"),
            Route("/queues/{queue}/resume", dash.resume, methods=["POST"], name="resume"),
            Route("/queues/{queue}/dead/retry", dash.retry_dead, methods=["POST"], name="retry_dead"),
            Route(
                "/queues/{queue}/schedules/{schedule_id}/{action}",
                dash.schedule_action,
                methods=["POST"],
                name="schedule_action",
            ),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_client:
                await client.aclose()

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: dash.http_error,
        VenturiError: dash.bad_request,
        RedisError: dash.redis_error,
        Exception: dash.server_error,
    }
    web = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, keys=dash.keys, hosts=hosts)],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    dash.router = web.router
    return web
