"""Which subjects a credential may touch: glob patterns over subject ids.

A pattern is a subject id in which `*` stands for any run of characters, `/` included
(`team-a/*` covers `team-a/alice` and `team-a/bots/7`; `*` alone covers every subject).
Nothing else is special: subject ids never hold `?` or `[`, so a pattern means exactly what
it shows. Pure: the key store (shared/admission/apikeys.py) and the HTTP API decide with these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PATTERN_CHARS = re.compile(r"^[A-Za-z0-9._:/*-]{1,128}$")


def check_pattern(pattern: str) -> str:
    """The pattern, or ValueError saying why it cannot scope a key."""
    if not PATTERN_CHARS.match(pattern):
        raise ValueError(f"{pattern!r} is no subject pattern: letters, digits, . _ : / - and * only (1-128)")
    return pattern


def covers(pattern: str, subject: str) -> bool:
    """Whether `subject` is one the pattern names. Without backtracking: a regex `.*a.*a.*a…b` tried every
    split of the subject (34.5 s for `*a*a*a*a*a*a*a*b` over 60 characters, on every request of that key).
    With `*` the only wildcard, the leftmost place of each literal part is as good as any later one, so one
    pass finds them: linear in the subject for each part."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return subject == pattern
    head, *middle, tail = parts
    if len(head) + len(tail) > len(subject) or not subject.startswith(head) or not subject.endswith(tail):
        return False
    at, end = len(head), len(subject) - len(tail)
    for part in middle:
        found = subject.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


def allows(patterns: Iterable[str], subject: str) -> bool:
    return any(covers(p, subject) for p in patterns)


def single_subject(patterns: Iterable[str]) -> str | None:
    """The one subject the patterns name when they name exactly one literal id (no `*`), else None:
    a key made for one agent's user need not say its subject again (MCP)."""
    names = list(patterns)
    return names[0] if len(names) == 1 and "*" not in names[0] else None
