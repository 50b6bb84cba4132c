"""The codec: a model encodes exactly as msgpack of ``model_dump(mode="json")``."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

import msgpack
import pytest
from pydantic import BaseModel, Field, computed_field, field_serializer

import venturi_redis as vr
from venturi_redis._model.codec import pack_model, unpack_model


class Colour(enum.Enum):
    RED = "red"


class Inner(BaseModel):
    at: datetime
    tags: set[str] = Field(default_factory=set)


class Rich(BaseModel):
    id: uuid.UUID
    colour: Colour
    inner: Inner
    secret: str = Field(default="s", exclude=True)
    aliased: int = Field(default=1, serialization_alias="al")
    raw: bytes = b"\x00\xff"
    anything: Any = None

    @field_serializer("raw")
    def _hex(self, value: bytes) -> str:
        return value.hex()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return self.aliased * 2


class Custom(BaseModel):
    x: int = 1

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        return {"x": self.x, "custom": True}


def _reference(model: BaseModel) -> bytes:
    packed: bytes = msgpack.packb(model.model_dump(mode="json"), use_bin_type=True)
    return packed


SAMPLES: list[BaseModel] = [
    Rich(
        id=uuid.UUID(int=7),
        colour=Colour.RED,
        inner=Inner(at=datetime(2025, 1, 2, tzinfo=UTC), tags={"a"}),
        aliased=4,
    ),
    Rich(id=uuid.uuid4(), colour=Colour.RED, inner=Inner(at=datetime.now(UTC)), anything=[1, {"k": 2.5}]),
    Custom(x=3),
    vr.NoCarry(),
]


@pytest.mark.parametrize("model", SAMPLES)
def test_pack_model_is_msgpack_of_model_dump_json(model: BaseModel) -> None:
    assert pack_model(model) == _reference(model)


def test_an_overridden_model_dump_is_used() -> None:
    assert msgpack.unpackb(pack_model(Custom(x=3))) == {"x": 3, "custom": True}


def test_a_model_round_trips() -> None:
    model = SAMPLES[0]
    assert isinstance(model, Rich)
    back = unpack_model(Inner, pack_model(model.inner))
    assert back == model.inner


def test_an_unencodable_value_is_a_payload_error() -> None:
    bad = Rich(id=uuid.uuid4(), colour=Colour.RED, inner=Inner(at=datetime.now(UTC)), anything=object())
    with pytest.raises(vr.PayloadError, match="cannot encode Rich"):
        pack_model(bad)


def test_pack_model_encodes_model_after_model_alike() -> None:
    # One packer per thread serves every call: no call's bytes leak into the next.
    want = [msgpack.packb(m.model_dump(mode="json"), use_bin_type=True) for m in SAMPLES * 2]
    assert [pack_model(m) for m in SAMPLES * 2] == want


def test_pack_model_raises_a_payload_error_and_goes_on() -> None:
    class Big(BaseModel):
        n: int

    unserializable = Rich(
        id=uuid.uuid4(), colour=Colour.RED, inner=Inner(at=datetime.now(UTC)), anything=object()
    )
    for bad in (Big(n=1 << 70), unserializable):  # msgpack's error (half-way through a map), then pydantic's
        with pytest.raises(vr.PayloadError, match="cannot encode"):
            pack_model(bad)
    # nothing left over from the failed calls
    assert pack_model(SAMPLES[0]) == msgpack.packb(SAMPLES[0].model_dump(mode="json"), use_bin_type=True)


def test_pack_model_after_a_failure_half_way_through_a_map_leaves_nothing_behind() -> None:
    # pack_model keeps one msgpack Packer per thread: a failed call must not
    # leave its half-written map in front of the next call's bytes.
    class Big(BaseModel):
        first: str = "a"
        n: int

    with pytest.raises(vr.PayloadError):
        pack_model(Big(n=1 << 70))
    for m in SAMPLES:
        assert pack_model(m) == msgpack.packb(m.model_dump(mode="json"), use_bin_type=True)


def test_pack_model_from_many_threads_at_once_encodes_each_model_alone() -> None:
    import threading

    class Row(BaseModel):
        thread: int
        i: int
        text: str

    errors: list[str] = []
    start = threading.Barrier(4)

    def work(t: int) -> None:
        start.wait()
        for i in range(2_000):
            m = Row(thread=t, i=i, text="x" * (i % 50))
            if msgpack.unpackb(pack_model(m)) != m.model_dump():
                errors.append(f"thread {t}, row {i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
