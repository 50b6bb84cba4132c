"""The pytest fixtures: a fresh client and queue per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from .._model.errors import ConfigurationError
from .._producer.client import Client, Queue
from .._transport import memory
from ._clock import Clock

URL_OPTION = "--venturi-redis-url"


@pytest.fixture
async def venturi_client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """A client on a fresh ``memory://`` server (or ``--venturi-redis-url``), its clock a ``Clock``.

    The clock starts at the real time and moves only when the test (or
    ``drain()``) advances it: ``venturi_client.clock.advance(3600)``.
    """
    url = request.config.getoption(URL_OPTION.lstrip("-").replace("-", "_"), default=None)
    name = ""
    if not url:
        name = f"venturi-test-{uuid.uuid4().hex}"
        url = f"memory://{name}"
    client = Client.from_url(str(url), clock=Clock())
    try:
        yield client
    finally:
        await client.aclose()
        if name:
            memory.forget(name)  # the embedded server's data goes with the test


@pytest.fixture
def venturi_queue(venturi_client: Client) -> Queue:
    """A queue of ``venturi_client`` with a name of its own (tests on one real server never meet)."""
    return venturi_client.queue(f"test-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def venturi_clock(venturi_client: Client) -> Clock:
    """``venturi_client``'s clock, typed as the ``Clock`` it is: ``venturi_clock.advance(3600)``.

    ``venturi_client.clock`` is the same object, typed as any client's clock
    (a callable or None), which a type checker will not let a test advance.
    """
    clock = venturi_client.clock
    if not isinstance(clock, Clock):
        raise ConfigurationError(
            f"venturi_client's clock is no longer a venturi_redis.testing.Clock: {clock!r}"
        )
    return clock
