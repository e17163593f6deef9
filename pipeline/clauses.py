"""One fact per statement: a sentence that states several things is cut into one part per fact
(docs/write-path.md#one-fact-per-statement).

"I live in Hamburg and I work as a nurse" and "我叫小周，在南京做小学老师，住在鼓楼区" each state a city, a
job (and a name): kept as one memory, a later move would replace the job with the city. A sentence is
cut at its clause breaks (commas, semicolons, an "and" before a new subject or a verb of its own), and
the clauses are grouped back: a clause starts a part of its own only where it names a topic of the
table (pipeline/cues.py TOPICS) that the part so far does not, or a person the part is not about.
Every other clause stays with the one before it, so an elaboration keeps its fact ("我养了一只橘猫，
叫年糕，三岁了"), a new value keeps what it replaces ("I don't drink oolong anymore, these days it's a
flat white") and a wish keeps its qualifier. A part without a subject of its own borrows the sentence's
("在南京做小学老师" → "我在南京做小学老师"): each part must read on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memflow.pipeline import cues
from memflow.pipeline.holders import SELF, holder_of
from memflow.pipeline.models import MType
from memflow.pipeline.statements import CJK, bigrams, clean, normal
from memflow.pipeline.timeref import strip_time
from memflow.pipeline.topics import salient_words, topic_of


@dataclass(frozen=True)
class Part:
    """One fact of a sentence: its content (self-contained) and the span of the sentence it was read from."""

    text: str
    evidence: str


# Clause breaks: commas and semicolons, and "and" before a subject or a verb of its own ("I live in Hamburg
# and I work as…", "…and work as a nurse"). Not "and" inside a noun phrase ("tea and coffee").
_EN_VERB = r"(?:work|works|live|lives|study|studies|teach|teaches|own|owns|drive|drives|am|is|have|has|go|goes)"
_BREAK = re.compile(
    rf"\s*[，,；;]\s*|\s+and\s+(?=(?:I|I'm|I've|we|we're|my|our|(?i:{_EN_VERB}))\b)",
)
_CONJUNCTION = re.compile(r"^(?:and|but|also|so)\s+", re.I)
# A clause that opens with its own subject: a pronoun, "my/our …", a name, 我/你/他/她, a relation.
_EN_SUBJECT = re.compile(r"^(?:I|I'm|I've|I'd|we|we're|he|she|they|it|it's|my|our|his|her|their|the|this|that|there"
                         r"|[A-Z][a-z]+)\b")
_ZH_SUBJECT = re.compile(r"^[^\s，,]{0,4}?(?:我|你|他|她|它|咱)")
# The sentence's subject, lent to a clause without one.
_EN_HEAD = re.compile(r"^(?:[\w' ]{0,20}?[:,]\s*)?(?P<head>I|we|(?:my|our) [\w'-]+(?: [\w'-]+)?)\s+(?=\w)")
_ZH_HEAD = re.compile(r"(?P<head>我们?)")
# Someone the rules cannot name as a holder: "…, Tom moved to another team" says nothing of the user's city.
_THIRD = re.compile(r"^(?:(?:he|she|they|it|this|that|the|there)\b|(?!I\b)(?-i:[A-Z][a-z]*)\b(?<!My)(?<!Our)|他|她|它)",
                    re.I)
# Where an English phrase of what is over turns to when it ended: "smoking in January", "meat two years ago".
_WHEN = re.compile(r"\s+(?:in|on|since|during|last|this|after|before|about|around|\d+|one|two|three|four|five|six"
                   r"|a few|several)\b.*$", re.I)
# A named speaker's statement, as `drafts.stamp` writes it: "Caroline: I …".
_NAMED = re.compile(r"^((?-i:[A-Z][\w'-]*)(?: (?-i:[A-Z][\w'-]*))?|[\u4e00-\u9fff]{1,4})[:：] ")
# What names no habit or fact when said to be over: "I'm not sure anymore", "我已经不记得了".
_VAGUE = re.compile(r"^(?:(?:so|that|too|very|as|really|quite)\s+)?(?:sure|certain|ok(?:ay)?|fine|true|the case"
                    r"|possible|really|that|this|it|so|as|much|well|good|bad|here|there|easy|hard|new|young|funny"
                    r"|(?:记得|知道|确定|清楚|一样|想|会|能|敢|太)[^，,。]{0,4})$", re.I)
_REQUEST = re.compile(r"^(?:请|麻烦|别|不要|希望你|please|let|don'?t|do not|always|never|just)", re.I)
_EN_STATING = re.compile(rf"^(?:{_EN_VERB}|moved|working|living|studying|teaching|love|like|prefer|hate)\b", re.I)


def parts(sentence: str) -> list[Part]:
    """The facts of one sentence, in order; the sentence itself (one part) when it states one thing."""
    head = _head(sentence)
    groups: list[list[tuple[str, int, int]]] = []
    for clause in _clauses(sentence):
        if groups and not _starts_part(_lent(head, clause[0]), [c for c, _, _ in groups[-1]]):
            groups[-1].append(clause)
        else:
            groups.append([clause])
    if len(groups) < 2:
        return [Part(clean(sentence), sentence.strip())]
    return [_part(sentence, _trimmed(g) if i == 0 else g, head) for i, g in enumerate(groups)]


def _clauses(sentence: str) -> list[tuple[str, int, int]]:
    """The clauses of a sentence: each one's text (without a leading "and"/"but") and its span."""
    found, start = [], 0
    for m in [*_BREAK.finditer(sentence), None]:
        end = len(sentence) if m is None else m.start()
        piece = sentence[start:end]
        lead = _CONJUNCTION.match(piece)
        text = clean(piece[lead.end():] if lead else piece)
        if text:
            found.append((text, start, end))
        start = end if m is None else m.end()
    return found


def _starts_part(clause: str, group: list[str]) -> bool:
    """A clause begins a fact of its own: while the group states a fact of the table, it names a topic of facts
    (where one lives, works, what phone…) that the group does not, or it speaks of another person than the group
    ("我男朋友在深圳上班，我们周末才见面": the boyfriend's workplace, then the couple's weekends). Wishes on how to
    reply stay in their sentence: "这几天…，回复简短一点就行" is a wish for these days only."""
    if topic_of(" ".join(group), MType.fact) is None or _THIRD.match(clause):
        return False
    if _has_subject(clause) and holder_of(clean(clause)) != holder_of(clean(group[0])):
        return True
    topic = topic_of(clause, MType.fact)
    named = {t.key for t in (topic_of(c, MType.fact) for c in group) if t is not None}
    return topic is not None and topic.mtype is MType.fact and topic.key not in named


def _trimmed(group: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The first part without the greetings and openers before its first clause on a topic ("你好呀", "Quick
    update")."""
    first = next((i for i, (c, _, _) in enumerate(group) if topic_of(c) is not None), 0)
    return group[first:]


def _part(sentence: str, group: list[tuple[str, int, int]], head: str | None) -> Part:
    """The part's words as said (the evidence), its first clause given the sentence's subject if it has none."""
    (first, start, first_end), end = group[0], group[-1][2]
    offset = sentence.index(first, start, first_end) if first in sentence[start:first_end] else start
    said = clean(sentence[offset:end])
    return Part(_lent(head, said), said)


def _head(sentence: str) -> str | None:
    """The subject the sentence opens with ("I", "my sister", "我"), or None when it names none."""
    en = _EN_HEAD.search(sentence)
    if en:
        return en.group("head")
    zh = _ZH_HEAD.search(sentence)
    return zh.group("head") if zh and holder_of(sentence) == SELF else None


def _has_subject(clause: str) -> bool:
    return bool(_EN_SUBJECT.match(clause) or _ZH_SUBJECT.match(clause))


def _lent(head: str | None, clause: str) -> str:
    """The clause with the sentence's subject where it states something without one ("and work as a nurse",
    "住在鼓楼区"); a request ("please use bullets", "请简短一点") has none to borrow."""
    if head is None or _has_subject(clause) or _REQUEST.match(clause):
        return clause
    if "\u3400" <= head[0] <= "\u9fff":
        return f"{head}{clause}"
    return f"{head} {clause}" if _EN_STATING.match(clause) else clause


def ended(statement: str) -> str | None:
    """The words of what a statement says is over ("I don't drink oolong anymore" → "drink oolong"), or None."""
    m = cues.ENDED.search(statement)
    if m is None:
        return None
    what = clean(_WHEN.sub("", strip_time(next(g for g in m.groups() if g))))  # "quit smoking in January"
    return None if not what or _VAGUE.match(what) else what


def ends(ending: str, statement: str) -> bool:
    """Whether `statement` holds what `ending` names: its words all there (the leading verb aside, so "drink
    oolong" ends "I love oolong tea" but "drink" alone never ends "I drink beer on Fridays"), or in Chinese
    at least half its character pairs ("喝可乐" ends "我每天晚上都要喝一杯可乐")."""
    if CJK.search(ending):
        pairs = [b for b in bigrams(ending) if CJK.search(b)]
        held = sum(1 for b in pairs if b in normal(statement))
        return bool(pairs) and held >= max(1, len(pairs) / 2)
    words = salient_words(ending)
    said = set(re.findall(r"[a-z0-9]+", statement.lower()))
    needed = words[1:] if len(words) > 1 else words
    return bool(needed) and all(_said(w, said) for w in needed)


def same_speaker(a: str, b: str) -> bool:
    """Whether two statements were said by the same named speaker, or both by nobody named: in a conversation of
    several (LoCoMo) each statement reads "Caroline: …", and Melanie's "I don't paint anymore" ends nothing of
    Caroline's."""
    return _speaker(a) == _speaker(b)


def _speaker(statement: str) -> str | None:
    m = _NAMED.match(statement)
    return m.group(1) if m else None


def _said(word: str, said: set[str]) -> bool:
    stem = word[:max(4, len(word) - 3)]
    return any(w.startswith(stem) for w in said)
