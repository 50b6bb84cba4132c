"""Connection URLs: as they may be shown (log lines, error messages), and the TLS default."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl


def redact_url(url: str) -> str:
    """``url`` fit for a log line or an error message: its passwords replaced by ``***``.

    The userinfo's password, and the value of every query option whose name
    says it is a secret (``password``, ``sentinel_password``, ``token``,
    ``access_token``, ``secret``, ``auth``...).
    """
    head, qmark, query = url.partition("?")
    # Up to the last '@': a password with an unencoded '@' or '/' is still all masked.
    head = re.sub(r"(://[^:/@]*:).*@", r"\1***@", head)
    if query:  # compiled at the first URL with options (re caches it), not at import (issue 42)
        query = re.sub(_SECRET_OPTION, r"\1***", query, flags=re.I)
    return f"{head}{qmark}{query}"


# A query option named like a secret, up to its value's end.
_SECRET_OPTION = r"((?:^|&)[^=&]*(?:password|passwd|pwd|token|secret|auth)[^=&]*=)[^&]*"


def tls_defaults(url: str) -> dict[str, bool]:
    """The options a TLS URL (``rediss://``, ``rediss+sentinel://``, ...) gets unless it sets them.

    The server's certificate must name the host connected to
    (``ssl_check_hostname=True``): redis-py's own default since 6.0, but
    False before, where a certificate for any host signed by a trusted CA
    would do, silently. A URL that sets ``ssl_check_hostname``, or turns
    verification off (``ssl_cert_reqs=none``, where redis-py 6 and later
    skip the host check too), keeps what it says. Nothing for a URL without TLS.
    """
    if not url.split("://", 1)[0].lower().startswith("rediss"):
        return {}
    query = dict(parse_qsl(url.partition("?")[2], keep_blank_values=True))
    if "ssl_check_hostname" in query or query.get("ssl_cert_reqs", "").lower() in ("none", "cert_none"):
        return {}
    return {"ssl_check_hostname": True}


__all__ = ["redact_url", "tls_defaults"]
