"""Offload a report to a worker and read the typed result back.

Run it with ``python examples/report.py``. It uses ``REDIS_URL`` when set,
else the embedded ``memory://`` server.

This is the single-process shape: the app runs its Worker in its own task
group beside the part that serves requests (here, plain coroutines standing in
for routes). In production the two halves can live in different processes: a
web process needs only ``build_monthly.offload`` and ``vr.resolve``; a worker
process runs ``vr.Worker(client.queue("reports")).register(build_monthly)``.
See docs/continuations.md.
"""

from __future__ import annotations

import asyncio
import os

import anyio
from pydantic import BaseModel

import venturi_redis as vr

# ---- The offloaded function: an ordinary async function, typed end to end ----


class Report(BaseModel):
    tenant_id: int
    month: int
    lines: int
    total_cents: int


# An explicit KIND: this file runs as __main__ when started by hand and under
# another module name in the tests; the KIND must not depend on that.
@vr.offload(queue="reports", kind="examples.report.build_monthly", max_failures=3)
async def build_monthly(tenant_id: int, month: int) -> Report:
    if not 1 <= month <= 12:
        # The raw message may carry internals; only server-side readers see it.
        raise vr.TaskError.permanent(f"ledger db-7.internal has no partition for month {month}")
    await asyncio.sleep(0.01)  # the slow part: queries, rendering...
    lines = 10 * month + tenant_id
    return Report(tenant_id=tenant_id, month=month, lines=lines, total_cents=lines * 1999)


# ---- "Routes": what a web framework's handlers would do ----


async def start_report(client: vr.Client, tenant_id: int, month: int) -> str:
    """POST /reports: enqueue and answer at once with the key (a capability)."""
    handle = await build_monthly.offload(client, tenant_id=tenant_id, month=month)
    return handle.key


async def poll_report(client: vr.Client, key: str) -> dict[str, object]:
    """GET /reports/<key>: what a browser may see. Never the raw error."""
    res = await vr.read_result_redacted(client, key, Report)
    if res is None:
        return {"status": "unknown"}
    out: dict[str, object] = {"status": res.status}
    if res.value is not None:
        out["report"] = res.value.model_dump()
    if res.error is not None:
        out["error"] = res.error
    return out


# ---- Wiring it together: one process, web side and worker side ----


async def main() -> dict[str, vr.OffloadResult[Report]]:
    client = vr.Client.from_url(os.environ.get("REDIS_URL") or "memory://")
    # Calling the function directly still runs it here, like any coroutine.
    print("in-process:", await build_monthly(1, 1))

    worker = vr.Worker(client.queue("reports"), concurrency=4, lease=10.0, handle_signals=False)
    worker.register(build_monthly)
    results: dict[str, vr.OffloadResult[Report]] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)

        may = await start_report(client, tenant_id=7, month=5)
        bad = await start_report(client, tenant_id=7, month=13)
        print("right after enqueue:", await poll_report(client, may))

        # Server-side code that wants the value waits for it (subscribe first,
        # then read back, then wait: no completion can slip through).
        for name, key in (("may", may), ("bad", bad)):
            results[name] = await vr.resolve(client, build_monthly.handle(key), timeout=30)
        print("resolve(may):", results["may"].status, results["may"].value)
        print("resolve(bad):", results["bad"].status, repr(results["bad"].error))
        print("browser sees:", await poll_report(client, bad))

        worker.shutdown()
    await client.aclose()
    return results


if __name__ == "__main__":
    asyncio.run(main())
