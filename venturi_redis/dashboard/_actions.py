"""The dashboard's actions and its login: the routes that change something.

Every action is a POST carrying the session's CSRF token (``_guard_post``),
answered with a redirect to the page it changed, saying what was done
(``MESSAGES``), or with JSON for an ``Accept: application/json`` client;
``read_only`` leaves these routes out altogether (``create_app``). The login
form sets the session cookie a ``token`` asks for. A mixin of ``Dashboard``
(``_app.py``), which holds the pages.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from .._model.errors import VenturiError
from .._model.schedule import validate_schedule_id
from . import _data
from ._security import AUTH_COOKIE, CSRF_FIELD, CSRF_HEADER, Keys, check_csrf, cookie_header, safe_next

if TYPE_CHECKING:
    from .._producer.client import Queue

# What a finished action says on the page it redirects to (a fixed set: the
# query string never carries text that the page would show as ours).
MESSAGES = {
    "retried": "Job moved back to pending.",
    "not-dead": "Nothing done: the job is not dead.",
    "cancelled": "Job cancelled.",
    "requested": "Cancellation requested: the running handler is asked to stop.",
    "finished": "Nothing done: the job has already finished.",
    "not_found": "Nothing done: no such job.",
    "paused": "Queue paused: workers claim nothing from it until it is resumed.",
    "resumed": "Queue resumed.",
    "dead-retried": "Dead jobs moved back to pending.",
    "schedule-paused": "Schedule paused: it fires no job until it is resumed.",
    "schedule-resumed": "Schedule resumed: it fires from its next fire time after now.",
    "schedule-triggered": "Schedule fired once now: this is the job it enqueued.",
    "no-schedule": "Nothing done: no such schedule.",
}


class Actions:
    """The POST routes and the login (``Dashboard`` has them)."""

    keys: Keys

    if TYPE_CHECKING:  # Dashboard's methods

        def url(self, request: Request, name: str, **params: Any) -> str: ...

        def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response: ...

        async def known_queue(self, name: str) -> Queue: ...

    # -- actions -----------------------------------------------------------------

    async def _guard_post(self, request: Request) -> None:
        form = await _form(request)
        ok = check_csrf(
            request.scope["state"], self.keys, form.get(CSRF_FIELD), request.headers.get(CSRF_HEADER)
        )
        if not ok:
            raise HTTPException(403, "refused: the form's CSRF token is missing or wrong (reload the page)")

    def _answer(self, request: Request, target: str, done: str, status: int = 200, **result: Any) -> Response:
        """The action's answer: a redirect to ``target`` saying ``done``, or JSON.

        An action that did nothing (``status`` 409: the job is in another
        state; 404: no such job or schedule) answers a JSON client with that
        status and the reason as ``error``, so a script cannot take a refusal
        for success; a browser is sent back with the reason shown.
        """
        if "application/json" in request.headers.get("accept", ""):
            if status != 200:
                result["error"] = MESSAGES.get(done, done)
            return JSONResponse({"done": done, **result}, status_code=status)
        return RedirectResponse(f"{target}?{urlencode({'done': done})}", status_code=303)

    async def retry(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        job_id = self._job_id(request)
        moved = await queue.retry(job_id)
        target = self.url(request, "job", queue=queue.name, job_id=job_id)
        if not moved:
            if await queue.get(job_id) is None:  # as cancel answers: no such job is a 404
                return self._answer(request, target, "not_found", 404, job_id=job_id)
            return self._answer(request, target, "not-dead", 409, job_id=job_id)
        return self._answer(request, target, "retried", job_id=job_id)

    async def cancel(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        job_id = self._job_id(request)
        result = await queue.cancel(job_id)
        target = self.url(request, "job", queue=queue.name, job_id=job_id)
        status = {"finished": 409, "not_found": 404}.get(result, 200)
        return self._answer(request, target, result, status, job_id=job_id)

    async def pause(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        await queue.pause()
        return self._answer(request, self._back(request, queue), "paused")

    async def resume(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        await queue.resume_queue()
        return self._answer(request, self._back(request, queue), "resumed")

    async def retry_dead(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        form = await _form(request)
        kind = form.get("kind") or None
        # "retry these N" sends the time its page was read: the jobs dead since stay dead.
        until_ms = form.get("until_ms", "")
        until = datetime.fromtimestamp(int(until_ms) / 1000, UTC) if until_ms.isdigit() else None
        moved = await queue.retry_dead(kind=kind, until=until)
        target = self.url(request, "jobs", queue=queue.name)
        return self._answer(request, target, "dead-retried", moved=moved)

    async def schedule_action(self, request: Request) -> Response:
        await self._guard_post(request)
        queue = await self.known_queue(request.path_params["queue"])
        action = request.path_params["action"]
        try:
            schedule_id = validate_schedule_id(request.path_params["schedule_id"])
        except VenturiError:
            raise HTTPException(404, "not a schedule id") from None
        if action not in ("pause", "resume", "trigger"):
            raise HTTPException(404, "no such action (pause, resume or trigger)")
        target = self.url(request, "schedules", queue=queue.name)
        if action == "trigger":
            job_id = await queue.trigger_schedule(schedule_id)
            if job_id is None:
                return self._answer(request, target, "no-schedule", 404, schedule_id=schedule_id)
            target = self.url(request, "job", queue=queue.name, job_id=job_id)
            return self._answer(request, target, "schedule-triggered", schedule_id=schedule_id, job_id=job_id)
        change = queue.pause_schedule if action == "pause" else queue.resume_schedule
        if not await change(schedule_id):
            return self._answer(request, target, "no-schedule", 404, schedule_id=schedule_id)
        return self._answer(request, target, f"schedule-{action}d", schedule_id=schedule_id)

    def _job_id(self, request: Request) -> str:
        job_id = str(request.path_params["job_id"])
        if not _data.JOB_ID_RE.fullmatch(job_id):
            raise HTTPException(404, "not a job id")
        return job_id

    def _back(self, request: Request, queue: Queue) -> str:
        # The overview's buttons come back to the overview; the queue page's to it.
        target = self.url(request, "jobs", queue=queue.name)
        referer = request.headers.get("referer", "")
        overview = self.url(request, "overview")
        if referer.split("?")[0].endswith(overview) and not referer.split("?")[0].endswith(target):
            return overview
        return target

    # -- login -----------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self.keys.token is None:
            return RedirectResponse(self.url(request, "overview"), status_code=303)
        return self.page(
            request, "login.html", next=safe_next(request.query_params.get("next")), failed=False
        )

    async def login(self, request: Request) -> Response:
        if self.keys.token is None:
            raise HTTPException(404, "this dashboard has no token to log in with")
        await self._guard_post(request)
        form = await _form(request)
        token, next_path = form.get("token", ""), safe_next(form.get("next"))
        if not self.keys.token_ok(token):
            return self.page(request, "login.html", status=401, next=next_path, failed=True)
        root = request.scope.get("root_path", "")
        response = RedirectResponse(root + next_path, status_code=303)
        name, value = cookie_header(AUTH_COOKIE, self.keys.login_value(request.state.session), request.scope)
        response.raw_headers.append((name, value))
        return response

    async def logout(self, request: Request) -> Response:
        await self._guard_post(request)
        response = RedirectResponse(self.url(request, "login_form"), status_code=303)
        name, value = cookie_header(AUTH_COOKIE, "", request.scope, max_age=0)
        response.raw_headers.append((name, value))
        return response


_MAX_FORM = 16 * 1024


async def _form(request: Request) -> dict[str, str]:
    """The POST's url-encoded form fields (first value of each); the dashboard's
    forms are small, so a larger body is refused rather than parsed."""
    if "form" not in request.scope["state"]:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM:
                raise HTTPException(413, "form too large")
        ctype = request.headers.get("content-type", "")
        fields: dict[str, str] = {}
        if not body or ctype.startswith("application/x-www-form-urlencoded"):
            for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
                fields.setdefault(name, value)
        request.scope["state"]["form"] = fields
    form: dict[str, str] = request.scope["state"]["form"]
    return form
