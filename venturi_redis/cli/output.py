"""What the commands print: text made safe for a terminal, tables, JSON, job documents.

Strings that come from users or from Redis (kinds, notes, payloads, ids) are
printed with control characters escaped, never interpreted, so a job cannot
rewrite the operator's terminal; a job's own data is masked unless asked for
(docs/operations.md, "What the CLI shows, and secrets").
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import os
import sys
import unicodedata
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer

from .._model.records import JobInfo, JournalEntry
from .._model.redact import redact
from .._model.sealing import Encrypted
from .._transport.urls import redact_url

if TYPE_CHECKING:
    # Imported where used: `venturi worker` reaches this module (clean,
    # hide_password) and prints no table.
    from rich.console import Console
    from rich.text import Text

_CONTROL_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def clean(value: object) -> str:
    """``value`` as text with every control / format character escaped (``\\x1b``, ``\\u202e``).

    Escapes, bidi overrides and zero-width characters in a job's kind, note or
    payload are shown, not obeyed. Newlines are escaped too: one value, one line.
    """
    text = value if isinstance(value, str) else str(value)
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in _CONTROL_CATEGORIES:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def lines_text(value: object) -> Text:
    """A rich Text of a multi-line value (a note): each line cleaned, the newlines kept.

    A traceback or a multi-line message reads as lines, not as one line of
    ``\\x0a``; every other control character is still escaped.
    """
    from rich.text import Text

    if value is None:
        return Text("")
    text = value if isinstance(value, str) else str(value)
    return Text("\n".join(clean(line) for line in text.replace("\r\n", "\n").split("\n")))


def safe_text(value: object) -> Text:
    """A rich Text of a cleaned value: never parsed as rich markup."""
    from rich.text import Text

    return Text("" if value is None else clean(value))


def console() -> Console:
    from rich.console import Console

    # Wide when not a terminal (pipes, CI logs), so tables are not wrapped into noise.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=200 if wide else None)


def print_table(renderable: Any) -> None:
    """Print a table; if it cannot fit without cutting ids or counts, print it wider.

    Columns that must never be cut (ids, names, numbers, times) are ``no_wrap``;
    when they do not fit the terminal, the lines run long (the terminal wraps
    them) instead of showing ``01M8VY…`` or ``1…``.
    """
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    con = console()
    unbounded = con.options.update(width=100_000)  # measure without the terminal's cap
    if isinstance(renderable, Table):
        for col in renderable.columns:
            if col.no_wrap:
                cells = [col.header, *col.cells]
                col.min_width = max(Measurement.get(con, unbounded, c).maximum for c in cells)
    need = Measurement.get(con, unbounded, renderable).minimum
    if need > con.width:
        con = Console(highlight=False, soft_wrap=False, width=need)
    con.print(renderable)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, Encrypted):  # a value under a key this reader lacks: its marker text
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, default=json_default, indent=2, sort_keys=False))


def when(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z") if value else "-"


def millis_when(value: object) -> object:
    """A journal detail in epoch milliseconds (``eligible_at``) as ISO time; other values unchanged."""
    try:
        ms = int(str(value))
    except ValueError:
        return value
    return when(datetime.fromtimestamp(ms / 1000, tz=UTC))


# Journal details that hold epoch milliseconds, shown as ISO time like every other time.
MILLIS_DETAILS = frozenset({"eligible_at"})


def shown(info: JobInfo | JournalEntry, name: str, value: object) -> object:
    """``value``, or the field's stored text marked as corrupt when it did not parse."""
    if name in info.corrupt:
        return f"corrupt:{info.corrupt[name]!r}"
    return value


# The job's own data: masked unless --show-payload (docs/operations.md, "What the CLI shows").
# Notes and attachments are what a run reports to operators: always shown.
DOCUMENTS = ("payload", "carry", "result", "output")


def job_dict(info: JobInfo, show_payload: bool = False) -> dict[str, Any]:
    d = dataclasses.asdict(info)
    d["state"] = info.state.value
    d["priority"] = info.priority.label
    if not show_payload:
        for name in DOCUMENTS:
            d[name] = redact(d[name])
    for name in (*DOCUMENTS, "attachment", "progress"):
        value = getattr(info, name)
        if isinstance(value, Encrypted):  # its text reveals nothing: shown, never masked
            d[name] = str(value)
    return d


def entry_dict(e: JournalEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": e.at,
        "event": e.event,
        "run": e.run,
        "note": e.note,
        "attachment": e.attachment,
        "details": e.details,
        "corrupt": e.corrupt,
    }


def hide_password(url: str) -> str:
    """A URL fit for an error message: the password (and a Sentinel URL's ``sentinel_password``) as ***."""
    return redact_url(url)
