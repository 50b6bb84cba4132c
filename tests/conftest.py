"""Fixtures: one contract suite, run on a real Redis and on fakeredis.

Each test gets its own queue name (isolation by name, not FLUSHALL), so tests
never see each other's keys and could run in parallel.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

import venturi_redis as vr
from tests.cluster import LocalCluster
from tests.servers import RedisServer

# "cluster": a real three-master Redis Cluster (tests/cluster.py), started once
# per session on first use; the whole contract suite runs on it too.
BACKENDS = ["redis", "memory", "cluster"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the whole session, on a free port."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster (three masters, no replicas) for the whole session."""
    with LocalCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    if backend == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
async def client(url: str) -> AsyncIterator[vr.Client]:
    c = vr.Client.from_url(url)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def queue_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue(client: vr.Client, queue_name: str) -> vr.Queue:
    return client.queue(queue_name)
