"""Route fusion and the plan switches of the read path (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pipeline.models import Dir, Memory, MType, QueryPlan, Route, Source
from pipeline.score import flat_plan, fuse_routes, rank, reweight, unscoped, visible_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def memory(mid: str, **extra: object) -> Memory:
    fields = {"id": mid, "subject": "s", "uri": f"mem://s/general/{mid}", "dir": Dir.general, "mtype": MType.fact,
              "key": mid, "content": f"content {mid}", "confidence": 0.9, "source": Source.explicit,
              "created_at": T0, "updated_at": T0} | extra
    return Memory.model_validate(fields)


def test_fusion_adds_up_a_memory_found_by_several_routes() -> None:
    a, b, c = memory("a"), memory("b"), memory("c")
    fused = fuse_routes([(1.0, [a, b]), (1.0, [c, b])])
    assert [m.id for m, _ in fused] == ["b", "a", "c"]
    assert fused[0][1] == 1 / 62 + 1 / 62


def test_fusion_respects_route_weights() -> None:
    a, b = memory("a"), memory("b")
    assert [m.id for m, _ in fuse_routes([(0.2, [a]), (1.0, [b])])] == ["b", "a"]
    assert fuse_routes([]) == []


def test_plan_switches() -> None:
    plan = QueryPlan(intent="preference_query", routes=[Route(text="q", dirs=[Dir.preferences]), Route(text="q")])
    assert all(r.dirs == [] for r in unscoped(plan).routes)
    weighted = reweight(plan, whole_subject=0.7, exact_match=0.0, bm25=0.5)
    assert [r.weight for r in weighted.routes] == [1.0, 0.7]
    exact = QueryPlan(intent="entity_recall", routes=[Route(text="q", dirs=[Dir.entities]),
                                                       Route(text="Mia", dirs=[Dir.entities], strategy="exact_match")])
    assert [r.strategy for r in reweight(exact, whole_subject=0.3, exact_match=0.0, bm25=0.5).routes] == ["semantic"]
    assert flat_plan("q").routes == [Route(text="q")]


def test_rank_hides_the_future_and_the_expired_and_flags_contested() -> None:
    now = T0 + timedelta(days=10)
    later = memory("later", created_at=now + timedelta(seconds=1))
    expired = memory("expired", expires_at=now - timedelta(seconds=1))
    contested = memory("contested", status="contested")
    assert not visible_at(later, now) and not visible_at(expired, now)
    hits = rank([(later, 3.0), (expired, 2.0), (contested, 1.0)], now, k=5)
    assert [h.id for h in hits] == ["contested"] and hits[0].contested
