"""``python -m venturi_redis.cli``: the same as the ``venturi`` command."""

from . import main

main()
