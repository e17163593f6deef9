"""The read path asks the store once per search: every route's queries in one batch (`Store.query_many`), and a
scoped route that covers nearly the whole subject read off the whole-subject route's candidates — with the same
candidates, hits and order as the route-by-route search it replaces (`shared.search.reader.run_route`).

A realistic store: a few hundred memories of two subjects in every directory, type, status and topic key, with
the real model's vectors; "wide" keeps most of them where an entity question looks, "narrow" few.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memflow.pipeline import search as recipe
from memflow.pipeline.models import Dir, Memory, MType, SearchRequest, Source, Status
from memflow.pipeline.ranking import RankingProfile
from memflow.pipeline.score import Found
from memflow.shared.errors import StoreUnavailable
from memflow.shared.inference.embedder import Embedder
from memflow.shared.search import reader as search_reader
from memflow.shared.search.reader import profile_for
from memflow.shared.settings import Fusion, Settings
from memflow.shared.storage.store import MemoryFilter, Query, Scored, Store
from memflow.workers.runtime import Context

# Each test searches a few hundred real vectors many times over, twice: slow on a busy machine.
pytestmark = pytest.mark.timeout(600)
T0 = datetime(2026, 4, 1, 9, 0, tzinfo=UTC)
NAMES = ["Atlas", "Borealis", "Ana", "Chen", "Farah", "PostgreSQL", "Redis", "Kafka", "青鸟", "北辰"]
THINGS = ["database", "rollout", "deploy", "migration", "budget", "roadmap", "invoice", "dashboard", "编辑器", "报告"]
SAID = ["{n} decided to move the {t} to next quarter", "We use {n} for the {t} now", "{n} reviewed the {t} twice",
        "I prefer short answers about the {t}", "Never touch the {t} on Fridays, says {n}", "{n}负责{t}的迁移",
        "我们选了{n}来做{t}，因为更稳定", "Last week {n} fixed the {t} after the outage", "{n} asked about the {t}"]
ENTITY_DIRS = [Dir.entities, Dir.events, Dir.general]
OTHER_DIRS = [Dir.preferences, Dir.skills, Dir.system, Dir.tools, Dir.patterns]
QUERIES = ["Which database does Atlas use?", "What happened with the Borealis rollout last week?",
           "Why did we choose PostgreSQL for the migration?", "How should answers about the budget be formatted?",
           "Who do I report to?", "青鸟项目的报告是谁负责的？", "what did Ana do with the invoice",
           "Remind me what Chen said about the dashboard", "用户喜欢什么样的回答？"]


def memories(subject: str, n: int, entity_share: float, rng: random.Random) -> list[Memory]:
    found = []
    for i in range(n):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        text = rng.choice(SAID).format(n=name, t=thing) + f" ({rng.choice(THINGS)} {i})" * rng.randint(0, 2)
        where = rng.choice(ENTITY_DIRS) if rng.random() < entity_share else rng.choice(OTHER_DIRS)
        key = rng.choice(["tech.db", "tech.db.now", "org.manager", f"note.{i}", f"note.{i}"])
        status = rng.choices([Status.active, Status.contested, Status.superseded], [8, 1, 1])[0]
        found.append(Memory(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{subject}/{i}")), subject=subject, uri=f"mem://{subject}/{i}",
            dir=where, mtype=rng.choice([MType.fact, MType.event, MType.decision, MType.preference, MType.episode]),
            key=key, content=text, confidence=0.9, source=Source.explicit, status=status,
            created_at=T0 + timedelta(hours=i), updated_at=T0 + timedelta(hours=i), source_event_ids=[f"e{i}"]))
    return found


@pytest.fixture(scope="module")
def seed(embedder: Embedder) -> list[tuple[list[Memory], Any]]:
    """The two subjects' memories and their vectors, encoded once for the module (the costly part)."""
    rng = random.Random(17)
    batches = [memories(subject, 320, share, rng) for subject, share in (("wide", 0.92), ("narrow", 0.15))]
    return [(batch, embedder.encode_passages([m.content for m in batch])) for batch in batches]


@pytest.fixture
def ctx(settings: Settings, embedder: Embedder, seed: list[tuple[list[Memory], Any]]) -> Iterator[Context]:
    # A store of each test's own: the tests swap its settings and wrap its store.
    made = Context.from_settings(settings, embedder=embedder)
    for batch, vectors in seed:
        made.store.put(batch, vectors)
    yield made
    made.close()


class Counted:
    """The real store, with a record of the searches asked of it (one entry per engine call)."""

    def __init__(self, store: Store, fail_batches: bool = False) -> None:
        self.store, self.calls, self.fail_batches = store, [], fail_batches

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def query(self, flt: MemoryFilter, **kwargs: Any) -> list[Scored]:
        self.calls.append("query")
        return self.store.query(flt, **kwargs)

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        self.calls.append(f"batch of {len(queries)}")
        if self.fail_batches:
            raise StoreUnavailable("injected: the batch times out")
        return self.store.query_many(queries)


def counted(ctx: Context, **kwargs: Any) -> Counted:
    ctx._store = Counted(ctx.store, **kwargs)
    return ctx._store


def route_by_route(store: Store, fusion: Fusion, req: SearchRequest, routes: Sequence[Any],
                   vectors: dict[str, list[float]], pool: int) -> list[Found]:
    return [search_reader.run_route(store, fusion, req, route, vectors, pool) for route in routes]


def profile(ctx: Context, query: str) -> RankingProfile:
    return profile_for(ctx.settings, ctx.ranking, query)


def plan_for(ctx: Context, req: SearchRequest) -> Any:
    return recipe.plan_for(profile(ctx, req.query), req)


def vectors_for(ctx: Context, texts: list[str]) -> dict[str, list[float]]:
    return recipe.query_vectors(ctx.search_reader, profile(ctx, texts[0]), texts)


def retrieve(ctx: Context, req: SearchRequest, plan: Any) -> Any:
    return recipe.retrieve(ctx.search_reader, profile(ctx, req.query), req, plan)


def by_score(found: Sequence[tuple[Memory, float]], above: float = -1e9) -> dict[float, set[str]]:
    """{score: ids}, for the scores above `above`: among equal scores the engine's order is its own in either path."""
    grouped: dict[float, set[str]] = {}
    for memory, score in found:
        if score > above + 1e-6:
            grouped.setdefault(round(score, 5), set()).add(memory.id)
    return grouped


def same_found(new: Sequence[Found], old: Sequence[Found]) -> None:
    """The same weights and scores, and the same points above each list's last score (points tied at the cut may
    be any of the tied ones, as the engine's own cut among them is)."""
    assert [(f.weight, f.flat) for f in new] == [(f.weight, f.flat) for f in old]
    for a, b in zip(new, old, strict=True):
        for mine, theirs in ((a.keyword, b.keyword), (a.dense, b.dense)):
            assert [s for _, s in mine] == pytest.approx([s for _, s in theirs], abs=1e-6)
            cut = min((s for _, s in theirs), default=0.0)
            assert by_score(mine, cut) == by_score(theirs, cut)


def at_the_cut(found: Sequence[Found], pool: int) -> set[str]:
    """Points tied with the last of a full list: which of them make the pool is the engine's choice (it may differ
    with the limit asked), so they may differ between the paths, and so may their fused scores."""
    tied: set[str] = set()
    for f in found:
        for hits in (f.keyword, f.dense):
            if len(hits) == pool:
                tied |= {m.id for m, score in hits if abs(score - hits[-1][1]) < 1e-6}
    return tied


def search_both_ways(ctx: Context, text: str, subject: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = T0 + timedelta(days=30)
    req = SearchRequest(subject=subject, query=text, k=8, now=now)
    plan = recipe.dated(profile(ctx, text), plan_for(ctx, req), text, now)
    vectors = vectors_for(ctx, [text, *(r.text for r in plan.routes if r.strategy == "semantic")])
    tied: set[str] = set()
    for path in (search_reader.run_routes, route_by_route):
        tied |= at_the_cut(path(ctx.store, ctx.settings.ranking.fusion, req, plan.routes, vectors, 50), 50)
    (new, new_fallback, _), (old, old_fallback, _) = retrieve(ctx, req, plan), old_retrieve(ctx, req, plan,
                                                                                           monkeypatch)
    assert new_fallback == old_fallback
    new, old = [c for c in new if c[0].id not in tied], [c for c in old if c[0].id not in tied]
    twentieth = old[min(19, len(old) - 1)][1] if old else 0.0
    assert by_score(new, twentieth) == by_score(old, twentieth)
    ranked = [recipe.ranked(profile(ctx, text), found, now, req.k) for found in (new, old)]
    new_hits, old_hits = ranked
    assert [h.score for h in new_hits] == pytest.approx([h.score for h in old_hits], abs=1e-6)
    assert by_score([(h, h.score) for h in new_hits]) == by_score([(h, h.score) for h in old_hits])


def old_retrieve(ctx: Context, req: SearchRequest, plan: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(search_reader, "run_routes", route_by_route)
        return retrieve(ctx, req, plan)


def test_batched_search_finds_and_ranks_as_route_by_route(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same candidates with the same relevance, same hits with the same scores: for every query, in a subject
    whose scopes are read off the whole subject's candidates and in one whose scopes are searched."""
    for subject in ("wide", "narrow"):
        for text in QUERIES:
            search_both_ways(ctx, text, subject, monkeypatch)


def test_rrf_fusion_searches_route_by_route(ctx: Context) -> None:
    """RRF ranks by position, and the engine orders points of equal score its own way in a batch (even from one
    hybrid query to the next): that mode keeps its one query per route."""
    ctx.settings = ctx.settings.replace(fusion="rrf")
    store = counted(ctx)
    req = SearchRequest(subject="wide", query="Which database does Atlas use?", k=8)
    plan = plan_for(ctx, req)
    retrieve(ctx, req, plan)
    assert store.calls == ["query"] * len(plan.routes)


def test_each_route_finds_what_it_found_alone(ctx: Context) -> None:
    """Candidates route by route, read off or searched: the same lists, scores and weights."""
    for subject in ("wide", "narrow"):
        for text in QUERIES:
            req = SearchRequest(subject=subject, query=text, k=8)
            routes = plan_for(ctx, req).routes
            vectors = vectors_for(ctx, [text, *(r.text for r in routes if r.strategy == "semantic")])
            same_found(search_reader.run_routes(ctx.store, ctx.settings.ranking.fusion, req, routes, vectors, 50),
                       route_by_route(ctx.store, ctx.settings.ranking.fusion, req, routes, vectors, 50))


def test_a_scope_covering_nearly_the_whole_subject_costs_no_second_search(ctx: Context) -> None:
    """"Which database does Atlas use?" searches entities/events/general, a topic key, the names and the whole
    subject: in "wide" the scope holds 92 % of it, so its candidates come from the whole-subject route's."""
    store = counted(ctx)
    req = SearchRequest(subject="wide", query="Which database does Atlas use?", k=8)
    plan = plan_for(ctx, req)
    assert any(r.dirs and r.text == req.query for r in plan.routes) and plan.routes[-1].dirs == []
    retrieve(ctx, req, plan)
    scoped = sum(1 for r in plan.routes if r.dirs and r.text == req.query)
    asked = sum(1 if r.strategy != "semantic" else 2 for r in plan.routes) - 2 * scoped
    assert store.calls == [f"batch of {asked}"]


def test_a_narrow_scope_is_searched_in_a_second_batch(ctx: Context) -> None:
    store = counted(ctx)
    req = SearchRequest(subject="narrow", query="Which database does Atlas use?", k=8)
    retrieve(ctx, req, plan_for(ctx, req))
    assert len(store.calls) == 2 and all(c.startswith("batch") for c in store.calls), store.calls


def test_a_failed_batch_is_searched_route_by_route(ctx: Context) -> None:
    """A batch that fails is asked again one route at a time, where a scoped route's failure is stood in for."""
    req = SearchRequest(subject="wide", query="Which database does Atlas use?", k=8)
    routes = plan_for(ctx, req).routes
    vectors = vectors_for(ctx, [req.query])
    expected = route_by_route(ctx.store, ctx.settings.ranking.fusion, req, routes, vectors, 50)
    store = counted(ctx, fail_batches=True)
    same_found(search_reader.run_routes(store, ctx.settings.ranking.fusion, req, routes, vectors, 50), expected)
    assert store.calls[0].startswith("batch") and set(store.calls[1:]) == {"query"}
