"""The redaction helpers (venturi_redis._model.redact): which fields are sensitive, how values are masked."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

import venturi_redis as vr
from venturi_redis._model.codec import pack, unpack_model
from venturi_redis._model.redact import MASK, marked_fields, redact, scrub, secret_values


class Creds(vr.Task):
    KIND: ClassVar[str] = "creds"
    user: str
    password: str = Field(json_schema_extra={"sensitive": True})
    maybe_key: bytes | None = Field(default=None, json_schema_extra={"sensitive": True})
    api_token: str = Field(default="", json_schema_extra={"sensitive": True})
    other_extra: str = Field(default="", json_schema_extra={"example": "x"})


class Custom(vr.Task):
    KIND: ClassVar[str] = "custom"
    pin: str

    @classmethod
    def sensitive_fields(cls) -> frozenset[str]:
        return frozenset({"pin"})


class Progress(BaseModel):
    cursor: int = 0
    session: str = Field(default="", json_schema_extra={"sensitive": True})


def test_marked_fields_are_the_declared_ones() -> None:
    assert marked_fields(Creds) == {"password", "maybe_key", "api_token"}
    assert Creds.sensitive_fields() == marked_fields(Creds)
    assert Custom.sensitive_fields() == {"pin"} and marked_fields(Custom) == set()
    assert marked_fields(Progress) == {"session"}


def test_secret_values_follow_the_hook_and_skip_short_ones() -> None:
    task = Creds(user="ann", password="hunter22", maybe_key=b"k3y-bytes", api_token="ab")
    assert sorted(secret_values(task)) == ["hunter22", "k3y-bytes"]  # "ab" and "" are too short to scrub
    assert secret_values(Custom(pin="123456"), Progress(session="sess-1"), None) == ["123456", "sess-1"]
    assert secret_values(Progress()) == []


class Bundle(BaseModel):
    token: str
    note: str = "ok"


class Many(vr.Task):
    KIND: ClassVar[str] = "many"
    tokens: list[str] = Field(json_schema_extra={"sensitive": True})
    header: dict[str, str] = Field(json_schema_extra={"sensitive": True})
    creds: Bundle = Field(json_schema_extra={"sensitive": True})
    deep: dict[str, list[Bundle]] = Field(default_factory=dict, json_schema_extra={"sensitive": True})


def test_a_sensitive_list_mapping_or_model_masks_each_value_inside() -> None:
    """Issue 38, found probing the Django backend's exceptions: a sensitive field
    holding a list, a dict or a model gave its ``repr`` to scrub, which no message
    quotes, so ``token {self.tokens[0]} refused`` reached the note and the log."""
    task = Many(
        tokens=["alpha-secret-1", "beta-secret-2", "ab"],
        header={"Authorization": "Bearer xyz-123"},
        creds=Bundle(token="nested-secret"),
        deep={"k": [Bundle(token="deeper-secret", note="ok")]},
    )
    secrets = secret_values(task)
    message = "alpha-secret-1, beta-secret-2, Bearer xyz-123, nested-secret, deeper-secret; Authorization ab"
    assert scrub(message, secrets) == f"{MASK}, {MASK}, {MASK}, {MASK}, {MASK}; Authorization ab"
    assert "ok" not in secrets and "ab" not in secrets  # too short to scrub, as a plain field's are


def test_scrub_masks_longest_first() -> None:
    assert scrub("a hunter22 and hunter2 b", ["hunter2", "hunter22"]) == f"a {MASK} and {MASK} b"
    assert scrub("nothing", []) == "nothing"


def test_redact_keeps_structure_or_named_keys() -> None:
    doc: dict[str, Any] = {"user": "ann", "nested": {"a": 1, "b": [1, 2]}, "n": None}
    assert redact(doc) == {"user": MASK, "nested": {"a": MASK, "b": MASK}, "n": None}
    assert redact(doc, ["user"]) == {**doc, "user": MASK}
    assert redact("plain") == MASK and redact(None) is None
    assert redact([1, 2], ["x"]) == [1, 2]  # named keys: only a mapping has any


def test_a_payload_that_does_not_validate_is_named_by_field_not_quoted() -> None:
    """The note of a job whose stored payload does not validate never quotes the stored values."""
    raw = pack({"user": ["not", "a", "string"], "password": 12345678})
    with pytest.raises(vr.PayloadError) as caught:
        unpack_model(Creds, raw)
    note = str(caught.value)
    assert note.startswith("stored value does not validate as Creds: user: Input should be a valid string")
    assert "password: Input should be a valid string" in note
    assert "12345678" not in note and "'a'" not in note and "input_value" not in note
