"""What a value must be to come in: the checks the models' validators run, and the limits they hold values to.

Timestamps name their offset and fall in years the pipeline can compute with; text encodes as UTF-8; an
event's meta is plain JSON of bounded depth; a vector holds finite numbers. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

# The most bytes an event's text holds unless its validation context names the setting's limit, and a query's.
DEFAULT_MAX_TEXT_BYTES = 32 * 1024

# How deep an event's meta may nest: far more than any agent needs, far less than the
# encoders' own limits (orjson refuses 255 levels, pydantic's serialiser fewer).
MAX_META_DEPTH = 32
# The meta entries the trigger stage copies into typed fields: each is a string or absent.
META_TEXT_KEYS = ("speaker", "external_ref", "outcome")
# The most characters each of them holds: a reference or a name, not a document (900,000 were stored).
MAX_META_TEXT = 2048
# When something said can have been said: far enough inside datetime's years 1-9999 that the
# pipeline's date arithmetic on it ("next year", an expiry, a decay) cannot overflow.
EVENT_YEARS = range(1900, 3000)


def aware(ts: datetime | None) -> datetime | None:
    """A timestamp on the wire names its offset: a naive one would be read as local time by one
    stage and fail to compare with an aware one in the next (a crash, or a wrong expiry)."""
    if ts is not None and ts.utcoffset() is None:
        raise ValueError("a timestamp must be timezone-aware (e.g. 2026-01-05T09:00:00+00:00)")
    return ts


def event_time(ts: datetime) -> datetime:
    """The time of an event: aware, and in EVENT_YEARS."""
    aware(ts)
    if ts.year not in EVENT_YEARS:
        raise ValueError(f"a timestamp must fall in the years {EVENT_YEARS.start} to {EVENT_YEARS.stop - 1}")
    return ts


def encodable(text: str | None) -> str | None:
    """Text that can be written as UTF-8 (a lone surrogate such as "\\ud800" cannot)."""
    if text is not None and (problem := _not_utf8(text)):
        raise ValueError(problem)
    return text


def _not_utf8(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid UTF-8: a lone surrogate at position {exc.start}"
    return None


def plain_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """An event's meta as given, or ValueError: plain JSON within MAX_META_DEPTH, and each of META_TEXT_KEYS a
    string of at most MAX_META_TEXT characters or absent."""
    problem = json_problem(meta, "meta", MAX_META_DEPTH)
    if problem is not None:
        raise ValueError(problem)
    for key in META_TEXT_KEYS:
        if not isinstance(meta.get(key), str | None):
            raise ValueError(f"meta.{key} must be a string")
        if len(meta.get(key) or "") > MAX_META_TEXT:
            raise ValueError(f"meta.{key} is {len(meta[key])} characters, over the limit of {MAX_META_TEXT}")
    return meta


def json_problem(value: Any, where: str, max_depth: int) -> str | None:
    """What keeps `value` from being plain JSON nested at most `max_depth` deep, or None.

    Walked without recursion: the value may be nested deeper than Python's stack."""
    todo = [(where, value, 0)]
    while todo:
        path, item, depth = todo.pop()
        if isinstance(item, (dict, list)) and depth >= max_depth:
            return f"{path}: nested more than {max_depth} levels deep"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or _not_utf8(key):
                    return f"{path}: the key {key!r:.40} is not a UTF-8 string"
                todo.append((f"{path}.{key:.40}", child, depth + 1))
        elif isinstance(item, list):
            todo.extend((f"{path}.{i}", child, depth + 1) for i, child in enumerate(item))
        elif problem := _scalar_problem(item):
            return f"{path}: {problem}"
    return None


def _scalar_problem(item: Any) -> str | None:
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, int):  # what orjson writes: signed or unsigned 64 bits
        return None if -(2**63) <= item < 2**64 else "an integer wider than 64 bits"
    if isinstance(item, float):
        return None if math.isfinite(item) else f"{item} is not a JSON number"
    if isinstance(item, str):
        return _not_utf8(item)
    return f"a {type(item).__name__} is not a JSON value"


def finite_vector(vector: list[float] | None) -> list[float] | None:
    """A vector as given, or ValueError: "NaN" and "Infinity" read as floats; the store would index them and every
    cosine with them is NaN (a batch's vector, an imported one)."""
    if vector is not None and not all(map(math.isfinite, vector)):
        raise ValueError("vector must hold finite numbers only")
    return vector
