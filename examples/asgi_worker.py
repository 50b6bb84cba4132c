"""A web app and a worker in one process, stopped gracefully by uvicorn's own SIGTERM handling.

Run it with ``uvicorn examples.asgi_worker:app`` (``pip install uvicorn starlette``),
then ``curl -X POST 'localhost:8000/naps?seconds=2'``. It uses ``REDIS_URL`` when
set, else the embedded ``memory://`` server (asked for by name: its jobs are
gone when the process exits).

The worker lives in the ASGI lifespan: started when the app starts, and on
SIGTERM uvicorn stops taking requests, runs the lifespan's shutdown (the code
after ``yield``), and only then ends the process. ``worker.shutdown()`` there
lets running jobs finish within ``shutdown_grace`` (or releases them, not
charged), so a deploy never leaves a job ``running`` until its lease expires.
Any ASGI framework with a lifespan works the same way (FastAPI's
``FastAPI(lifespan=...)`` takes the same function).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import venturi_redis as vr

QUEUE = os.environ.get("VENTURI_QUEUE", "naps")


class Nap(vr.Task):
    KIND: ClassVar[str] = "nap"
    seconds: float


class NapJob(Nap, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        print(f"RUNNING {ctx.job_id}", flush=True)
        await anyio.sleep(self.seconds)  # work that outlives the SIGTERM, within the grace
        return vr.Outcome.completed_with(f"slept {self.seconds}s")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncGenerator[None]:
    url = os.environ.get("REDIS_URL", "memory://asgi-worker")
    async with vr.Client.from_url(url) as client:
        # handle_signals=False: the signals are uvicorn's, which runs this
        # function's shutdown half when it gets SIGTERM or SIGINT.
        worker = vr.Worker(client.queue(QUEUE), handle_signals=False, shutdown_grace=10.0)
        worker.register(NapJob)
        app.state.queue = client.queue(QUEUE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            yield
            worker.shutdown()  # let running jobs finish; the task group waits for run()


async def enqueue_nap(request: Request) -> JSONResponse:
    job_id = await request.app.state.queue.enqueue(Nap(seconds=float(request.query_params["seconds"])))
    return JSONResponse({"job_id": job_id}, status_code=202)


app = Starlette(routes=[Route("/naps", enqueue_nap, methods=["POST"])], lifespan=lifespan)
