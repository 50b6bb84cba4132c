"""``venturi dashboard``: serve the web dashboard (venturi_redis.dashboard) with uvicorn.

Importing it registers the command (cli/commands.py does). Binds to 127.0.0.1 unless
told otherwise; a token (``--token`` or ``VENTURI_DASHBOARD_TOKEN``) is
required to bind anything but loopback.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Annotated

import typer

from .app import RedisOpt, app, redis_url


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command()
def dashboard(
    redis: RedisOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="No actions: no retry, cancel, pause or resume.")
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="VENTURI_DASHBOARD_TOKEN",
            help="Require this token (bearer header or login form); needed to bind beyond loopback.",
            show_default=False,
        ),
    ] = None,
    show_payload: Annotated[
        bool,
        typer.Option(
            "--show-payload", help="Show payload, carry and result values (masked as *** by default)."
        ),
    ] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME",
            help="Also answer to this host name (repeatable); without a token, a request whose "
            "Host is not the bound address (or localhost) is refused, against DNS rebinding.",
        ),
    ] = None,
) -> None:
    """Serve the web dashboard: every queue, its jobs, a job's journal; retry, cancel, pause."""
    # A blank token (VENTURI_DASHBOARD_TOKEN=" ") is no token: it must not open a public bind.
    token = token.strip() if token else None
    if not token and not is_loopback(host):
        typer.echo(
            f"venturi: refusing to serve the dashboard on {host} without a token: "
            "give --token (or VENTURI_DASHBOARD_TOKEN), or bind 127.0.0.1",
            err=True,
        )
        raise typer.Exit(2)
    try:
        import uvicorn

        from ..dashboard import create_app
        from ..dashboard._security import checked_host
    except ImportError as exc:
        typer.echo(f"venturi: {exc}; pip install 'venturi-redis[dashboard]'", err=True)
        raise typer.Exit(1) from None
    from .._producer.client import Client

    try:
        allowed = [checked_host(name) for name in allow_host or []]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--allow-host") from None
    client = Client.from_url(redis_url(redis))
    web = create_app(
        client,
        read_only=read_only,
        token=token or None,
        show_payloads=show_payload,
        close_client=True,
        allowed_hosts=allowed,
    )
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"venturi dashboard on http://{shown}:{port}/ (Ctrl-C to stop)", err=True)
    from ..dashboard._live import close_all

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            close_all()  # the live event feeds end first: an open tab does not hold the stop
            await super().shutdown(sockets)

    # Anything still open 3 s after Ctrl-C (SIGTERM) is cancelled.
    config = uvicorn.Config(
        web, host=host, port=port, log_level="warning", proxy_headers=False, timeout_graceful_shutdown=3
    )
    Server(config).run()
