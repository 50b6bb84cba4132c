"""The autoscaling routes: one queue's signal, and the sum of many (docs/deployment.md, "Autoscaling").

``GET /api/queues/{queue}/scale`` answers for one queue; ``GET /api/scale``
sums the same signal over the queues of a Deployment that serves many (a
queue per tenant), for KEDA's metrics-api scaler, which reads one number:

- ``queues=a,b,c``: these queues (comma-separated; the parameter may repeat);
- ``prefix=tenant-``: every queue of the registry whose name starts so
  (``prefix=`` with no value: every registered queue);
- both: the union.

At most ``MAX_SCALE_QUEUES`` queues a call; more, a name that is no queue
name, a prefix no queue name can start with, or neither parameter answer
400 with the reason. Read-only: it writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

from .._model.errors import ConfigurationError
from .._producer.scale import MAX_SCALE_QUEUES, scale_queues, scale_signal, scale_total
from .._store.keys import is_queue_name

if TYPE_CHECKING:
    from starlette.requests import Request

    from .._producer.client import Client, Queue


async def one_queue(queue: Queue) -> Response:
    """``/api/queues/{queue}/scale``. No existence check: an autoscaler asks about a
    queue before its first job (all 0)."""
    return JSONResponse((await scale_signal(queue)).to_dict())


def asked(request: Request) -> tuple[list[str] | None, str | None]:
    """The ``queues`` and ``prefix`` of ``/api/scale``'s query (None: not given)."""
    params = request.query_params
    queues: list[str] | None = None
    if "queues" in params:
        queues = [n.strip() for v in params.getlist("queues") for n in v.split(",") if n.strip()]
        if len(queues) > MAX_SCALE_QUEUES:
            raise ConfigurationError(
                f"queues= names {len(queues):,} queues, more than the {MAX_SCALE_QUEUES:,} one call "
                "reads: split them between several triggers"
            )
    prefix = params.get("prefix")
    # What may start a queue name is a queue name itself (keys.NAME_RULE), or nothing.
    if prefix and not is_queue_name(prefix):
        raise ConfigurationError(
            f"prefix={prefix[:130]!r} cannot start a queue name (no wildcards: give the names' "
            "literal start, such as prefix=tenant-)"
        )
    if queues is not None and not queues and prefix is None:
        raise ConfigurationError("queues= names no queue: give queues=a,b,c or prefix=tenant-")
    return queues, prefix


async def many_queues(client: Client, request: Request) -> Response:
    """``/api/scale``: the signal summed over the queues asked for."""
    queues, prefix = asked(request)
    names = await scale_queues(client, queues or (), prefix)
    return JSONResponse((await scale_total(client, names)).to_dict())
