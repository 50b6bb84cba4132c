"""The blocking way of sending a script: ``SyncClient``'s direct single enqueue.

A ``SyncClient`` (``_producer/sync.py``) runs the async ``Queue`` on a loop
thread of its own, but a single enqueue on a client with an enqueue lane is
sent from the calling thread, on a blocking redis-py client of its own, to
skip the hand-off to the loop thread and back. This module is that client and
its runner of "``EVALSHA``, then ``EVAL`` after ``NOSCRIPT``": the blocking
twin of the lane's (``Lane.script``), taking the same ``(script, keys,
args)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.exceptions import NoScriptError, ResponseError

from .pool import DEFAULT_MAX_CONNECTIONS, BoundedSyncPool
from .redispy import pooled_sync_connection
from .scriptref import ScriptArg, ScriptRef
from .urls import tls_defaults


def blocking_redis(url: str, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> redis.Redis:
    """A blocking client for ``url``, with ``Client.from_url``'s defaults.

    5 s socket and connect timeouts and, over TLS, the host name checked
    (``urls.tls_defaults``) unless the URL says otherwise, replies as bytes:
    the same server, database and credentials as the async client. Its pool
    opens at most ``max_connections`` (one per thread enqueueing at the same
    moment), and a thread past them waits for one (``pool.BoundedSyncPool``).
    """
    pool = BoundedSyncPool.from_url(
        url,
        decode_responses=False,
        socket_timeout=5.0,
        socket_connect_timeout=5.0,
        max_connections=max_connections,
        **tls_defaults(url),
    )
    return redis.Redis.from_pool(pool)


def _pack(*command: ScriptArg) -> bytes:
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    return packed


def run_script(direct: redis.Redis, script: ScriptRef, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
    """``EVALSHA`` (then ``EVAL`` after ``NOSCRIPT``) on one of ``direct``'s pooled connections.

    Packed by hiredis and sent on the connection itself, as the async enqueue
    lane does: no command-name lookup, response callbacks or retry wrapper.
    Nothing is resent: a connection that fails mid-call is dropped and the
    call raises, so a lost reply never creates a job twice (docs/guarantees.md).
    """
    pool = direct.connection_pool
    conn: Any = pooled_sync_connection(pool)
    try:
        try:
            conn.send_packed_command([_pack("EVALSHA", script.sha, len(keys), *keys, *args)])
            return conn.read_response()
        except NoScriptError:  # the script did not run: send its source (which caches it)
            conn.send_packed_command([_pack("EVAL", script.source, len(keys), *keys, *args)])
            return conn.read_response()
    except ResponseError:
        raise  # an error reply: the connection is in step
    except BaseException:
        conn.disconnect()  # part of the command or of its reply may be left on it
        raise
    finally:
        pool.release(conn)


__all__ = ["blocking_redis", "run_script"]
