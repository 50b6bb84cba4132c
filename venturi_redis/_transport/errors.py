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
``ResponseError``), so it is told by the server's message.
"""

from __future__ import annotations

from redis.exceptions import ClusterError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, TryAgainError, ClusterError)


def refused_busy(exc: object) -> bool:
    """Whether ``exc`` is the server's BUSY reply.

    A pipeline's error carries redis-py's "Command # n (...) of pipeline
    caused error: " before the server's message.
    """
    return isinstance(exc, ResponseError) and str(exc).rpartition("caused error: ")[2].startswith("BUSY ")
