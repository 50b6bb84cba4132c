"""Redaction: which task fields are sensitive, and values with them masked.

One definition for every reader that shows job data to a person: the CLI,
the worker's notes and logs, and any dashboard (they import this module; it
sits below them all and imports nothing of theirs).

A field of a task (or of its carry) is *sensitive* when it is declared
``Field(json_schema_extra={"sensitive": True})``, or when the task's
``sensitive_fields()`` hook names it (the hook's default returns the declared
ones; override it to name others). pydantic's ``SecretStr`` is no marker here:
a task may not hold one at all (it would be stored as its mask; ``Task``
refuses it at definition), so a secret the queue must carry is a plain
``str`` marked sensitive.

Who honours the marker: the worker masks the values of a job's sensitive
fields in the notes it stores and logs (an exception message that quotes a
token is stored with ``***``), so no reader of Redis ever sees them in a note.
Readers that cannot import the user's task classes (the CLI reads Redis
alone) cannot know the marker; they mask every value of a stored document
by default (``redact(doc)``), see docs/operations.md, "What the CLI shows".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from .sealing import Encrypted

MASK = "***"
"""What a redacted value is shown as."""

# Shorter secrets are not scrubbed out of notes: masking every "1" or "ab" in
# a message would hide what the note says and protect nothing.
_MIN_SCRUB = 4

_SENSITIVE: dict[type[BaseModel], frozenset[str]] = {}


def marked_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` declared ``Field(json_schema_extra={"sensitive": True})``, cached per class."""
    cached = _SENSITIVE.get(model)
    if cached is None:
        names = set()
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, Mapping) and extra.get("sensitive"):
                names.add(name)
        cached = _SENSITIVE[model] = frozenset(names)
    return cached


def redact(doc: Any, fields: Iterable[str] | None = None) -> Any:
    """``doc`` (a decoded payload, carry or result) with values masked.

    With ``fields``, only those top-level keys of a mapping are masked (what a
    reader that knows the task's sensitive fields shows). Without, every value
    is masked and only the structure stays: the keys of mappings, at every
    depth (what a reader shows that cannot know which fields are sensitive).
    ``None`` stays ``None``: there is nothing to hide.
    """
    if doc is None or isinstance(doc, Encrypted):
        return doc  # an encrypted value's marker hides the value already
    if fields is not None:
        if not isinstance(doc, Mapping):
            return doc
        hidden = set(fields)
        return {k: (MASK if k in hidden else v) for k, v in doc.items()}
    if isinstance(doc, Mapping):
        return {k: redact(v) for k, v in doc.items()}
    return MASK


def secret_values(*models: BaseModel | None) -> list[str]:
    """The values of the sensitive fields of ``models`` (a task, its carry) as text,
    for ``scrub``; empty (and cheap) for a model with no sensitive field.

    A sensitive field that holds a list, a mapping or a model gives each value
    inside it (at any depth), the way a message quotes them: ``tokens: list[str]``
    masks each token, not the list's ``repr``, which no message holds."""
    out: list[str] = []
    for model in models:
        if model is None:
            continue
        hook = getattr(type(model), "sensitive_fields", None)
        names = hook() if callable(hook) else marked_fields(type(model))
        for name in names:
            _leaves(getattr(model, name, None), out)
    return out


def document_secrets(model: type[BaseModel], doc: Any) -> list[str]:
    """The values a stored document ``doc`` holds under ``model``'s sensitive field names,
    as text, for ``scrub``: for a note about a document that does not validate as
    ``model`` (a payload of an older model), where ``secret_values`` has no model
    instance to read. Top-level keys only; empty when ``doc`` is no mapping."""
    if not isinstance(doc, Mapping):
        return []
    hook = getattr(model, "sensitive_fields", None)
    names = hook() if callable(hook) else marked_fields(model)
    out: list[str] = []
    for name in names:
        _leaves(doc.get(name), out)
    return out


def _leaves(value: Any, out: list[str], depth: int = 0) -> None:
    """Each scalar inside ``value`` as text (long enough to scrub) into ``out``."""
    if value is None or depth > 20:
        return
    if isinstance(value, BaseModel):
        value = dict(value)
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _leaves(item, out, depth + 1)
        return
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if len(text := str(value)) >= _MIN_SCRUB:
        out.append(text)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (longest first,
    so a secret that contains another is masked whole)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
