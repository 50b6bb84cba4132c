"""Connection URLs as they may be shown: in log lines and error messages."""

from __future__ import annotations

import re


def redact_url(url: str) -> str:
    """``url`` fit for a log line or an error message: its passwords replaced by ``***``.

    The userinfo's password, and a Sentinel URL's ``sentinel_password`` option.
    """
    head, qmark, query = url.partition("?")
    # Up to the last '@': a password with an unencoded '@' or '/' is still all masked.
    head = re.sub(r"(://[^:/@]*:).*@", r"\1***@", head)
    query = re.sub(r"((?:^|&)sentinel_password=)[^&]*", r"\1***", query)
    return f"{head}{qmark}{query}"


__all__ = ["redact_url"]
