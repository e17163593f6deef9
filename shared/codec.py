"""The wire format: orjson, one schema version in every message."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from memflow.pipeline.models import SCHEMA_VERSION
from memflow.shared.errors import DecodeError

M = TypeVar("M", bound=BaseModel)

# No message of ours nests deeper than a dozen levels (an event's meta at most 32, MAX_META_DEPTH).
# The limit is checked before parsing: orjson parses nesting by recursion on the thread's stack,
# and 200,000 levels (a 400 kB entry) kill the process, every stage of it, with a segfault.
MAX_JSON_DEPTH = 64
# A JSON string (its brackets are text) or a bracket.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def encode(model: BaseModel) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **model.model_dump(mode="json")})


def json_object(raw: bytes | str) -> dict[str, Any]:
    """One JSON object, or DecodeError saying what it is instead."""
    if nested_deeper(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw, MAX_JSON_DEPTH):
        raise DecodeError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DecodeError(f"expected a JSON object, got {type(data).__name__}")
    return data


def nested_deeper(raw: bytes, limit: int) -> bool:
    """Whether the arrays and objects in `raw` nest more than `limit` deep (read as JSON would be)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def decode(raw: bytes | str | None, model: type[M], context: dict[str, Any] | None = None) -> M:
    """Parse one message, or raise DecodeError saying exactly what is wrong with it."""
    if raw is None:
        raise DecodeError("message has no payload field")
    return validated(json_object(raw), model, context)


def validated(data: dict[str, Any], model: type[M], context: dict[str, Any] | None = None) -> M:
    """A message already read as JSON (`json_object`), checked for its schema version and validated."""
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
