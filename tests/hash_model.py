"""A small deterministic embedding model for tests: the second identity beside the real MiniLM.

Kept apart from the tests so that a child process can import it without pytest or qdrant-client.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class HashModel:
    """A deterministic stand-in model: each character adds to one of `dim` dims; unit length."""

    def __init__(self, model_id: str = "test:hash-32", dim: int = 32) -> None:
        self.model_id, self.dim, self.encoded = model_id, dim, 0

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        self.encoded += len(texts)
        return [self._vector(t) for t in texts]

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._vector(t) for t in texts]  # symmetric: a query is encoded like what is stored

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def _vector(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        for i, ch in enumerate(text):
            v[(ord(ch) * 7 + i % 3) % self.dim] += 1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]


def other_hash() -> HashModel:
    """A second stand-in with another identity, where the real model would only make a test slower."""
    return HashModel("test:hash-48", 48)
