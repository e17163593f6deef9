"""A memory named by the start of its id, as `memflow inspect` shows it (8 characters): which of a subject's ids
it names. Pure: the caller lists the ids (one subject's, so that a prefix never crosses subjects)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

# Shorter than this, a prefix names too much to be meant (and a forget by it could take a memory by chance).
MIN_PREFIX = 4
# The start of a UUID as people copy it: the first group (inspect shows it whole, 8), or it, a dash and up to 4 more.
# Longer is a whole id cut short by a bad paste, refused as any malformed id is, not taken for a prefix.
_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_PREFIX},8}}|[0-9a-f]{{8}}-[0-9a-f]{{1,4}}")


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
    """Could be the start of an id as people copy one (`_PREFIX`): MIN_PREFIX characters at least."""
    return _PREFIX.fullmatch(memory_id.lower()) is not None


def expand(prefix: str, ids: Iterable[str]) -> list[str]:
    """The one id `prefix` starts (any case), none, or Ambiguous naming every id it starts."""
    wanted = prefix.lower()
    found = sorted({i for i in ids if i.startswith(wanted)})
    if len(found) > 1:
        raise Ambiguous(prefix, found)
    return found
