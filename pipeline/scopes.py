"""Which subjects a credential may touch: glob patterns over subject ids.

A pattern is a subject id in which `*` stands for any run of characters, `/` included
(`team-a/*` covers `team-a/alice` and `team-a/bots/7`; `*` alone covers every subject).
Nothing else is special: subject ids never hold `?` or `[`, so a pattern means exactly what
it shows. Pure: the key store (shared/apikeys.py) and the HTTP API decide with these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

PATTERN_CHARS = re.compile(r"^[A-Za-z0-9._:/*-]{1,128}$")


def check_pattern(pattern: str) -> str:
    """The pattern, or ValueError saying why it cannot scope a key."""
    if not PATTERN_CHARS.match(pattern):
        raise ValueError(f"{pattern!r} is no subject pattern: letters, digits, . _ : / - and * only (1-128)")
    return pattern


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern)))


def covers(pattern: str, subject: str) -> bool:
    return _compiled(pattern).fullmatch(subject) is not None


def allows(patterns: Iterable[str], subject: str) -> bool:
    return any(covers(p, subject) for p in patterns)


def single_subject(patterns: Iterable[str]) -> str | None:
    """The one subject the patterns name when they name exactly one literal id (no `*`), else None:
    a key made for one agent's user need not say its subject again (MCP)."""
    names = list(patterns)
    return names[0] if len(names) == 1 and "*" not in names[0] else None
