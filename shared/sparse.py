"""BM25 sparse vectors, made the same way for both store engines.

Both adapters (Edge and server) call these two functions, so a memory written in
embedded mode and one written against a Qdrant server are tokenised identically and
an index can move between them. The store applies the IDF modifier itself; these
vectors carry only the term-frequency side of BM25.
"""

from __future__ import annotations

from functools import lru_cache

import qdrant_edge

from pipeline.models import Memory

# BM25 length normalisation compares a document's token count to avg_len. The
# default (256) is for web pages: against it every memory looks tiny, so a 6-token
# preference and a 40-token episode get almost the same weight per matching term
# (1.67 vs 1.53) and length normalisation is switched off in effect. Measured with
# this tokenizer (stopwords dropped): the dev-scenario utterances are 7.7 tokens on
# average (max 20), LoCoMo fact-like observations 9.2, raw LoCoMo turns 12.8 (p90 23).
# 12 sits between the statements and the raw turns that become episodes, so a short
# focused memory beats a long episode that mentions the word in passing (1.26 vs 0.51).
# Changing it changes stored weights: re-embed existing points if you ever do.
AVG_LEN_TOKENS = 12.0

SparseTerms = tuple[list[int], list[float]]


@lru_cache(maxsize=1)
def _model() -> qdrant_edge.Bm25:
    # Multilingual segments Chinese into words ("冗长", "解释"), which the default
    # tokenizer would leave as one unsearchable run of characters.
    config = qdrant_edge.Bm25Config(
        tokenizer=qdrant_edge.TokenizerType.Multilingual, avg_len=AVG_LEN_TOKENS
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
