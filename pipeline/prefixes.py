"""A memory named by the start of its id, as `memflow inspect` shows it (8 characters): which of a subject's ids
it names. Pure: the caller lists the ids (one subject's, so that a prefix never crosses subjects)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

# Shorter than this, a prefix names too much to be meant (and a forget by it could take a memory by chance).
MIN_PREFIX = 4
_HEX_START = re.compile(r"[0-9a-f][0-9a-f-]*")


class Ambiguous(ValueError):
    """A prefix that starts more than one id: the caller says which ones, and asks for more characters."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        super().__init__(f"{prefix} is the start of {len(candidates)} memories: {', '.join(candidates[:5])}"
                         + (", …" if len(candidates) > 5 else "") + "; give more of the id")
        self.candidates = candidates


def is_full_id(memory_id: str) -> bool:
    """A whole id (a UUID, as every memory's is): looked up as it is, never as a prefix."""
    try:
        return str(uuid.UUID(memory_id)) == memory_id.lower() and len(memory_id) == 36
    except ValueError:
        return False


def is_prefix(memory_id: str) -> bool:
    """Could be the start of an id: hex digits (and dashes), at least MIN_PREFIX of them."""
    return len(memory_id) >= MIN_PREFIX and _HEX_START.fullmatch(memory_id.lower()) is not None


def expand(prefix: str, ids: Iterable[str]) -> list[str]:
    """The one id `prefix` starts (any case), none, or Ambiguous naming every id it starts."""
    wanted = prefix.lower()
    found = sorted({i for i in ids if i.startswith(wanted)})
    if len(found) > 1:
        raise Ambiguous(prefix, found)
    return found
