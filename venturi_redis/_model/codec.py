"""msgpack <-> pydantic: how payloads, carries, attachments and results are stored.

Values go through pydantic's JSON mode before msgpack, so anything pydantic can
serialize (datetimes, UUIDs, enums, nested models) is storable, and decoding
is always pydantic validation into the declared type. Nothing is ever
unpickled, and no name read from Redis is ever imported or called.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, SchemaValidator, to_jsonable_python

from .errors import PayloadError, said

M = TypeVar("M", bound=BaseModel)


def pack(value: Any) -> bytes:
    """Encode any pydantic-serializable value (attachments, results)."""
    try:
        packed: bytes = msgpack.packb(to_jsonable_python(value), use_bin_type=True)
        return packed
    except (PydanticSerializationError, TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"cannot encode {type(value).__name__} value: {exc}") from exc


def unpack(raw: bytes) -> Any:
    """Decode msgpack bytes; garbage (or pickle bytes written by hand) is a PayloadError."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise PayloadError(f"stored value is not valid msgpack ({len(raw)} bytes): {exc}") from exc


_MODEL_DUMP = BaseModel.model_dump


def _dump_json(model: BaseModel) -> Any:
    """``model.model_dump(mode="json")``, straight from the class's serializer.

    ``model_dump`` only forwards its defaults to ``__pydantic_serializer__``;
    calling that directly is the same result for well under half the time, the
    larger share of encoding a small task. A class that overrides
    ``model_dump`` still gets its own.
    """
    if type(model).model_dump is _MODEL_DUMP:
        return model.__pydantic_serializer__.to_python(model, mode="json")
    return model.model_dump(mode="json")


_local = threading.local()


def _packer() -> Callable[[Any], bytes]:
    """This thread's msgpack packer (``msgpack.packb`` builds one per call)."""
    try:
        packer: Callable[[Any], bytes] = _local.pack
    except AttributeError:
        packer = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return packer


def pack_model(model: BaseModel) -> bytes:
    """Encode a pydantic model (a task payload or a carry)."""
    try:
        return _packer()(_dump_json(model))
    except (PydanticSerializationError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        if not isinstance(model, BaseModel):
            raise PayloadError(f"cannot encode a {type(model).__name__}: a pydantic model is needed") from exc
        raise PayloadError(f"cannot encode {type(model).__name__}: {exc}") from exc


_MODEL_VALIDATE = BaseModel.model_validate.__func__  # type: ignore[attr-defined]


def unpack_model(cls: type[M], raw: bytes, name: str | None = None) -> M:
    """Decode and validate bytes into ``cls``; any failure is a PayloadError naming
    ``name`` (the class's own name by default).

    Straight to the class's validator, as ``model_validate`` does with its
    defaults (once per job run); a class that overrides ``model_validate``
    still gets its own.
    """
    data = unpack(raw)
    try:
        if cls.model_validate.__func__ is _MODEL_VALIDATE:  # type: ignore[attr-defined]
            return cls.__pydantic_validator__.validate_python(data)  # type: ignore[no-any-return]
        return cls.model_validate(data)
    except Exception as exc:  # ValidationError, or what a validator of the model raised
        raise invalid(name or cls.__name__, exc) from exc


def model_decoder(cls: type[M], name: str | None = None) -> Callable[[bytes], M]:
    """``unpack_model`` for one class, with what it reads off the class read now.

    For a caller that decodes the same class again and again (the worker, once
    per run): reading a pydantic class's attributes goes through its
    metaclass's ``__getattr__`` hook, and ``unpack_model`` reads two per call.
    A class that overrides ``model_validate``, or whose validator is not built
    yet, gets ``unpack_model`` itself. The validator is the one the class has
    now: a ``model_rebuild(force=True)`` after this call is not seen by the
    decoder (ask for a new one). ``name`` is what its errors call the class
    (a worker names the task, not the handler class that extends it).
    """
    name = name or cls.__name__
    validator = cls.__pydantic_validator__
    if cls.model_validate.__func__ is not _MODEL_VALIDATE or not isinstance(  # type: ignore[attr-defined]
        validator, SchemaValidator
    ):
        return functools.partial(unpack_model, cls, name=name)
    validate = validator.validate_python
    unpackb = msgpack.unpackb

    def decode(raw: bytes) -> M:
        try:
            data = unpackb(raw, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated exception types
            raise PayloadError(f"stored value is not valid msgpack ({len(raw)} bytes): {exc}") from exc
        try:
            return validate(data)  # type: ignore[no-any-return]
        except Exception as exc:  # ValidationError, or what a validator of the model raised
            raise invalid(name, exc) from exc

    return decode


def unpack_as(adapter: TypeAdapter[Any], raw: bytes, name: str = "") -> Any:
    """Decode and validate bytes with a TypeAdapter (typed results, resume input);
    ``name``, the type's, goes in the error."""
    data = unpack(raw)
    try:
        return adapter.validate_python(data)
    except Exception as exc:  # ValidationError, or what a validator of the type raised
        raise invalid(name, exc) from exc


class ValidatorRaised(PayloadError):
    """A stored value's validation raised something other than pydantic's ValidationError.

    A validator of the user's model did (a ``model_validator(mode="before")``
    that upgrades the payloads of an older model and meets one it did not
    expect: ``KeyError``). Still a PayloadError, so every reader treats it as
    data that does not validate (a worker sends the job to dead, reason
    ``invalid_payload``) rather than as a crash of its own; ``__cause__`` is
    the exception, whose traceback points at the validator.
    """


def invalid(name: str, exc: Exception) -> PayloadError:
    """Why a stored value does not validate as ``name`` (a class's, or '' for none), as a
    PayloadError: pydantic's errors by field, or the exception a validator raised."""
    as_name = f" as {name}" if name else ""
    if isinstance(exc, ValidationError):
        return PayloadError(f"stored value does not validate{as_name}: {_errors(exc)}")
    return ValidatorRaised(
        f"stored value does not validate{as_name}: its validation raised {said(exc, named=True)}"
    )


def type_name(tp: Any) -> str:
    """A type as an error names it: ``Report``, ``list[str]``, ``int | None``."""
    return tp.__qualname__ if isinstance(tp, type) else repr(tp).replace("typing.", "")


def _errors(exc: ValidationError) -> str:
    """What failed validation, by field, without the values: pydantic's own text quotes
    each input, and this text becomes a job's note (a stored payload may hold secrets)."""
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)
    ]
    return "; ".join(parts)


def text(value: Any) -> str:
    """A Redis reply value as text: bytes decoded, None (and Lua's false) as ''."""
    if value is None or value is False:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
