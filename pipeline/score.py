"""Turning engine candidates into ranked hits, as of `now`.

First version: the engine's fused relevance, with what must never be returned as
current taken out (expired events, memories from after `now`) and contested memories
flagged. Lifecycle weighting (decay by type, hotness, quotas) deepens this later.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pipeline.models import Hit, Memory, QueryPlan, Route, Status

# A document at rank r (0-based) in one list adds weight / (r + 1 + RRF_K); 60 is the value of the
# original RRF paper. The store engines fuse their prefetches with the same constant.
RRF_K = 60


def fuse_routes(routes: Sequence[tuple[float, Sequence[Memory]]], k: int = RRF_K) -> list[tuple[Memory, float]]:
    """Weighted reciprocal-rank fusion of the routes' ranked lists (DESIGN §4.3), best first.

    A memory found by several routes adds up; ranks, not raw scores, are combined, because
    dense, BM25 and fused scores live on different scales.
    """
    scores: dict[str, float] = {}
    found: dict[str, Memory] = {}
    for weight, ranked in routes:
        for rank, memory in enumerate(ranked):
            scores[memory.id] = scores.get(memory.id, 0.0) + weight / (k + rank + 1)
            found.setdefault(memory.id, memory)
    return sorted(((found[i], s) for i, s in scores.items()), key=lambda pair: pair[1], reverse=True)


def flat_plan(query: str) -> QueryPlan:
    """One route over the whole subject: the plan when intent planning is off."""
    return QueryPlan(intent="general_chat", routes=[Route(text=query)])


def unscoped(plan: QueryPlan) -> QueryPlan:
    """The same routes without their dirs: the plan when directory scoping is off."""
    return plan.model_copy(update={"routes": [r.model_copy(update={"dirs": []}) for r in plan.routes]})


def reweight(plan: QueryPlan, *, whole_subject: float, exact_match: float, bm25: float) -> QueryPlan:
    """The plan with the weights that live in settings: whole-subject routes (no dirs),
    exact-match routes and bm25 routes. A route weighted 0 is dropped (not run at all)."""
    def weight(r: Route) -> float:
        if r.strategy == "exact_match":
            return exact_match
        if r.strategy == "bm25":
            return bm25
        return r.weight if r.dirs else whole_subject

    routes = [r.model_copy(update={"weight": weight(r)}) for r in plan.routes]
    kept = [r for r in routes if r.weight > 0] or routes[:1]
    return plan.model_copy(update={"routes": kept})


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
