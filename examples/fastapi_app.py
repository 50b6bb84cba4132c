"""A FastAPI app that enqueues jobs and offloads calls to a worker.

Run the web side with ``uvicorn examples.fastapi_app:app`` and a worker beside
it with ``venturi worker examples.fastapi_app:make_worker`` (``pip install
fastapi uvicorn 'venturi-redis[cli,dashboard]'``: the app mounts the
dashboard, which needs jinja2; both need ``REDIS_URL`` pointing at
the same Redis). Then::

    curl -X POST localhost:8000/welcome -H 'content-type: application/json' -d '{"email": "a@example.org"}'
    curl localhost:8000/jobs/<job_id>
    curl -X POST 'localhost:8000/quotes?wait=5' -H 'content-type: application/json' -d '{"items": [3, 4]}'

``/dashboard/`` is the read-only dashboard (with ``VENTURI_DASHBOARD_TOKEN``
set, it asks for that token). Without ``REDIS_URL`` the app uses the embedded ``memory://`` server, which
lives inside the web process, so it runs the worker there too (in the
lifespan, as examples/asgi_worker.py does); ``VENTURI_INLINE_WORKER=1`` asks
for that on a real Redis as well.

The client is opened when the app starts and closed when it stops (FastAPI's
``lifespan``): one connection pool for every request, no connection left open
by a reload. The web process imports the task models and the offloaded
function's signature, never a handler's dependencies.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Annotated, Any, ClassVar

import anyio
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import venturi_redis as vr

QUEUE = os.environ.get("VENTURI_QUEUE", "web")

# ---- What the web side enqueues ----


class Welcome(vr.Task):
    """Send a welcome email (the work a request should not wait for)."""

    KIND: ClassVar[str] = "examples.fastapi.welcome"
    email: str


class Quote(BaseModel):
    items: list[int]
    total_cents: int


# An explicit KIND and queue: the function's module is examples.fastapi_app
# under uvicorn and the worker alike, but a KIND should not hang on that.
@vr.offload(queue=QUEUE, kind="examples.fastapi.price", max_failures=3)
async def price(items: list[int]) -> Quote:
    """Price a basket: the slow call a request waits for, up to a timeout."""
    if any(i < 0 for i in items):
        raise vr.TaskError.permanent(f"negative item id in {items}")
    await anyio.sleep(0.01)  # a pricing service, a database...
    return Quote(items=items, total_cents=sum(199 * i for i in items))


# ---- The worker side (imported only by the worker, or by the inline one) ----


class WelcomeJob(Welcome, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await anyio.sleep(0.01)  # the mail server
        return vr.Outcome.completed_with(f"welcomed {self.email}")


def make_worker(client: vr.Client | None = None, *, handle_signals: bool = True) -> vr.Worker:
    """``venturi worker examples.fastapi_app:make_worker`` calls this with no argument."""
    client = client or vr.Client.from_url()
    worker = vr.Worker(client.queue(QUEUE), handle_signals=handle_signals, shutdown_grace=10.0)
    return worker.register(WelcomeJob, price)


# ---- The app ----


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncGenerator[None]:
    url = os.environ.get("REDIS_URL") or "memory://fastapi-app"
    inline = url.startswith("memory://") or os.environ.get("VENTURI_INLINE_WORKER") == "1"
    async with vr.Client.from_url(url) as client:  # closed when the app stops
        app.state.client = client
        # The dashboard (docs/dashboard.md) under /dashboard, read-only, behind
        # a token: it needs the client, so it is mounted here and taken down
        # with it.
        from venturi_redis.dashboard import create_app

        token = os.environ.get("VENTURI_DASHBOARD_TOKEN") or None
        app.mount("/dashboard", create_app(client, read_only=True, token=token, tasks=[Welcome]))
        try:
            if not inline:
                yield
                return
            # uvicorn owns the signals; it runs the code after ``yield`` on SIGTERM.
            worker = make_worker(client, handle_signals=False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                yield
                worker.shutdown()
        finally:
            app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", "") != "/dashboard"]


app = FastAPI(title="venturi_redis example", lifespan=lifespan)


def get_client(request: Request) -> vr.Client:
    client: vr.Client = request.app.state.client
    return client


Client = Annotated[vr.Client, Depends(get_client)]


class WelcomeIn(BaseModel):
    email: str = Field(min_length=3, max_length=254)


class Basket(BaseModel):
    items: list[int] = Field(min_length=1, max_length=100)


@app.post("/welcome", status_code=202)
async def welcome(body: WelcomeIn, client: Client) -> dict[str, str]:
    """Enqueue and answer at once: the job id is the receipt."""
    job_id = await client.queue(QUEUE).enqueue(Welcome(email=body.email))
    return {"job_id": job_id}


@app.get("/jobs/{job_id}")
async def job(job_id: str, client: Client) -> dict[str, Any]:
    info = await client.queue(QUEUE).get(job_id)
    if info is None:
        raise HTTPException(404, f"no job {job_id} on queue {QUEUE}")
    return {"id": info.id, "kind": info.kind, "state": info.state.value, "note": info.note}


@app.post("/quotes", response_model=None)
async def quote(body: Basket, client: Client, wait: float = 5.0) -> dict[str, Any] | JSONResponse:
    """Offload the pricing and wait for it, at most ``wait`` seconds (30 at most).

    200 with the quote when the worker answered in time; 202 with the key to
    poll (``GET /quotes/{key}``) when it did not; 422 when the call failed.
    """
    handle = await price.offload(client, items=body.items)
    res = await vr.resolve(client, handle, timeout=min(max(wait, 0.0), 30.0))
    if res.status == "completed" and res.value is not None:
        return {"status": "completed", "quote": res.value.model_dump()}
    if res.status == "failed":
        # The redacted view: a browser never sees the raw error text.
        return JSONResponse({"status": "failed", "error": "terminal error"}, status_code=422)
    return JSONResponse({"status": res.status, "key": handle.key}, status_code=202)


@app.get("/quotes/{key}")
async def quote_status(key: str, client: Client) -> dict[str, Any]:
    try:
        res = await vr.read_result_redacted(client, key, Quote)
    except vr.ConfigurationError:  # not an offload key at all
        res = None
    if res is None:
        raise HTTPException(404, "no such quote (never issued, or expired)")
    out: dict[str, Any] = {"status": res.status}
    if res.value is not None:
        out["quote"] = res.value.model_dump()
    if res.error is not None:
        out["error"] = res.error
    return out
