"""Unit vectors as lists of floats: what the encoders (shared/inference/embedder.py) and a search (pipeline/search.py)
combine."""

from __future__ import annotations

import math
from collections.abc import Sequence


def summed(vectors: Sequence[Sequence[float]]) -> list[float]:
    """The unit vector along the sum: its cosine with any unit vector ranks as the sum of theirs."""
    return to_unit([math.fsum(column) for column in zip(*vectors, strict=True)])


def to_unit(values: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in values)) or 1.0
    return [x / norm for x in values]
