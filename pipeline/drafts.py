"""Drafts: what an extractor found, before it is stamped into a Candidate.

Extractors say *what* (type, key, content, source); `stamp` adds *whose, when and
where from* (subject, session, the turn's time, provenance, directory, tag version) the
same way for every kind of candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memflow.pipeline.holders import held_key, holder_of
from memflow.pipeline.models import Candidate, ExtractTask, MType, Role, Source, Turn
from memflow.pipeline.tagging import TAG_VERSION, place
from memflow.pipeline.topics import normalize_key

# Confidence by source (docs/write-path.md#confidence-by-source): said outright ≥ 0.9; asked to be remembered,
# corrected or written on purpose 0.95; one inference 0.4–0.6; a procedure that worked
# once 0.8 (repeated evidence, 0.7–0.8); tool output never above 0.5.
EXPLICIT_CONFIDENCE = 0.9
EMPHATIC_CONFIDENCE = 0.95
INFERRED_CONFIDENCE = 0.5
# An inference seen again in another session is repeated evidence (docs/write-path.md#confidence-by-source: 0.7–0.8).
REPEATED_CONFIDENCE = 0.75
SKILL_CONFIDENCE = 0.8
TOOL_CONFIDENCE = 0.3
RECORD_CONFIDENCE = 1.0  # an episode is a verbatim record: it certainly was said

# How much a memory matters when packing a prompt; rules first, chatter last.
IMPORTANCE: dict[MType, float] = {
    MType.rule: 0.9,
    MType.preference: 0.7,
    MType.decision: 0.7,
    MType.skill: 0.7,
    MType.fact: 0.6,
    MType.event: 0.5,
    MType.temp_preference: 0.4,
    MType.session_context: 0.3,
    MType.episode: 0.3,
}


@dataclass(frozen=True)
class Draft:
    mtype: MType
    key: str
    content: str
    evidence: str  # the quoted input span
    source: Source
    confidence: float
    expires_at: datetime | None = None
    pinned: bool = False
    # Its key names one single-valued thing (pipeline.extract.statement_slot).
    slot: bool = True
    # Whom it is about, when the extractor said (an LLM); None: read from the content (pipeline/holders.py).
    about: str | None = None


def stamp(task: ExtractTask, turn: Turn, draft: Draft, event_ids: list[str] | None = None) -> Candidate:
    """The candidate, stamped with `turn`'s time and (by default) its event as provenance.

    Whom it is about is part of its key (`holders.held_key`): "My wife is on a keto diet" never supersedes
    "I'm vegetarian". A named speaker owns what they state: with two people in one conversation (LoCoMo),
    "I live in Boston" is Caroline's city, not Melanie's, so the key and the content say whose.
    """
    content, key = draft.content, draft.key
    about = holder_of(content) if draft.about is None else draft.about
    if draft.mtype is not MType.episode and turn.role is not Role.tool:
        key = held_key(key, about)  # another person's fact is never a rival of the user's own
        if turn.speaker:
            content, key = f"{turn.speaker}: {content}", normalize_key(f"{turn.speaker}.{key}")
    return Candidate(
        subject=task.subject,
        session_id=task.session_id,
        mtype=draft.mtype,
        dir=place(draft.mtype, draft.source, content),
        key=key,
        content=content,
        confidence=draft.confidence,
        importance=IMPORTANCE.get(draft.mtype, 0.5),
        source=draft.source,
        evidence=draft.evidence,
        source_event_ids=event_ids or [turn.event_id],
        ts=turn.ts,
        expires_at=draft.expires_at,
        pinned=draft.pinned,
        slot=draft.slot,
        about=about,
        tag_version=TAG_VERSION,
        external_ref=task.external_ref,
    )
