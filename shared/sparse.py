"""BM25 sparse vectors, made the same way for both store engines.

Both adapters (Edge and server) call these two functions, so a memory written in
embedded mode and one written against a Qdrant server are tokenised identically and
an index can move between them. The store applies the IDF modifier itself; these
vectors carry only the term-frequency side of BM25.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from functools import lru_cache

import qdrant_edge

from pipeline.models import Memory

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

# Chinese (and Japanese kanji) runs are not given to the engine's tokenizer: they are indexed as
# character unigrams and bigrams, scored with textbook BM25 (k1 1.2, b 0.75). Measured on MADial zh
# (diary memories, a dialogue as the query), BM25 alone, R@5: the engine's word segmentation .453,
# jieba words .400, unigrams + bigrams .52–.54 (bench/RESULTS.md). A segmenter splits the same
# phrase differently in a memory and in a question ("喜欢绿茶" / "喜欢 绿 茶"); overlapping bigrams
# match whatever the split, and unigrams catch single-character words (猫, 茶).
CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
CJK_K1, CJK_B = 1.2, 0.75
# Unigrams and bigrams per memory: dev-scenario statements about 20, MADial diary memories 42.
CJK_AVG_LEN = 30.0
# Function characters: as unigrams they match everything ("有什么事情是绝对不能做的？" matched "前端用的是
# React" on 的 and 是); a bigram is dropped only if both its characters are such.
CJK_STOP = frozenset("的了是我在有和就不都也很到说要去你会着没看好这那他她它们"
                     "吗呢吧啊哦嗯呀啦么个一上下来过还又把被让给对从而与及或但")


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
    vector = _model().embed_document(CJK_RUN.sub(" ", text))
    weights = dict(zip(vector.indices, vector.values, strict=True))
    grams = Counter(cjk_terms(text))
    norm = CJK_K1 * (1 - CJK_B + CJK_B * sum(grams.values()) / CJK_AVG_LEN)
    for term, tf in grams.items():
        index = term_index(term)
        weights[index] = weights.get(index, 0.0) + tf * (CJK_K1 + 1) / (tf + norm)
    return _sorted(weights)


def embed_query(text: str) -> SparseTerms:
    """Sparse vector of a search text: weight 1.0 per distinct term. Empty if no term survives."""
    vector = _model().embed_query(CJK_RUN.sub(" ", text))
    weights = dict.fromkeys(vector.indices, 1.0) | dict.fromkeys(map(term_index, cjk_terms(text)), 1.0)
    return _sorted(weights)


def cjk_terms(text: str) -> list[str]:
    """The Chinese runs of `text` as unigrams (function characters left out) and bigrams."""
    terms: list[str] = []
    for run in CJK_RUN.findall(text):
        terms += [c for c in run if c not in CJK_STOP]
        terms += [run[i:i + 2] for i in range(len(run) - 1) if not CJK_STOP.issuperset(run[i:i + 2])]
    return terms


def term_index(term: str) -> int:
    """A stable 32-bit index for a Chinese term (the engine hashes its own terms into the same space)."""
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")


def _sorted(weights: dict[int, float]) -> SparseTerms:
    indices = sorted(weights)
    return indices, [weights[i] for i in indices]
