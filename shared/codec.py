"""The wire format: orjson, one schema version in every message."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from pipeline.models import SCHEMA_VERSION
from shared.errors import DecodeError

M = TypeVar("M", bound=BaseModel)


def encode(model: BaseModel) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **model.model_dump(mode="json")})


def json_object(raw: bytes | str) -> dict[str, Any]:
    """One JSON object, or DecodeError saying what it is instead."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DecodeError(f"expected a JSON object, got {type(data).__name__}")
    return data


def decode(raw: bytes | str | None, model: type[M], context: dict[str, Any] | None = None) -> M:
    """Parse one message, or raise DecodeError saying exactly what is wrong with it."""
    if raw is None:
        raise DecodeError("message has no payload field")
    data = json_object(raw)
    version = data.pop("v", None)
    if version != SCHEMA_VERSION:
        raise DecodeError(f"schema version {version!r} is not {SCHEMA_VERSION}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise DecodeError(describe(exc)) from exc


def describe(exc: ValidationError) -> str:
    """One line per problem, each naming its field: what the DLQ and the client show."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
