"""The offloaded function shared by the producer and the worker processes.

Both processes import it from here, so both derive the same KIND; the KIND is
explicit anyway, as it should be for anything that crosses processes.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

import venturi_redis as vr


class Report(BaseModel):
    tenant_id: int
    month: int
    total: float
    computed_by: int  # the pid of the process that ran the function


# The test gives each run its own queue (isolation by name) through the environment.
QUEUE = os.environ.get("VENTURI_MP_QUEUE", "mp-reports")


@vr.offload(queue=QUEUE, kind="tests.mp.build_monthly")
async def build_monthly(tenant_id: int, month: int) -> Report:
    return Report(tenant_id=tenant_id, month=month, total=tenant_id * 100.0 + month, computed_by=os.getpid())
