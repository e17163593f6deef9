"""Statements: cutting a turn into sentences, telling questions apart, and trimming cue wording.

A memory is one self-contained statement (docs/write-path.md#statements), so extraction works sentence
by sentence. Commas stay inside a sentence: "我不喜欢冗长的解释，回答请尽量简短" is one
statement, and "决定了，就用哨兵模式，因为…" keeps its reason.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Chinese (and other CJK ideographs): whether a text is written in Chinese, and how to say things back.
CJK = re.compile(r"[\u3400-\u9fff]")

# Sentence ends: CJK and ASCII terminators, semicolons, newlines; "." only before
# whitespace so that "PostgreSQL 15.2" and "v1.2" stay whole, and not after a title
# ("My dentist is Dr. Patel" is one statement, not "My dentist is Dr" and "Patel").
_TITLES = ("Dr", "Mr", "Mrs", "Ms", "Prof", "St", "Jr", "Sr")
_AFTER_TITLE = "".join(rf"(?<!\b{t}\.)" for t in _TITLES)
_SENTENCE_BREAK = re.compile(rf"(?<=[。！？!?；;\n])|(?<=\.){_AFTER_TITLE}\s+")
_EDGE = " \t\r\n。！？!?；;.，,、:：-—"

# Requests worded as questions are statements of what the user wants ("能不能以后用钉钉？").
_REQUEST = re.compile(r"^(?:请|麻烦|能不能|能否|可不可以)|^(?:can|could|would|will) you\b|^please\b", re.I)
_ZH_QUESTION_END = re.compile(r"[吗呢么嘛][？?。！!\s]*$")
# Interrogatives that make a sentence a question even without "？"; bare 什么/谁 are
# left out ("我什么都吃" is a statement).
_ZH_INTERROGATIVE = re.compile(r"什么样|哪个|哪些|哪里|哪儿|为什么|为啥|怎么样|怎样|多少|是不是|有没有|几点|几号")
_EN_QUESTION_START = re.compile(
    r"^(?:what|which|who|whom|whose|when|where|why|how|do|does|did|is|are|am|was|were|can|could|"
    r"should|would|will|shall|have|has)\b(?!\s+not\b)",
    re.I,
)

# Negation markers, counted to compare the polarity of two statements lexically: the
# default embedding scores a sentence and its negation 0.93 (docs/architecture.md#what-the-vectors-cannot-tell).
_NEGATION = re.compile(r"不|没|别|非|无|未|\bnot\b|\bno\b|\bnever\b|n't\b|\bwithout\b", re.I)

_REMEMBER_HEAD = re.compile(
    r"^(?:请|麻烦)?(?:帮我)?(?:永远)?(?:记住|记一下|记下来?|记得)[了吧]?[\s:：,，]*"
    r"|^(?:please\s+)?(?:always\s+)?(?:remember|don'?t forget|do not forget|keep in mind|make a note)"
    r"(?:\s+(?:that|this))?[\s:,]*",
    re.I,
)
_REMEMBER_TAIL = re.compile(
    r"[，,]\s*(?:请|麻烦)?(?:帮我)?(?:记住|记一下|记下来?)[了吧啊]?$|[,;]?\s*(?:please\s+)?remember (?:that|this)$",
    re.I,
)
_CORRECTION_HEAD = re.compile(
    r"^(?:更正一下|更正|纠正一下|纠正|(?:你|我)?(?:说错了|搞错了|弄错了|记错了)|不对|correction|update|actually|sorry"
    r"|to correct|let me correct(?: that)?|you got (?:it|that) wrong)[\s:：,，!！]*",
    re.I,
)
# A clause that only restates the old value ("…，不在北京了"): dropped from a
# correction so that its content is the new value.
_RESTATES_OLD = re.compile(r"^(?:不在|不是|不再|不用|已经不|no longer\b|not\b)", re.I)
_CLAUSE_BREAK = re.compile(r"([，,])")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, without empty or punctuation-only pieces."""
    pieces = (p.strip() for p in _SENTENCE_BREAK.split(text))
    return [p for p in pieces if clean(p)]


def clean(sentence: str) -> str:
    """The sentence without surrounding whitespace and punctuation: what a memory's content holds."""
    return sentence.strip(_EDGE)


def is_question(sentence: str) -> bool:
    """Whether a sentence asks rather than states: a question never becomes a memory."""
    s = sentence.strip()
    if _REQUEST.search(s):
        return False
    if s.endswith(("?", "？")) or _ZH_QUESTION_END.search(s):
        return True
    unterminated = not s.endswith((".", "!", "。", "！"))
    return unterminated and bool(_ZH_INTERROGATIVE.search(s) or _EN_QUESTION_START.search(s))


def negations(text: str) -> int:
    """How many negation markers `text` holds; its parity is the statement's polarity."""
    return len(_NEGATION.findall(text))


def strip_remember(sentence: str) -> str:
    """`记住：X` / `X，帮我记一下` / `Remember that X` → X."""
    return clean(_REMEMBER_TAIL.sub("", _REMEMBER_HEAD.sub("", clean(sentence))))


def strip_correction(sentence: str) -> str:
    """`更正一下，我已经搬到上海了，不在北京了` → `我已经搬到上海了`: the new value only."""
    body = clean(sentence)
    while (shorter := _CORRECTION_HEAD.sub("", body, count=1)) != body:
        body = shorter
    return _drop_restated_old(body)


def _drop_restated_old(body: str) -> str:
    parts = _CLAUSE_BREAK.split(body)
    kept = [parts[0]]
    for sep, clause in zip(parts[1::2], parts[2::2], strict=True):
        if not _RESTATES_OLD.match(clause.strip()):
            kept += [sep, clause]
    return "".join(kept).strip(" ，,")


_NOT_CONTENT = re.compile(r"[\W_]+")


# Wordings are compared again and again (every candidate against every neighbour, in resolve and in each
# search's pending layer), and the same statements come back: their normal forms and bigrams are kept.
@lru_cache(maxsize=16384)
def normal(text: str) -> str:
    """Lowercased, without punctuation or spaces: for comparing wordings."""
    return _NOT_CONTENT.sub("", text.lower())


@lru_cache(maxsize=16384)
def bigrams(text: str) -> frozenset[str]:
    """Character bigrams of the normal form (Chinese has no word boundaries)."""
    s = normal(text)
    return frozenset({s[i : i + 2] for i in range(len(s) - 1)} or {s})


def overlap(a: str, b: str) -> float:
    """Jaccard similarity of the two wordings' bigrams."""
    x, y = bigrams(a), bigrams(b)
    return len(x & y) / len(x | y)


def coverage(part: str, whole: str) -> float:
    """How much of `whole`'s wording `part` repeats (share of whole's bigrams)."""
    x, y = bigrams(part), bigrams(whole)
    return len(x & y) / len(y)
