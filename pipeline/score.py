"""Turning engine candidates into ranked hits, as of `now`.

First version: the engine's fused relevance, with what must never be returned as
current taken out (expired events, memories from after `now`) and contested memories
flagged. Lifecycle weighting (decay by type, hotness, quotas) deepens this later.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pipeline.models import Hit, Memory, Status


def visible_at(memory: Memory, now: datetime) -> bool:
    """A memory exists for a search at `now` if it was made by then and has not expired."""
    if memory.created_at > now:
        return False
    return memory.expires_at is None or memory.expires_at > now


def rank(candidates: Sequence[tuple[Memory, float]], now: datetime, k: int) -> list[Hit]:
    kept = [(m, s) for m, s in candidates if visible_at(m, now)]
    kept.sort(key=lambda pair: pair[1], reverse=True)
    return [to_hit(m, s) for m, s in kept[:k]]


def to_hit(memory: Memory, relevance: float) -> Hit:
    return Hit(id=memory.id, content=memory.content, dir=memory.dir, mtype=memory.mtype, key=memory.key,
               status=memory.status, tier=memory.tier, confidence=memory.confidence, score=relevance,
               scores={"relevance": relevance}, source_event_ids=memory.source_event_ids,
               created_at=memory.created_at, contested=memory.status is Status.contested)
