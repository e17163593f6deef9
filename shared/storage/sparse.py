"""BM25 sparse vectors, made the same way for both store engines.

Both adapters (Edge and server) call these two functions, so a memory written in
embedded mode and one written against a Qdrant server are tokenised identically and
an index can move between them. The store applies the IDF modifier itself; these
vectors carry only the term-frequency side of BM25.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import qdrant_edge

from memflow.pipeline.models import Memory

# BM25 length normalisation compares a document's token count to avg_len. The
# default (256) is for web pages: against it every memory looks tiny and length
# normalisation is switched off in effect. Measured with this tokenizer (stopwords
# dropped): dev-scenario utterances are 7.7 tokens on average (max 20), LoCoMo
# fact-like observations 9.2, raw LoCoMo turns 12.8 (p90 23); an episode indexed with
# the turns around it about three times that.
AVG_LEN_TOKENS = 12.0
# k1 0.9 (term frequency saturates sooner) and b 0.3 (long documents are punished less):
# an episode's text includes its neighbours' turns, and b 0.75 buried exactly those. On
# LoCoMo, over turns indexed with their neighbours, 1.2/0.75 → 0.9/0.3 was worth +1.5–2
# points of R@5 (bench/RESULTS.md).
K1 = 0.9
B = 0.3
# Changing any of these changes stored weights: re-embed existing points if you ever do.

SparseTerms = tuple[list[int], list[float]]


@lru_cache(maxsize=1)
def _model() -> qdrant_edge.Bm25:
    # Multilingual segments Chinese into words ("冗长", "解释"), which the default
    # tokenizer would leave as one unsearchable run of characters.
    # English and Chinese stopwords: without the Chinese ones "有什么事情是绝对不能做的？" matched
    # "前端用的是 React 和 Vite" on 的 and 是, and outranked the rule it was asking for.
    stopwords = qdrant_edge.StopwordsSet(languages={qdrant_edge.Language.English, qdrant_edge.Language.Chinese})
    config = qdrant_edge.Bm25Config(
        tokenizer=qdrant_edge.TokenizerType.Multilingual, avg_len=AVG_LEN_TOKENS, k=K1, b=B, stopwords=stopwords
    )
    return qdrant_edge.Bm25(config)


def indexed_text(memory: Memory) -> str:
    """What keyword search matches a memory on: its content and, for episodes, the turns around it."""
    return f"{memory.content}\n{memory.context}" if memory.context else memory.content


def embed_document(text: str) -> SparseTerms:
    """Sparse vector of a stored memory: BM25 term-frequency weights (indices sorted, unique)."""
    vector = _model().embed_document(text)
    return list(vector.indices), list(vector.values)


def embed_query(text: str) -> SparseTerms:
    """Sparse vector of a search text: weight 1.0 per distinct term. Empty if no term survives."""
    vector = _model().embed_query(text)
    return list(vector.indices), list(vector.values)


def memory_terms(memory: Memory) -> Mapping[int, float]:
    """A stored (or pending) memory's BM25 term weights, as the store indexed them."""
    return text_terms(indexed_text(memory))


def text_terms(text: str) -> Mapping[int, float]:
    """A text's BM25 term weights as a document ({term: weight})."""
    return dict(_document_terms(text))


@lru_cache(maxsize=8192)
def _document_terms(text: str) -> tuple[tuple[int, float], ...]:
    # Kept: the same memories come back search after search.
    indices, values = embed_document(text)
    return tuple(zip(indices, values, strict=True))
