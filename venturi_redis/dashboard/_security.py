"""Who may look, who may act: the token, the session cookie, CSRF, security headers.

One ASGI middleware (``Guard``) wraps the whole dashboard:

- every response carries the security headers (a Content-Security-Policy that
  allows only the dashboard's own script and stylesheet, no framing, nosniff);
- every browser gets a random session id in an ``HttpOnly``, ``SameSite=Strict``
  cookie scoped to the mount path; the CSRF token of its forms is an HMAC of
  that id, checked on every POST (``check_csrf``);
- with a token, a request must carry it (``Authorization: Bearer``), or the
  login cookie that ``POST /login`` sets (an HMAC of the token and the session
  id, so it is worthless on another session and after the token changes).
  Static files and the login page stay open: they hold nothing from Redis.
- without a token, only a request whose ``Host`` names the address the server
  listens on (and ``localhost`` when that is a loopback address), or one of
  the names the operator allowed, is served (``Hosts``): DNS rebinding.
  A page at ``http://evil.example:8080/`` whose name is then re-resolved to
  127.0.0.1 is same-origin with the dashboard for the browser, and could read
  its pages (the CSRF token too) and POST; its requests still say ``Host:
  evil.example``. A POST whose ``Origin`` header (when the browser sends one)
  names another host is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE = "venturi_session"
AUTH_COOKIE = "venturi_auth"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def _sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Keys:
    """The secrets of one app: the operator's token (or none) and the CSRF key."""

    token: str | None
    csrf_key: bytes

    @classmethod
    def make(cls, token: str | None) -> Keys:
        # With a token, the CSRF key follows from it, so forms stay valid across
        # restarts and across several processes serving the same dashboard.
        key = _sign(token.encode(), "venturi-dashboard csrf").encode() if token else secrets.token_bytes(32)
        return cls(token or None, key)

    def csrf(self, session: str) -> str:
        return _sign(self.csrf_key, "csrf:" + session)

    def login_value(self, session: str) -> str:
        assert self.token is not None
        return _sign(self.token.encode(), "login:" + session)

    def token_ok(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())


# A host name as a Host header or an Origin gives it: DNS labels, or an IPv4
# address (an IPv6 one comes in brackets and is checked by ipaddress).
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_\-.]{0,252}[a-z0-9_])?")


def host_name(authority: str) -> str | None:
    """The host of a ``Host`` header's value (``name[:port]``, ``[v6][:port]``), lowercased,
    without a trailing dot (an IPv6 address compressed); None when it is not one."""
    value = authority.strip().lower()
    if value.startswith("["):
        name, bracket, port = value[1:].partition("]")
        try:
            address = str(ipaddress.IPv6Address(name))
        except ValueError:
            return None
        ok = bool(bracket) and (not port or (port[0] == ":" and port[1:].isdigit()))
        return address if ok else None
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.removesuffix(".")
    return name if _NAME.fullmatch(name) else None


def checked_host(value: object) -> str:
    """One name of ``create_app(allowed_hosts=...)`` / ``--allow-host``, normalized;
    ``*`` allows any. ``ValueError`` names a value that is no host name."""
    if value == "*":
        return "*"
    name = None
    if isinstance(value, str):
        text = value.strip()
        if ":" in text and not text.startswith("["):
            text = f"[{text}]"  # a bare IPv6 address (a name with a port is refused below)
        if ":" not in text.rpartition("]")[2]:  # no port after the name or address
            name = host_name(text)
    if name is None:
        raise ValueError(
            f"allowed host {value!r} is not a host name or address (no scheme, no port: "
            "'dash.example.com', '10.0.0.5', '::1'; '*' allows any)"
        )
    return name


def _loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


@dataclass(frozen=True, slots=True)
class Hosts:
    """Which ``Host`` a request may name: the server's own address (as the ASGI
    server reports it), ``localhost`` when that address is a loopback one (a name
    no one can rebind), and the names allowed; ``*`` allows any."""

    allowed: frozenset[str]

    def served(self, scope: Scope) -> set[str]:
        names = set(self.allowed)
        server = scope.get("server")
        address = str(server[0]).lower().strip("[]") if server else ""
        if address:
            names.add(address)
        if not address or _loopback(address):
            # No address reported (the ASGI server need not say): loopback names only.
            names.update({"localhost", "127.0.0.1", "::1"} if not address else {"localhost"})
        return names

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """None when the request may be served, else its status and why."""
        if "*" in self.allowed:
            return None
        given = header(scope, b"host")
        name = host_name(given) if given is not None else None
        if name is None:
            return 400, f"bad or missing Host header: {given!r}"
        served = self.served(scope)
        if name not in served:
            return 421, (
                f"this dashboard has no token and answers only to {', '.join(sorted(served))}, "
                f"not to {name!r}: open it by one of those names, or allow this one "
                "(venturi dashboard --allow-host NAME, create_app(allowed_hosts=[...]))"
            )
        origin = header(scope, b"origin")
        if scope.get("method") not in ("GET", "HEAD") and origin is not None:
            parts = urlsplit(origin.strip())
            source = host_name(parts.netloc) if parts.scheme in ("http", "https") else None
            if source not in served:
                return 403, f"a POST from another site (Origin {origin!r}) is refused"
        return None


def cookies(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k:
                    out.setdefault(k, v)
    return out


def header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def mount_path(scope: Scope) -> str:
    return str(scope.get("root_path", "")) or ""


def route_path(scope: Scope) -> str:
    """The path below the mount point (Starlette keeps the full path in ``path``)."""
    root = mount_path(scope)
    path = str(scope.get("path", "/"))
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def wants_json(scope: Scope) -> bool:
    accept = header(scope, b"accept") or ""
    return "application/json" in accept or route_path(scope).startswith("/api/")


def cookie_header(name: str, value: str, scope: Scope, *, max_age: int | None = None) -> tuple[bytes, bytes]:
    parts = [f"{name}={value}", f"Path={mount_path(scope) or '/'}", "HttpOnly", "SameSite=Strict"]
    if scope.get("scheme") == "https":
        parts.append("Secure")
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return b"set-cookie", "; ".join(parts).encode("latin-1")


class Guard:
    """The middleware described in the module docstring."""

    def __init__(self, app: ASGIApp, keys: Keys, hosts: Hosts) -> None:
        self.app = app
        self.keys = keys
        # Checked without a token (DNS rebinding), or when the operator named hosts.
        self.hosts = hosts if keys.token is None or hosts.allowed else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.hosts.refusal(scope) if self.hosts is not None else None
        if refused is not None:  # before anything else: no session for a page that is not ours
            status, why = refused
            body = json.dumps({"error": why}).encode()
            await _respond(send, status, [*HEADERS, (b"content-type", b"application/json")], body)
            return
        jar = cookies(scope)
        session = jar.get(SESSION_COOKIE, "")
        new_session = not (16 <= len(session) <= 128 and session.isalnum())
        if new_session:
            session = secrets.token_hex(24)
        state = scope.setdefault("state", {})
        state["session"] = session
        state["csrf"] = self.keys.csrf(session)
        state["bearer"] = False

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in HEADERS if n not in present]
                if new_session:
                    headers.append(cookie_header(SESSION_COOKIE, session, scope))
                message["headers"] = headers
            await send(message)

        if self.keys.token is not None and not self._authorized(scope, jar, session, state):
            await self._refuse(scope, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _authorized(self, scope: Scope, jar: dict[str, str], session: str, state: dict[str, Any]) -> bool:
        path = route_path(scope)
        if path.startswith("/static/") or path == "/login":
            return True
        auth = header(scope, b"authorization") or ""
        if auth.lower().startswith("bearer ") and self.keys.token_ok(auth[7:].strip()):
            # A header a browser never adds by itself: no CSRF check needed.
            state["bearer"] = True
            return True
        given = jar.get(AUTH_COOKIE, "")
        return bool(given) and hmac.compare_digest(given, self.keys.login_value(session))

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if wants_json(scope) or scope.get("method") not in ("GET", "HEAD"):
            body = json.dumps({"error": "a token is required (Authorization: Bearer TOKEN)"}).encode()
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await _respond(send, 401, headers, body)
            return
        target = route_path(scope)
        query = scope.get("query_string", b"").decode("latin-1")
        if query:
            target += "?" + query
        location = f"{mount_path(scope)}/login?next={quote(target, safe='')}"
        await _respond(send, 303, [(b"location", location.encode("latin-1"))], b"")


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def check_csrf(state: dict[str, Any], keys: Keys, form_value: str | None, header_value: str | None) -> bool:
    """Whether a POST may act: it came with the bearer token, or with its session's CSRF token."""
    if state.get("bearer"):
        return True
    given = form_value or header_value or ""
    return bool(given) and hmac.compare_digest(given, keys.csrf(str(state.get("session", ""))))


def safe_next(value: str | None) -> str:
    """A ``next=`` target that stays inside the dashboard (a path, never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value
