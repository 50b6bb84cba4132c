"""The ``venturi`` command (console script ``venturi_redis.cli:main``).

The commands are assembled in ``commands.py`` (see its docstring for which module
holds what); this module only makes sure the CLI's own
dependencies (typer, rich) are installed, so that a missing one is one clear
line instead of a traceback, and lets ``venturi worker`` register its own
command alone (a worker's start-up imports none of the others).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``venturi`` command line."""
    try:
        import rich  # noqa: F401
        import typer  # noqa: F401
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "typer/rich"
        print(
            f"venturi: the command line needs {missing}, which is not installed: "
            "pip install 'venturi-redis[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    if sys.argv[1:2] == ["worker"]:
        # `venturi worker` needs its own command only: registering every other
        # one imported their modules (rich's tables and progress bars among
        # them) into each worker's start-up (issue 42). Its --help and its
        # usage errors read the same either way.
        from . import worker as _worker  # noqa: F401 - importing it registers `venturi worker`
        from .app import app
    else:
        from .commands import app
    app()
