"""The fence, continued: pools that wait at their bound, over redis-py's own (``pool.py`` uses them).

Part of the fence (``redispy.py``'s docstring): every reach into redis-py's
pools these classes make is named where it is made, with the releases it
was checked on, and ``tests/test_redispy.py`` checks it on the oldest and
the newest redis-py the pin allows.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

from redis.asyncio.connection import ConnectionPool as AsyncConnectionPool
from redis.connection import ConnectionPool as SyncConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from .errors import server_full
from .redispy import _wants_command_name


def pool_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a pool refusing a connection because ``max_connections`` are in use.

    ``MaxConnectionsError("Too many connections")`` (a ``ConnectionError``,
    8.x) or a plain ``ConnectionError`` with that text (5.0 to 7.4), raised by
    ``ConnectionPool.get_connection`` (asyncio: ``get_available_connection``;
    blocking: ``make_connection``) before the pool hands anything out.
    """
    return isinstance(exc, RedisConnectionError) and str(exc) == "Too many connections"


def _take_connected_first(pool: Any) -> bool:
    """After the server refused a new connection: whether ``pool`` has an idle one still connected.

    If so, it is put where the pool takes its next connection from: the end
    of ``ConnectionPool._available_connections`` (a list popped from the end,
    asyncio and blocking, 5.0 to 8.2), where the pool had just put back the
    refused one.
    """
    idle: list[Any] = pool._available_connections
    idle.sort(key=_connected)
    return bool(idle) and _connected(idle[-1])


def _connected(conn: Any) -> bool:
    """Whether ``conn`` is connected: ``is_connected`` where it has it (asyncio 5.0 to 8.2; a
    blocking connection in 8.2, not 5.0), else a blocking connection's ``_sock`` (5.0 to 8.2)."""
    connected = getattr(conn, "is_connected", None)
    if connected is None:
        connected = getattr(conn, "_sock", None) is not None
    return bool(connected)


def _in_use(pool: Any) -> int:
    """How many of ``pool``'s connections are handed out: ``_in_use_connections`` (a set, 5.0 to 8.2)."""
    return len(pool._in_use_connections)


# What a failed attempt tells a waiting pool: try again at once (an idle connection is there).
_AGAIN = RedisConnectionError("again")


def _reason(
    pool: Any, exc: RedisConnectionError, lock: AbstractContextManager[Any] | None = None
) -> BaseException | None:
    """Why an attempt of ``pool`` (either waiting pool) failed: ``_AGAIN`` (an idle connected
    one is next, ``_take_connected_first``, under ``lock`` where threads share the pool), the
    server's refusal to wait on (others are in use and will come back), None (the pool's own
    bound: wait), or raised (a refusal with nothing to wait for: ``pool.refused``; any other
    error as it is)."""
    if server_full(exc):
        with lock or contextlib.nullcontext():
            again = _take_connected_first(pool)
        if again:
            return _AGAIN
        if not _in_use(pool):
            raise pool.refused(exc) from exc
        return exc
    if pool_full(exc):
        return None
    raise exc


# A waiter looks again this often even without a release: a wake-up lost to a
# race (a release that began before the first waiter) costs this much, no more.
_RECHECK = 1.0


class WaitingPool:
    """Mixed in before a ``redis.asyncio`` pool class: at its bound a call waits, not fails.

    redis-py's ``ConnectionPool`` raises "Too many connections" the moment a
    call finds every one of its ``max_connections`` in use (100 by default
    from 8.0, 2**31 before: in effect no bound). ``BlockingConnectionPool``
    waits, but takes an ``asyncio.Condition`` and a timeout scope on every
    call, and the enqueue lane only runs beside a plain pool. Here a call
    takes redis-py's own path as long as nobody waits and the pool has a
    connection to give; a call that meets the bound waits, first come first
    served, for a ``release``, at most ``wait_seconds`` in all.

    A server at its ``maxclients`` is a bound too: when it refuses the new
    connection a call needs, the call takes an idle connection the pool
    still has, else waits for one of the pool's connections in use to come
    back, as at ``max_connections``; only a pool with none in use fails
    (``refused``). A client that has its connections keeps working when
    the server is full.

    ``release`` is redis-py's own, untouched, while nobody waits: the first
    waiter puts a waking one on the instance (``_hook_release``), and the
    last one takes it off. Wrapping both methods for every call cost ~5,000
    instructions per connection taken and given back (callgrind), ~8% of
    redis-py's own ~67,000.

    Relies on ``get_connection`` raising ``pool_full``'s error before it
    hands anything out, on a connection the server refused being put back
    disconnected (``_take_connected_first``), and on every connection in use
    coming back through ``release`` (5.0 to 8.2). ``exhausted`` and
    ``refused`` make the errors (``pool.py``).
    """

    wait_seconds = 10.0
    max_connections: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        base: Any = super()
        # redis-py's own methods, bound once (no super() per call).
        self._get = base.get_connection
        self._base_release = base.release
        # What to pass when called without a command name (5.0 to 5.2 need one).
        self._unnamed: tuple[str, ...] = ("_",) if _wants_command_name(AsyncConnectionPool) else ()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        args = args or self._unnamed
        if not self._waiters:
            try:
                return await self._get(*args, **kwargs)
            except RedisConnectionError as exc:
                return await self._after(exc, args, kwargs)
        return await self._queued(args, kwargs, None)

    def _reason(self, exc: RedisConnectionError) -> BaseException | None:
        """Why an attempt failed: ``_AGAIN``, the refusal to wait on, None (the bound: wait), or raised."""
        return _reason(self, exc)

    async def _after(self, exc: RedisConnectionError, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        reason = self._reason(exc)
        while reason is _AGAIN:
            try:
                return await self._get(*args, **kwargs)
            except RedisConnectionError as again:
                reason = self._reason(again)
        return await self._queued(args, kwargs, reason)

    async def _queued(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], refusal: BaseException | None
    ) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        front = False
        while True:
            waiter = loop.create_future()
            if front:
                self._waiters.appendleft(waiter)  # it waited already: first in line
            else:
                self._waiters.append(waiter)
            self._hook_release()
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + _RECHECK)):
                    await waiter
            except TimeoutError:
                if loop.time() >= deadline:
                    raise (self.exhausted() if refusal is None else self.refused(refusal)) from None
            except BaseException:
                # Cancelled after a release woke it: hand the wake-up on.
                if waiter.done() and not waiter.cancelled():
                    self._wake()
                raise
            finally:
                if not waiter.done() or waiter.cancelled():  # not woken (_wake took a woken one out)
                    waiter.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                self._hook_release()
            front = True
            reason: BaseException | None = _AGAIN
            while reason is _AGAIN:
                try:
                    return await self._get(*args, **kwargs)
                except RedisConnectionError as exc:
                    reason = self._reason(exc)
            refusal = reason if reason is not None else refusal

    def _hook_release(self) -> None:
        """While anyone waits, ``release`` wakes the first of them; else it is redis-py's own."""
        if self._waiters:
            self.__dict__["release"] = self._release_waking
        else:
            self.__dict__.pop("release", None)

    async def _release_waking(self, connection: Any) -> None:
        try:
            await self._base_release(connection)
        finally:
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        self._hook_release()

    def exhausted(self) -> Exception:
        return RedisConnectionError(f"no connection came free within {self.wait_seconds:g} s")

    def refused(self, exc: BaseException) -> Exception:
        return RedisConnectionError(str(exc))


class WaitingSyncPool:
    """``WaitingPool`` for a blocking ``redis`` pool, shared by threads (``SyncClient``'s direct enqueue).

    A thread that meets the bound (or the server's refusal, with connections
    of the pool in use) waits on a condition that ``release`` notifies, as
    long as some thread waits (``_hook_release``, as ``WaitingPool``'s), and
    looks again every ``_RECHECK`` seconds: a release that began before the
    hook was put on notifies nobody.
    """

    wait_seconds = 10.0
    max_connections: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._freed = threading.Condition()
        self._waiting = 0  # threads waiting for a release
        base: Any = super()
        self._get = base.get_connection
        self._base_release = base.release
        self._unnamed: tuple[str, ...] = ("_",) if _wants_command_name(SyncConnectionPool) else ()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        args = args or self._unnamed
        try:
            return self._get(*args, **kwargs)
        except RedisConnectionError as exc:
            refusal = self._reason(exc)
        freed = self._freed
        deadline = time.monotonic() + self.wait_seconds
        with freed:
            self._waiting += 1
            self.__dict__["release"] = self._release_waking
        try:
            while True:
                if refusal is not _AGAIN:
                    with freed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise (self.exhausted() if refusal is None else self.refused(refusal)) from None
                        freed.wait(min(left, _RECHECK))
                try:
                    return self._get(*args, **kwargs)
                except RedisConnectionError as exc:
                    reason = self._reason(exc)
                    refusal = reason if reason is not None or refusal is _AGAIN else refusal
        finally:
            with freed:
                self._waiting -= 1
                if not self._waiting:
                    self.__dict__.pop("release", None)

    def _reason(self, exc: RedisConnectionError) -> BaseException | None:
        """As ``WaitingPool._reason``; the pool's list sorted under its own lock (threads share it)."""
        return _reason(self, exc, self._lock)  # type: ignore[attr-defined]  # the pool's own (5.0 to 8.2)

    def _release_waking(self, connection: Any) -> None:
        try:
            self._base_release(connection)
        finally:
            with self._freed:
                self._freed.notify()

    def exhausted(self) -> Exception:
        return RedisConnectionError(f"no connection came free within {self.wait_seconds:g} s")

    def refused(self, exc: BaseException) -> Exception:
        return RedisConnectionError(str(exc))


__all__ = ["WaitingPool", "WaitingSyncPool", "pool_full"]
