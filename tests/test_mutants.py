"""The table of bench/mutants.py stays runnable: every protection it switches off is still where it says, and
every test it names still exists (a refactor that moved one would otherwise retire its proof in silence)."""

from __future__ import annotations

import re

import pytest

from memflow.bench.mutants import MUTANTS, ROOT, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_finds_its_text_once_and_names_real_tests(mutant: Mutant) -> None:
    assert mutant.edits or mutant.env, f"{mutant.name} switches nothing off"
    for name, old, new in mutant.edits:
        assert (ROOT / name).read_text().count(old) == 1, f"{mutant.name}: {name} no longer holds its text once"
        assert old != new
    for test in mutant.tests:
        path, _, function = test.partition("::")
        assert (ROOT / path).is_file(), test
        assert not function or f"def {function.split('[')[0]}(" in (ROOT / path).read_text(), test
    assert mutant.guarantee in ANCHORS, f"{mutant.name}: no section #{mutant.guarantee} in docs/guarantees.md"


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


ANCHORS = {anchor(line[3:]) for line in (ROOT / "docs" / "guarantees.md").read_text().splitlines()
           if line.startswith("## ")}
