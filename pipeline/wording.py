"""A refused input in plain words (issue 41): what pydantic found wrong with a field, said as a caller reads it,
without its own vocabulary ("Input should be a valid dictionary or object to extract fields from", "Value error, ",
"Field required"). Pure: the front doors and the SDK word their refusals with it (workers/api_errors.py,
shared/sdk/client.py), each naming the field as its caller sent it.

A reason is a predicate of its field ("is required", "must be at most 200"), as `InvalidInput(field, reason)` reads
("k: must be at most 200"); `sentence` makes the whole sentence an HTTP reply carries ("`k` must be at most 200").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memflow.pipeline.feed import CURSOR_PATTERN, REVISION_PATTERN
from memflow.pipeline.models import HOLDER_PATTERN, MEMORY_ID_PATTERN, SUBJECT_PATTERN

# Patterns a caller meets, said in words rather than as a regular expression.
_PATTERNS = {SUBJECT_PATTERN: "must be 1 to 128 letters, digits or . _ : / - (a subject id)",
             HOLDER_PATTERN: "must be 1 to 80 characters without spaces (a person: self, mother, friend:小李)",
             MEMORY_ID_PATTERN: "must be a memory id: a UUID, such as 8fc354c3-f9df-571d-aa52-d8dd7b4db4a7",
             CURSOR_PATTERN: "must be an entry's `id` (such as 1767225600000-0), a page's `next`, or 0",
             REVISION_PATTERN: "must be a profile's `revision`, such as 1767225600000-0"}
_WHEN = "a date and time such as 2026-01-05T09:00:00+00:00"


def _ctx(name: str, template: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda ctx: template.format(ctx.get(name))


# By pydantic's error type: the reason, from the error's context (its bound, its pattern, what it expected).
_REASONS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "missing": lambda ctx: "is required",
    "extra_forbidden": lambda ctx: "is not a field of this body",
    "string_type": lambda ctx: "must be a string",
    "int_type": lambda ctx: "must be a whole number",
    "int_parsing": lambda ctx: "must be a whole number",
    "int_from_float": lambda ctx: "must be a whole number",
    "float_type": lambda ctx: "must be a number",
    "float_parsing": lambda ctx: "must be a number",
    "finite_number": lambda ctx: "must be a finite number",
    "bool_type": lambda ctx: "must be true or false",
    "bool_parsing": lambda ctx: "must be true or false",
    "list_type": lambda ctx: "must be a list (a JSON array)",
    "dict_type": lambda ctx: "must be a JSON object",
    "model_type": lambda ctx: "must be a JSON object",
    "model_attributes_type": lambda ctx: "must be a JSON object",
    "uuid_type": lambda ctx: "must be a UUID",
    "uuid_parsing": lambda ctx: "must be a UUID",
    "datetime_type": lambda ctx: f"must be {_WHEN}",
    "datetime_parsing": lambda ctx: f"must be {_WHEN}",
    "datetime_from_date_parsing": lambda ctx: f"must be {_WHEN}",
    "string_too_short": lambda ctx: ("must not be empty" if ctx.get("min_length") == 1
                                     else f"must be at least {ctx.get('min_length')} characters"),
    "string_too_long": _ctx("max_length", "must be at most {} characters"),
    "too_short": _ctx("min_length", "must hold at least {} items"),
    "too_long": _ctx("max_length", "must hold at most {} items"),
    "greater_than_equal": _ctx("ge", "must be at least {}"),
    "greater_than": _ctx("gt", "must be more than {}"),
    "less_than_equal": _ctx("le", "must be at most {}"),
    "less_than": _ctx("lt", "must be less than {}"),
    "enum": _ctx("expected", "must be one of {}"),
    "literal_error": _ctx("expected", "must be {}"),
    "string_pattern_mismatch": lambda ctx: _PATTERNS.get(str(ctx.get("pattern")),
                                                         f"must match the pattern {ctx.get('pattern')}"),
}
# The starts of pydantic's own messages a type not named above may still carry, and what each becomes.
_PREFIXES = (("Value error, ", ""), ("Assertion failed, ", ""), ("Input should be", "must be"),
             ("String should", "must"), ("Value should", "must"), ("Field required", "is required"))
# The words a reason that is a predicate of its field starts with: `sentence` puts the field before it.
_PREDICATES = ("is ", "must ", "holds ", "has ", "needs ", "names ", "was ")


def reason(error: Mapping[str, Any]) -> str:
    """The reason of one of pydantic's errors (`ValidationError.errors()`), in plain words: by its type where
    pydantic's own words are jargon; a validator's own message (`raise ValueError(...)`) as it was written."""
    kind, ctx = str(error.get("type", "")), error.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return plain(str(ctx["error"]))
    worded = _REASONS.get(kind)
    return worded(ctx) if worded is not None else plain(str(error.get("msg", "")))


def plain(message: str) -> str:
    """`message` without pydantic's prefixes ("Value error, "), its "Input should be" said as "must be"."""
    for prefix, instead in _PREFIXES:
        if message.startswith(prefix):
            message = instead + message[len(prefix):]
    return message.strip()


def sentence(field: str | None, why: str) -> str:
    """The refusal as a sentence naming the field: "`content` is required", "the body must be a JSON object",
    "`now`: a timestamp must be timezone-aware"."""
    predicate = why.startswith(_PREDICATES)
    if not field or (field == "body" and not predicate):  # the body as a whole: its validator's own sentence
        return why
    named = "the body" if field == "body" else f"`{field}`"
    return f"{named} {why}" if predicate else f"{named}: {why}"
