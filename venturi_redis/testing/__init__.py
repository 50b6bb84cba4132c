"""Testing your own tasks: pytest fixtures and ``drain()``.

Enable the plugin in one of three ways (it is off otherwise, even though the
package registers it with pytest):

- ``pytest_plugins = ["venturi_redis.testing"]`` in your top-level ``conftest.py``;
- ``-p venturi_redis.testing`` on the command line;
- ``venturi_redis = true`` in the ``[tool.pytest.ini_options]`` of your pyproject
  (or ``--venturi-redis``).

Fixtures: ``venturi_client`` (a fresh ``memory://`` server per test, or the
server of ``--venturi-redis-url``; its clock is a ``Clock``), ``venturi_clock``
(that ``Clock``, typed as one) and ``venturi_queue`` (a queue of it with a
name of its own). ``await drain(queue,
*handlers)`` runs every job through the real scripts and codec until the queue
is idle, moving the clock forward instead of sleeping. docs/testing.md has
the long form.
"""

from ._clock import Clock
from ._drain import DrainLimitError, DrainReport, drain
from ._fixtures import venturi_client, venturi_clock, venturi_queue

__all__ = [
    "Clock",
    "DrainLimitError",
    "DrainReport",
    "drain",
    "venturi_client",
    "venturi_clock",
    "venturi_queue",
]
