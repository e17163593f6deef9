"""Which subjects a key's patterns cover (pipeline/scopes.py): `*` for any run of characters, nothing else
special, and a match that takes time linear in the subject whatever the pattern."""

from __future__ import annotations

import re
import time

from hypothesis import given
from hypothesis import strategies as st

from memflow.pipeline.scopes import allows, covers


def by_regex(pattern: str, subject: str) -> bool:
    """The meaning, spelled as the regex the matcher once was (backtracking: exponential on `*a*a*a…b`)."""
    return re.fullmatch("".join(".*" if p == "*" else re.escape(p) for p in re.split(r"(\*)", pattern)),
                        subject) is not None


@given(st.text(alphabet="ab/*", min_size=1, max_size=10), st.text(alphabet="ab/", max_size=12))
def test_a_pattern_covers_what_its_regex_would(pattern: str, subject: str) -> None:
    assert covers(pattern, subject) == by_regex(pattern, subject)


def test_the_usual_patterns() -> None:
    assert covers("team-a/*", "team-a/alice") and covers("team-a/*", "team-a/bots/7")
    assert not covers("team-a/*", "team-b/alice") and not covers("team-a/*", "team-a")
    assert covers("*", "anyone") and covers("alice", "alice") and not covers("alice", "alice2")
    assert covers("*/alice", "team-a/alice") and covers("a*a", "aa") and not covers("a*a", "a")
    assert allows(("x", "team-*"), "team-c") and not allows(("x",), "y")


def test_a_pattern_of_many_stars_costs_no_more_than_a_plain_one() -> None:
    # `*a*a*a*a*a*a*a*b` over 60 characters took 34.5 s a request; 63 stars over 128 would never end.
    started = time.monotonic()
    for _ in range(100):
        assert not covers("*a" * 7 + "*b", "a" * 60)
        assert not covers("*a" * 63 + "*", "a" * 62) and covers("*a" * 63 + "*", "a" * 128)
    took = time.monotonic() - started
    assert took < 1.0, f"{took:.2f} s for 300 matches"  # microseconds each; the regex took seconds for one
