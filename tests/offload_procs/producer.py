"""A producer process: offloads one call, resolves it, prints the result as JSON.

Usage: VENTURI_MP_QUEUE=name python -m tests.offload_procs.producer REDIS_URL TENANT MONTH
It never imports the worker side: it only needs the decorated function.
"""

from __future__ import annotations

import json
import os
import sys

import anyio

import venturi_redis as vr
from tests.offload_procs.reports import build_monthly


async def main(url: str, tenant: int, month: int) -> None:
    async with vr.Client.from_url(url) as client:
        handle = await build_monthly.offload(client, tenant_id=tenant, month=month)
        res = await vr.resolve(client, handle, timeout=60)
        out = {
            "pid": os.getpid(),
            "job_id": handle.job_id,
            "status": res.status,
            "value": res.value.model_dump() if res.value is not None else None,
            "is_report": type(res.value).__name__,
            "worker_loaded": "venturi_redis._worker.worker" in sys.modules,
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
