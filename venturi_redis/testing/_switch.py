"""The ``pytest11`` entry point: options only, and the plugin when asked for.

Installing venturi-redis must not change anyone's test suite, so this module
(which pytest loads for every project with venturi-redis installed) adds
options and nothing else unless ``--venturi-redis``, the ``venturi_redis`` ini
flag or ``--venturi-redis-url`` turns the fixtures on. ``-p
venturi_redis.testing`` and ``pytest_plugins = ["venturi_redis.testing"]``
load them directly.
"""

from __future__ import annotations

import pytest

PLUGIN = "venturi_redis.testing"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("venturi_redis")
    group.addoption(
        "--venturi-redis",
        action="store_true",
        default=False,
        help="enable venturi_redis.testing's fixtures (venturi_client, venturi_clock, venturi_queue)",
    )
    group.addoption(
        "--venturi-redis-url",
        default=None,
        metavar="URL",
        help="run venturi_client on this Redis instead of a fresh memory:// server per test",
    )
    parser.addini("venturi_redis", type="bool", default=False, help="enable venturi_redis.testing's fixtures")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    enabled = (
        config.getoption("venturi_redis")
        or config.getini("venturi_redis")
        or config.getoption("venturi_redis_url")
    )
    if not enabled:
        return
    import venturi_redis.testing as plugin

    # Already loaded by -p or pytest_plugins: registering it twice is an error.
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, PLUGIN)
