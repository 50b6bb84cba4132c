"""The ``venturi`` command (console script ``venturi_redis.cli:main``).

The commands are assembled in ``commands.py`` (see its docstring for which module
holds what); this module only makes sure the CLI's own
dependencies (typer, rich) are installed, so that a missing one is one clear
line instead of a traceback.
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
    from .commands import app

    app()
