"""Sending script calls: every path a call takes to Redis, and its errors mapped, in one place.

A ``Call`` (``calls.py``: a script's name, KEYS and ARGV) goes to Redis by one
of these, and only these:

- ``call``: through the client's pool (``EVALSHA``; after ``NOSCRIPT``, the
  source by ``EVAL``, which caches it again, so a restarted server or a
  ``SCRIPT FLUSH`` is never noticed);
- ``call_on_lane``: on the enqueue lane (``_transport/lane.py``) when it is
  free, else through the pool: a single enqueue's short path, and a
  redrive's calls one after another (``retry_dead``);
- ``pipeline``: several calls in one round trip (NOSCRIPT replies redone
  singly), the worker's batched transitions and claims;
- ``transaction``: several calls of one slot in one MULTI/EXEC (Redis runs
  all or none), ``enqueue_many``'s chunks;
- ``in_multi``: a call queued inside the caller's own MULTI under WATCH (a
  dedup merge), and ``load`` for the NOSCRIPT such a call can meet;
- ``packed``: the ``EVALSHA`` command of a call, for a connection the caller
  drives itself (an idle claim pipelined behind its ``BLPOP``);
- ``call_blocking``: from a caller's thread on a blocking connection
  (``SyncClient``'s direct single enqueue).

Whatever the path, a coded error reply (``VR_<CODE> message``) is raised as
the exception it stands for (``calls.script_error``): callers never see a raw
``ResponseError`` for a refusal the scripts meant.

One ``Sender`` per client (one connection pool); each queue's ``QueueStore``
(``store.py``) builds its calls and hands them here. Nothing else in the
package reaches the loaded scripts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from .._transport.blocking import run_script
from .._transport.errors import server_full
from .._transport.lane import Lane
from .calls import Call, script_error
from .scripts import ScriptSet, scripts


class Sender:
    """Sends one client's script calls by every path (see the module docstring)."""

    def __init__(
        self, redis: Any, *, clock: Callable[[], int] | None = None, lane: Lane | None = None
    ) -> None:
        self.redis = redis
        self.clock = clock
        self._lane = lane
        self._scripts: ScriptSet = scripts()

    def now(self) -> str:
        """The ``now`` argument of every script: '' means Redis TIME (read once in the script)."""
        clock = self.clock
        return "" if clock is None else str(int(clock()))

    @property
    def lane(self) -> Lane | None:
        return self._lane

    @lane.setter
    def lane(self, lane: Lane | None) -> None:
        self._lane = lane

    def source(self, name: str) -> str:
        """The expanded source of the script ``name`` (what Redis runs)."""
        return self._scripts[name].source

    async def call(self, call: Call) -> Any:
        """Run ``call`` through the pool: its reply, or its (mapped) error raised."""
        script = self._scripts[call.name]
        keys, args = call.keys, call.args
        redis = self.redis
        try:
            try:
                return await redis.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # EVAL, not SCRIPT LOAD then EVALSHA: a SCRIPT FLUSH (or a restart)
                # landing between those two would fail the call a second time.
                # NOSCRIPT means the script did not run, so running it now is safe.
                return await redis.eval(script.source, len(keys), *keys, *args)
        except ResponseError as exc:
            mapped = script_error(exc)
            if mapped is exc:
                raise
            raise mapped from None

    async def call_on_lane(self, call: Call) -> Any:
        """Run ``call`` on the enqueue lane when it is free, else through the pool."""
        lane = self._lane
        if lane is None or lane.busy:
            return await self.call(call)
        try:
            return await lane.script(self._scripts[call.name], call.keys, call.args)
        except ResponseError as exc:
            mapped = script_error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        except RedisConnectionError as exc:
            if not server_full(exc):
                raise
            # Redis is at its maxclients and refused the lane's connection in
            # its handshake, before anything was sent: the pool's connections
            # (which wait for one another there, _transport/pool.py) take it.
            return await self.call(call)

    def call_blocking(self, conn: Any, call: Call) -> Any:
        """Run ``call`` from the caller's thread on ``conn``, a blocking client (``SyncClient``)."""
        try:
            return run_script(conn, self._scripts[call.name], call.keys, call.args)
        except ResponseError as exc:
            mapped = script_error(exc)
            if mapped is exc:
                raise
            raise mapped from None

    def packed(self, call: Call) -> tuple[Any, ...]:
        """The ``EVALSHA`` command of ``call``, for a caller that packs its own commands.

        A ``NOSCRIPT`` reply is then the caller's to handle (the script did
        not run: send it again with ``call``), and an error reply's to map
        (``map_error``).
        """
        return ("EVALSHA", self._scripts[call.name].sha, len(call.keys), *call.keys, *call.args)

    @staticmethod
    def map_error(exc: ResponseError) -> Exception:
        """A script's error reply as the exception it stands for (``exc`` itself unless coded)."""
        return script_error(exc)

    def in_multi(self, pipe: Any, call: Call) -> None:
        """Queue ``call`` in the caller's MULTI (``pipe``); NOSCRIPT and errors come back from its EXEC."""
        pipe.execute_command(*self.packed(call))

    async def load(self, name: str) -> None:
        """SCRIPT LOAD one script: after a NOSCRIPT inside a caller's own MULTI."""
        await self.redis.script_load(self._scripts[name].source)

    async def pipeline(self, calls: Sequence[Call], *, return_exceptions: bool = False) -> list[Any]:
        """Run several scripts in one round trip; NOSCRIPT replies are redone singly.

        A script that hit NOSCRIPT did not run at all, so running it again is safe.
        Other errors are raised after every call has been accounted for, or, with
        ``return_exceptions=True``, returned (mapped) in place of that call's reply.
        """
        redis = self.redis
        if getattr(redis, "durability", None) is not None:
            # Durable mode (_transport/durable.py): each script is followed by
            # WAIT on its own connection, so the calls go one by one.
            out: list[Any] = []
            for call in calls:
                try:
                    out.append(await self.call(call))
                except Exception as exc:
                    if not return_exceptions:
                        raise
                    out.append(exc)
            return out
        pipe = redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*self.packed(call))
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, res in enumerate(results):
            if isinstance(res, NoScriptError):
                try:
                    results[i] = await self.call(calls[i])
                except Exception as exc:
                    if not return_exceptions:
                        raise
                    results[i] = exc
        results = [script_error(res) if isinstance(res, ResponseError) else res for res in results]
        if not return_exceptions:
            for res in results:
                if isinstance(res, Exception):
                    raise res
        return results

    async def transaction(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts of one slot as one MULTI/EXEC: Redis runs all or none.

        Returns each call's reply, or the (mapped) error it raised inside EXEC
        (Redis does not roll back the calls around it). An error raised here
        (an EXECABORT, an OOM refusal while queuing, a dropped connection)
        means none ran, or, for a reply lost in flight, all or none.

        By EVAL, not EVALSHA: a NOSCRIPT is only reported inside EXEC, after
        the calls before it ran, so redoing it singly would split the batch.
        Durable mode (a WAIT after each script, on its own connection) cannot
        wrap a transaction: there the calls go one by one and stop at the
        first error, which takes its place in the list; the calls after it
        were not sent, and the list is that much shorter.
        """
        redis = self.redis
        if getattr(redis, "durability", None) is not None:
            out: list[Any] = []
            for call in calls:
                try:
                    out.append(await self.call(call))
                except Exception as exc:  # noqa: BLE001 - the caller sorts out what was applied
                    out.append(exc)
                    break
            return out
        # `async with`: a cluster transaction holds its connection until reset.
        async with redis.pipeline(transaction=True) as pipe:
            for call in calls:
                source = self._scripts[call.name].source
                pipe.execute_command("EVAL", source, len(call.keys), *call.keys, *call.args)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return [script_error(res) if isinstance(res, ResponseError) else res for res in results]

    async def aclose(self) -> None:
        """Close the enqueue lane's connection (the pool is the client's)."""
        if self._lane is not None:
            await self._lane.aclose()
