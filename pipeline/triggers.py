"""Triggers: which memory-worthy signals a message carries, decided per sentence (docs/write-path.md#triggers).

Preferences, corrections, rules, explicit "remember" and confirmed decisions are written
at once (realtime); everything else waits for the session's end. A question is not a
statement: "我喜欢什么样的回答风格？" fires nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from memflow.pipeline import cues
from memflow.pipeline.clauses import ended
from memflow.pipeline.models import MType
from memflow.pipeline.statements import is_question, split_sentences
from memflow.pipeline.topics import topic_of

SIGNALS = ("preference", "correction", "rule", "remember", "decision")


@dataclass(frozen=True)
class Cues:
    """What the wording of one sentence says about it."""

    question: bool
    remember: bool
    correction: bool
    rule: bool
    decision: bool
    preference: bool
    # Said about a preference topic (reply length, notification channel, tools…).
    style: bool
    temporary: bool
    forever: bool
    # A value said to have changed, in passing: on a topic of facts, or naming what is over (pipeline/clauses.py).
    change: bool = False

    @property
    def signals(self) -> list[str]:
        if self.question:
            return []
        flags = (self.preference, self.correction, self.rule, self.remember, self.decision)
        return [name for name, on in zip(SIGNALS, flags, strict=True) if on]


def read_cues(sentence: str) -> Cues:
    """The cues of one sentence. Rules beat preferences only when they are strong ones."""
    topic = topic_of(sentence)
    style = topic is not None and topic.mtype is MType.preference
    # A change of a fact's value ("we moved to…"); a wish said with "now" is a newer wish, no correction: the
    # newest preference wins unless well used, and then it is contested (docs/write-path.md#stubbornness).
    named_fact = topic_of(sentence, MType.fact)
    fact = named_fact is not None and named_fact.mtype is MType.fact
    strong = bool(cues.STRONG_RULE.search(sentence))
    weak = bool(cues.WEAK_RULE.search(sentence))
    stated = bool(cues.PREFERENCE.search(sentence))
    gated = style and bool(cues.GATED_PREFERENCE.search(sentence))
    return Cues(
        question=is_question(sentence),
        remember=bool(cues.REMEMBER.search(sentence)),
        correction=bool(cues.CORRECTION.search(sentence)),
        rule=strong or (weak and not stated and not style),
        decision=bool(cues.DECISION.search(sentence)) and not cues.UNDECIDED.search(sentence),
        preference=not strong and (stated or gated or (weak and style)),
        style=style,
        temporary=bool(cues.TEMPORARY.search(sentence)),
        forever=bool(cues.FOREVER.search(sentence)),
        change=ended(sentence) is not None or (fact and bool(cues.CHANGE.search(sentence))),
    )


def realtime_signals(text: str) -> list[str]:
    """The realtime signals of a message, in the order of `SIGNALS`, over all its statements."""
    found = {name for sentence in split_sentences(text) for name in read_cues(sentence).signals}
    return [name for name in SIGNALS if name in found]
