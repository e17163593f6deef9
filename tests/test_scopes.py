"""Which subjects a key's patterns cover (pipeline/scopes.py): `*` for any run of characters, nothing else
special, and a match that takes time linear in the subject whatever the pattern."""

from __future__ import annotations

import re

import pytest
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


# A deadline, not a bound: microseconds a match here, while a backtracking matcher never ends on 63 stars over
# 128 characters (pytest-timeout interrupts even a regex in C). A figure of how fast would be a benchmark's.
@pytest.mark.timeout(30)
def test_a_pattern_of_many_stars_ends_and_answers_as_a_plain_one_would() -> None:
    # `*a*a*a*a*a*a*a*b` over 60 characters took 34.5 s a request; 63 stars over 128 would never end.
    for _ in range(100):
        assert not covers("*a" * 7 + "*b", "a" * 60)
        assert not covers("*a" * 63 + "*", "a" * 62) and covers("*a" * 63 + "*", "a" * 128)
