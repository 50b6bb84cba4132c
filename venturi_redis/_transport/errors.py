"""Which Redis errors mean "send it again": one definition for the worker and the readers.

``TRANSIENT``: the connection failed or timed out (nothing, or not
everything, of the call is known to have run), or a Redis Cluster refused
the call: ``TryAgainError`` while a slot moves, and ``ClusterError``, which
redis-py raises as "TTL exhausted" once its ``MOVED``/``ASK``/``TRYAGAIN``
retries ran out and as its subclasses ``ClusterDownError`` and
``MasterDownError`` (CLUSTERDOWN, MASTERDOWN) during a failover. Such a call
did not run, and runs once the move or the failover is over (docs/cluster.md,
"Moving a queue's slot"). ``refused_busy``: the server
answered BUSY, running a script past ``busy-reply-threshold``; the command
did not run. redis-py has no exception class for BUSY (it is a plain
``ResponseError``), so it is told by the server's message. ``server_full``:
the server refused a new connection at its ``maxclients``; nothing was sent.
"""

from __future__ import annotations

from redis.exceptions import ClusterError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .redispy import server_said_full

TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, TryAgainError, ClusterError)


def server_full(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a new connection at its ``maxclients``.

    Redis answers a connection past ``maxclients`` with ``-ERR max number of
    clients reached`` and closes it, before any command: redis-py raises it
    during the connection's handshake as ``MaxClientsReachedError`` (8.x), or
    fails writing its handshake before it reads it (5.0 to 7.4), which our
    connection classes then raise with the server's text
    (``redispy.ReadsRefusal``). So a call that meets it sent nothing, and
    may go another way at once.
    """
    return isinstance(exc, RedisConnectionError) and server_said_full(exc)


def refused_busy(exc: object) -> bool:
    """Whether ``exc`` is the server's BUSY reply.

    A pipeline's error carries redis-py's "Command # n (...) of pipeline
    caused error: " before the server's message.
    """
    return isinstance(exc, ResponseError) and str(exc).rpartition("caused error: ")[2].startswith("BUSY ")
