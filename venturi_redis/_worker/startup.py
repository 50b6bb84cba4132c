"""A worker's start: its Redis reached (waited for up to ``startup_wait``), checked, declarations written.

Before it claims anything a worker checks each server it uses (its version
and eviction policy, _producer/server.py), lists its queues in the registry,
and upserts the schedules and limits it declares. A Redis that cannot be
reached yet (still starting, loading its data set and answering ``LOADING``,
a Sentinel or Cluster failover under way, a pod started before the Redis it
depends on) is tried again for up to ``startup_wait`` seconds, from 0.25 s
apart up to 2 s apart: one WARNING at the first failure, one INFO once it
answers; past the wait, ``run()`` raises the last error (``venturi worker``:
"cannot reach Redis", exit 1). What waiting cannot mend is raised at once:
a wrong password, a server certificate that does not verify, a refused
command, a server too old, an evicting policy.

A server at its ``maxclients`` that refuses the worker's first connection
(``vr.MaxClientsError``: a rolling deploy starts new pods while the old ones
still hold theirs) is one more such transient condition, waited for by the
same loop: a worker that exited would be restarted into the same refusal,
under the supervisor's or Kubernetes' growing back-off. A ``shutdown()``
while it waits ends ``run()`` at once, having claimed nothing, and so does
SIGTERM or SIGINT to a worker that handles signals (signals.py: ``venturi
worker`` logs one WARNING and exits 0, as a serving worker stops).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from redis.exceptions import AuthenticationError

from .._model.errors import ConfigurationError
from .._producer import server as _server
from .._producer.client import Client
from .._transport.errors import TRANSIENT, server_full
from .._transport.urls import redact_url
from .declared_limits import declare_limits
from .scheduler import declare

if TYPE_CHECKING:
    from .._model.limits import Limit
    from .._model.schedule import Schedule
    from .._producer.client import Queue

log = logging.getLogger("venturi_redis.worker")

FIRST_PAUSE = 0.25  # seconds before the second try; doubled each time, up to LONGEST_PAUSE
LONGEST_PAUSE = 2.0
_LOOK = 0.05  # while it pauses, how often it looks for a shutdown()


def server_of(client: Client) -> str:
    """The server ``client`` talks to, for log lines (passwords masked)."""
    if client.url:
        return redact_url(client.url)
    # A client built around the caller's own redis-py client: its repr names
    # host, port and db (never the password).
    return repr(getattr(client.redis, "venturi_inner", client.redis))


def _may_pass(exc: BaseException) -> bool:
    """Whether waiting may mend ``exc``: not a wrong password, nor a certificate that does not verify."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (AuthenticationError, ssl.SSLCertVerificationError)):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


async def waiting_for_redis(
    worker_id: str,
    where: str,
    wait: float,
    step: Callable[[], Awaitable[None]],
    stopping: Callable[[], bool] = lambda: False,
) -> bool:
    """Run ``step`` until it does not fail for want of Redis, for at most ``wait`` seconds.

    Returns False, ``step`` not done, when ``stopping()`` turned true while it waited.
    """
    deadline = time.monotonic() + wait
    pause, failures, started = FIRST_PAUSE, 0, time.monotonic()
    while True:
        try:
            await step()
        except TRANSIENT as exc:
            left = deadline - time.monotonic()
            if left <= 0 or not _may_pass(exc):
                raise
            if failures == 0:
                log.warning(
                    "worker %s: %s (%s); trying again for up to %g s "
                    "(Worker(startup_wait=...), venturi worker --startup-wait)",
                    worker_id,
                    # The refusal names maxclients and what to do (MaxClientsError's message).
                    f"Redis at {where} refuses new connections"
                    if server_full(exc)
                    else f"cannot reach Redis at {where}",
                    exc,
                    wait,
                )
            failures += 1
            if not await _paused(min(pause, left), stopping):
                return False
            pause = min(pause * 2, LONGEST_PAUSE)
            continue
        if failures:
            log.info(
                "worker %s: Redis at %s answered after %.1f s (%d tries)",
                worker_id,
                where,
                time.monotonic() - started,
                failures + 1,
            )
        return True


async def _paused(seconds: float, stopping: Callable[[], bool]) -> bool:
    """Sleep ``seconds``, or less when ``stopping()`` turns true: whether it did not."""
    until = time.monotonic() + seconds
    while not stopping():
        left = until - time.monotonic()
        if left <= 0:
            return True
        await anyio.sleep(min(_LOOK, left))
    return False


class Starting(Protocol):
    """What ``start`` reads of its worker (the ``Worker`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def queues(self) -> Sequence[Queue]: ...
    @property
    def startup_wait(self) -> float: ...
    @property
    def check_eviction_policy(self) -> bool: ...
    @property
    def schedules(self) -> Sequence[tuple[Queue, Schedule]]: ...
    @property
    def limits(self) -> Sequence[Limit]: ...
    @property
    def stopping(self) -> bool: ...
    def shutdown(self) -> None: ...


async def start(worker: Starting) -> bool:
    """Every check and write a worker makes before its first claim, each server waited for.

    False when a ``shutdown()`` came while it waited. SIGTERM and SIGINT are
    the run's signal watch's (signals.py), which cancels this wait.
    """
    queues, wait, wid = worker.queues, worker.startup_wait, worker.id
    clients = {id(q.client): q.client for q in queues}.values()
    for client in clients:

        async def check(client: Client = client) -> None:
            await _server.check_server(client, eviction_policy=worker.check_eviction_policy)
            # A queue a worker serves is listed from its start, jobs or not (_producer/registry.py).
            names = (q.name for q in queues if q.client is client)
            await client._recorded.record(client.redis, *names)

        if not await waiting_for_redis(wid, server_of(client), wait, check, lambda: worker.stopping):
            return False

    async def declarations() -> None:
        await declare(worker.schedules)
        await declare_limits(worker.limits, queues)

    where = ", ".join(sorted({server_of(c) for c in clients}))
    return await waiting_for_redis(wid, where, wait, declarations, lambda: worker.stopping)


def started(worker_id: str, queues: Sequence[Queue], kinds: Sequence[str]) -> None:
    """The start-up log line: the queues, the servers (passwords masked) and the kinds."""
    log.info(
        "worker %s starting on %s at %s (kinds: %s)",
        worker_id,
        ", ".join(q.name for q in queues),
        ", ".join(sorted({server_of(q.client) for q in queues})),
        ", ".join(kinds),
    )


class Lifespan:
    """``Worker(lifespan=...)``: the handlers' state, made as ``run()`` starts and closed as it ends.

    ``factory()`` returns an async context manager (an ``@asynccontextmanager``
    function's call): entered once Redis answered and the start's checks
    passed, before the first claim; its value is the ``state`` every handler
    gets; exited once the last job ended (finished, or released at the end of
    the grace), before the worker leaves the registry. Each ``run()`` enters
    it anew. What its exit raises is raised by ``run()``.
    """

    def __init__(self, factory: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self.factory = factory

    @classmethod
    def of(cls, factory: Any, state: Any) -> Lifespan | None:
        """``Worker(lifespan=..., state=...)``'s lifespan, checked: a function, and no state beside it."""
        if factory is None:
            return None
        if hasattr(factory, "__aenter__") or not callable(factory):  # lifespan(), called: one use only
            raise ConfigurationError(
                f"lifespan must be a function returning an async context manager, got {factory!r}"
            )
        if state is not None:
            raise ConfigurationError("lifespan makes the handlers' state: give lifespan= or state=, not both")
        return cls(factory)

    def opened(self) -> AbstractAsyncContextManager[Any]:
        """A new context manager from the factory, checked to be an async one."""
        cm = self.factory()
        if not (hasattr(cm, "__aenter__") and hasattr(cm, "__aexit__")):
            name = getattr(self.factory, "__qualname__", repr(self.factory))
            raise ConfigurationError(
                f"lifespan {name}() returned a {type(cm).__name__}, not an async context manager "
                "(make it an @contextlib.asynccontextmanager function that yields the state)"
            )
        return cm


class _HasLifespan(Protocol):
    lifespan: Lifespan | None
    state: Any


@asynccontextmanager
async def state_held(worker: _HasLifespan) -> AsyncIterator[None]:
    """Around a run: ``worker.state`` made by its lifespan (if any), closed after, even when cancelled."""
    lifespan = worker.lifespan
    if lifespan is None:
        yield
        return
    cm = lifespan.opened()  # the run's own: a worker that runs again opens a fresh one
    worker.state = await cm.__aenter__()
    raised: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        raised = exc
        raise
    finally:
        with anyio.CancelScope(shield=True):  # a cancelled run still closes the pools
            try:
                await cm.__aexit__(
                    type(raised) if raised else None, raised, raised.__traceback__ if raised else None
                )
            finally:
                worker.state = None
