"""Packing a prompt: preferences and rules first, one line per topic, contested memories as open questions."""

from __future__ import annotations

from datetime import UTC, datetime

from memflow.pipeline.models import Dir, Hit, MType, Status, Tier
from memflow.pipeline.pack import pack

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def hit(content: str, key: str, *, mtype: MType = MType.preference, contested: bool = False) -> Hit:
    return Hit(id=f"id-{key}-{content[:4]}", content=content, dir=Dir.preferences, mtype=mtype, key=key,
               status=Status.contested if contested else Status.active, tier=Tier.long_term, confidence=0.9,
               score=1.0, created_at=T0, contested=contested)


def words(text: str) -> int:
    return len(text.split())


def test_a_contested_memory_is_an_open_question_and_not_adopted() -> None:
    settled = hit("Prefers answers in English", "reply.language")
    disputed = hit("Prefers detailed answers", "reply.length", contested=True)
    packed = pack([disputed, settled], "", 500, words)
    assert packed.preferences == ["- The user MUST be served this way: Prefers answers in English"]
    assert packed.memories == ["- [contested, not settled] Prefers detailed answers"]
    assert packed.used_ids == [settled.id]


def test_a_temporary_wish_speaks_for_its_topic_in_the_prompt() -> None:
    wish = hit("Keep it short today", "reply.length.now", mtype=MType.temp_preference)
    standing = hit("Prefers detailed answers", "reply.length")
    packed = pack([wish, standing], "", 500, words)
    assert packed.preferences == ["- The user MUST be served this way: Keep it short today"]
    assert packed.used_ids == [wish.id]
