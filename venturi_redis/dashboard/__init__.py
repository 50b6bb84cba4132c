"""The web dashboard: every queue at a glance, a job's journal as a timeline, actions by POST.

``create_app(client)`` returns an ASGI application (Starlette) to serve with
``venturi dashboard`` or to mount in an existing application::

    app.mount("/venturi", create_app(client))

It needs the ``dashboard`` extra (``pip install 'venturi-redis[dashboard]'``:
starlette, jinja2, uvicorn). The producer side never imports this package;
this package imports only the producer side and the model, never the worker.
See docs/dashboard.md.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    missing = getattr(exc, "name", None) or "starlette/jinja2"
    raise ImportError(
        f"the venturi dashboard needs {missing}, which is not installed: "
        "pip install 'venturi-redis[dashboard]'"
    ) from exc

from ._app import create_app

__all__ = ["create_app"]
