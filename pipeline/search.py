"""One search, start to end: the ranking order (docs/ranking.md), pure.

    plan (the planner's routes, their weights, the period asked) ─▶ what the subject said that is not stored yet
    ─▶ every route's keyword and dense candidates ─▶ fused (keyword ceiling, noise floor, smoothing)
    ─▶ second look at the head ─▶ the other language read by the reranker ─▶ speaker ─▶ holder ─▶ period
    ─▶ relevance × lifecycle, quotas ─▶ the top k, pending memories marked

`search` is that order. What it reads — the store, the encoders, the reranker, the pending layer, a model's plan —
it reads through a `Reader` (shared/search/reader.py); every value it ranks by is one `RankingProfile`
(pipeline/ranking.py), a request's or a dialogue's, chosen once for the search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple, Protocol

from memflow.pipeline.holders import asks_the_assistant
from memflow.pipeline.models import Hit, Memory, Period, QueryPlan, Route, SearchRequest, SearchResult
from memflow.pipeline.pending import Pending, Said, estimated_idf, served
from memflow.pipeline.plan import is_ambiguous, recent_turns
from memflow.pipeline.plan import plan as make_plan
from memflow.pipeline.ranking import RankingProfile
from memflow.pipeline.score import (
    Floor,
    Found,
    Fusion,
    Scored,
    across_languages,
    by_holder,
    by_speaker,
    ceiling,
    confirmed_scopes,
    flat_plan,
    fuse,
    fuse_found,
    in_period,
    judged_across,
    language,
    lifecycle_scores,
    rank,
    reweight,
    second_look,
    to_hit,
    unscoped,
)
from memflow.pipeline.timeref import asked_period
from memflow.pipeline.vectors import summed

Vectors = dict[str, list[float]]
Reread = Callable[[list[Scored]], list[Scored]]


class Reranks(Protocol):
    """A second judge of relevance (shared/inference/reranker.py): how far each text stands above unrelated, for the
    queries."""

    def margins(self, queries: Sequence[str], texts: Sequence[str]) -> list[float]: ...


class PendingCandidates(Protocol):
    """The memories about to be written that one search ranks among the stored ones (shared/search/pending.py)."""

    @property
    def by_id(self) -> Mapping[str, Pending]: ...

    def route(self, route: Route, found: Found) -> Found:
        """A route's candidates, with the pending memories its filter admits."""


class ModelPlan(NamedTuple):
    """A model's plan as it answered (its route weights not applied yet), or, with `error`, the heuristic plan
    that stands in for it (marked `fallback`)."""

    plan: QueryPlan
    error: str | None = None


class Reader(Protocol):
    """What a search reads through (shared/search/reader.py `SearchReader`)."""

    @property
    def reranker(self) -> Reranks | None:
        """The second look's reranker; None when the deployment turns it off."""

    @property
    def failure(self) -> type[Exception]:
        """What the reader raises when it cannot read: the search answers `failed`, never "nothing found"."""

    @property
    def plans(self) -> bool:
        """Whether a model plans ambiguous queries (`model_plan`)."""

    def model_plan(self, req: SearchRequest, heuristic: QueryPlan) -> ModelPlan:
        """A model's plan for an ambiguous query, or the heuristic one when the model does not answer."""

    def said(self, subject: str) -> list[Said]:
        """What the subject said that is not stored yet (none when the layer is off)."""

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """One dense query vector per text."""

    def find(self, req: SearchRequest, routes: Sequence[Route], vectors: Vectors, pool: int,
             fusion: Fusion) -> list[Found]:
        """Every route's candidates from the store, at most `pool` per list."""

    def find_route(self, req: SearchRequest, route: Route, vectors: Vectors, pool: int, fusion: Fusion) -> Found:
        """One route's candidates, searched alone."""

    def pending(self, req: SearchRequest, vectors: Vectors, found: Sequence[Found],
                said: Sequence[Said]) -> PendingCandidates:
        """The memories about to be written from `said` that this search ranks."""

    def noise_floor(self, vector: Sequence[float]) -> Floor:
        """The cosine that counts 0 for a query, per language of the memory (pipeline.score.noise_floor)."""

    def query_terms(self, query: str) -> list[int]:
        """The query's keyword terms, as the store's BM25 reads them."""

    def memory_terms(self, memory: Memory) -> Mapping[int, float]:
        """A memory's BM25 term weights, as the store indexed it."""


@dataclass(frozen=True)
class Searched:
    """What a search found: its plan (and why a model's was not used), the fused candidates, the hits; or the
    error that failed it."""

    plan: QueryPlan
    plan_error: str | None = None
    scored: list[Scored] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    fallback: bool = False
    failed: Exception | None = None

    def result(self, req: SearchRequest) -> SearchResult:
        if self.failed is not None:
            return SearchResult(subject=req.subject, query=req.query, status="failed", plan=self.plan,
                                error=f"{type(self.failed).__name__}: {self.failed}")
        return SearchResult(subject=req.subject, query=req.query, status="ok" if self.hits else "empty",
                            hits=self.hits, plan=self.plan.model_copy(update={"fallback": self.fallback}),
                            fallback=self.fallback)


def search(reader: Reader, profile: RankingProfile, req: SearchRequest, now: datetime) -> Searched:
    """The search `req` asks for, as of `now`, in its ranking order (this module's docstring)."""
    plan, plan_error = planned(reader, profile, req, now)
    try:
        said = reader.said(req.subject)  # before the store is read: what lands in between is found there
        scored, fallback, pending = retrieve(reader, profile, req, plan, said)
    except reader.failure as exc:
        return Searched(plan, plan_error, failed=exc)
    return Searched(plan, plan_error, scored, ranked(profile, scored, now, req.k, pending), fallback)


# -- the plan ---------------------------------------------------------------------------------------------------


def planned(reader: Reader, profile: RankingProfile, req: SearchRequest, now: datetime) -> tuple[QueryPlan,
                                                                                                   str | None]:
    """The plan a search follows, dated (`dated`): a model's for an ambiguous query when one plans (on any error the
    heuristic plan, with why), else the heuristic one (`plan_for`)."""
    heuristic = plan_for(profile, req)
    wanted = reader.plans and profile.intent_planning and req.dirs is None and is_ambiguous(req.query)
    asked = reader.model_plan(req, heuristic) if wanted else None
    if asked is None:
        return dated(profile, heuristic, req.query, now), None
    if asked.error is not None:
        return dated(profile, asked.plan, req.query, now), asked.error
    # A model's plan runs with the profile's route weights and scoping, like the heuristic one: a route they
    # switch off never comes back through a model.
    return dated(profile, routed(profile, asked.plan), req.query, now), None


def plan_for(profile: RankingProfile, req: SearchRequest) -> QueryPlan:
    """The heuristic plan a search follows. Dirs given by the caller win over the planner's."""
    if req.dirs is not None:
        return QueryPlan(intent="caller_scoped", routes=[Route(text=req.query, dirs=req.dirs)])
    if not profile.intent_planning:
        return flat_plan(req.query)
    return routed(profile, make_plan(req.query))


def routed(profile: RankingProfile, plan: QueryPlan) -> QueryPlan:
    """A planner's plan (the rules' or a model's) as the profile runs it: its route weights (a route weighted 0 is
    dropped) and, with dir scoping off, no route scoped to dirs."""
    plan = reweight(plan, whole_subject=profile.whole_subject_weight, exact_match=profile.exact_match_weight,
                    bm25=profile.bm25_route_weight, topic=profile.topic_route_weight)
    return plan if profile.dir_scoping else unscoped(plan)


def dated(profile: RankingProfile, plan: QueryPlan, query: str, now: datetime) -> QueryPlan:
    """The plan with the period the query asks about, if it names one and the profile boosts periods (a dialogue's
    does not: its time words are the story told, docs/ranking.md#periods)."""
    if profile.period_boost <= 0:
        return plan
    ref = asked_period(query, now)
    if ref is None:
        return plan
    return plan.model_copy(update={"period": Period(start=ref.start, end=ref.end, label=ref.label)})


# -- the candidates ---------------------------------------------------------------------------------------------


class Retrieved(NamedTuple):
    scored: list[Scored]
    fallback: bool
    pending: Mapping[str, Pending]


@dataclass(frozen=True)
class Scales:
    """How much the dense side counts in this search and the cosine that counts 0; the BM25 score that counts
    at least 1 (what the question's own terms could score, × the profile's share)."""

    weight: float
    floor: Floor
    keyword_ceiling: float = 0.0


def retrieve(reader: Reader, profile: RankingProfile, req: SearchRequest, plan: QueryPlan,
             said: Sequence[Said] = ()) -> Retrieved:
    """Run every route of the plan within the subject and fuse them (route weights), with the memories about
    to be written from what the subject said (`said`, read before the store) ranked among them.

    When every scoped route comes back empty (or fails), the whole subject answers alone
    and the search says `fallback`: a misrouted query never turns into "nothing".
    """
    pool = max(profile.candidate_pool, req.k * 4)
    vectors = query_vectors(reader, profile, [req.query, *(r.text for r in plan.routes if r.strategy == "semantic")])
    found = reader.find(req, plan.routes, vectors, pool, profile.fusion)
    layer = reader.pending(req, vectors, found, said)
    ranked = [(route, layer.route(route, f)) for route, f in zip(plan.routes, found, strict=True)]
    floor = profile.dense_floor if profile.dense_floor is not None else reader.noise_floor(vectors[req.query])
    ceiling_score = keyword_ceiling_for(reader, profile, req.query, [f for route, f in ranked
                                                                     if route.text == req.query])
    dense = Scales(profile.dense_weight, floor, ceiling_score)
    looked = after_fusion(reader.reranker, profile, req.query, plan)
    scoped = [found for route, found in ranked if route.dirs]
    whole = next((found for route, found in ranked if route == Route(text=req.query, weight=route.weight)),
                 None)  # the plan's own whole-subject route, when it has one: no need to search twice
    if scoped and all(found.empty for found in scoped):
        if whole is None:
            alone = Route(text=req.query)
            whole = layer.route(alone, reader.find_route(req, alone, vectors, pool, profile.fusion))
        return Retrieved(_fused(profile, [replace(whole, weight=1.0)], dense, plan, looked), True, layer.by_id)
    return Retrieved(_fused(profile, _confirmed(profile, ranked, whole, dense), dense, plan, looked), False,
                     layer.by_id)


def query_vectors(reader: Reader, profile: RankingProfile, texts: list[str]) -> Vectors:
    """{text: its dense query vector}, from one encode call for every text a dense route needs (sparse
    routes need none). A dialogue's vector is the sum of its whole text's and its last turns'
    (`recent_turns`): a cosine with it ranks as the sum of the two cosines."""
    texts = list(dict.fromkeys(texts))
    recent = {t: r for t in texts if (r := recent_turns(t, profile.recent_turns))}
    asked = list(dict.fromkeys([*texts, *recent.values()]))
    encoded = dict(zip(asked, reader.encode_queries(asked), strict=True))
    return {t: summed([encoded[t], encoded[recent[t]]]) if t in recent else encoded[t] for t in texts}


def keyword_ceiling_for(reader: Reader, profile: RankingProfile, query: str, found: Sequence[Found]) -> float:
    """What a memory holding each of the query's terms once would score (pipeline.score.ceiling) × the profile's
    share, from the IDFs the store applied to its keyword hits (`estimated_idf`)."""
    share = profile.keyword_ceiling
    if share <= 0:
        return 0.0
    hits = [(reader.memory_terms(m), score) for f in found for m, score in f.keyword]
    if not hits:
        return 0.0
    return share * ceiling(estimated_idf(reader.query_terms(query), hits))


# -- the ranking ------------------------------------------------------------------------------------------------


def _fused(profile: RankingProfile, found: list[Found], dense: Scales, plan: QueryPlan,
           looked: Reread = lambda fused: fused) -> list[Scored]:
    """The routes' candidates as one list (`fusion`), read again (`looked`: `after_fusion`), then weighed by holder
    and by the period asked."""
    if profile.fusion == "rrf":
        fused = fuse([(f.weight, f.keyword) for f in found], "rrf")
    else:
        fused = fuse_found(found, dense_weight=dense.weight, dense_floor=dense.floor,
                           smoothing=profile.context_smoothing, keyword_ceiling=dense.keyword_ceiling)
    fused = by_holder(looked(fused), plan.about, profile.holder_mismatch)
    return in_period(fused, plan.period, profile.period_boost)


def _confirmed(profile: RankingProfile, ranked: list[tuple[Route, Found]], whole: Found | None,
               dense: Scales) -> list[Found]:
    found = [f for _, f in ranked]
    if whole is None or profile.scope_min_share <= 0:
        return found
    return confirmed_scopes(found, [bool(route.dirs) and not route.keys for route, _ in ranked],
                            next(i for i, f in enumerate(found) if f is whole),
                            min_share=profile.scope_min_share, dense_weight=dense.weight,
                            dense_floor=dense.floor, keyword_ceiling=dense.keyword_ceiling)


def after_fusion(reranker: Reranks | None, profile: RankingProfile, query: str, plan: QueryPlan) -> Reread:
    """What a search makes of its fused list before holders and periods: the head judged again
    (`second_look_for`), a request's candidates in the other language read by the reranker (`across_for`), and
    the assistant's turns weighed for a request about someone (pipeline.score.by_speaker)."""
    looked, across = second_look_for(reranker, profile, query, plan), across_for(reranker, profile, query)
    to_assistant = asks_the_assistant(query)

    def reread(fused: list[Scored]) -> list[Scored]:
        return by_speaker(across(looked(fused)), plan.about, to_assistant, profile.assistant_turn)
    return reread


def second_look_for(reranker: Reranks | None, profile: RankingProfile, query: str, plan: QueryPlan) -> Reread:
    """The fused list with its head judged again (pipeline.score.second_look), or as it is when the profile gives
    the second look no weight.

    A request is judged again only when it asks about the user or someone in the user's life (the plan's `about`):
    "What sport do I practice?" is answered by a statement said in any words, "What did Caroline research?" by
    the one that names Caroline and research, which the reranker weighs no more than any other word (judging every
    request cost LoCoMo, whose questions name third parties, 10 points of R@5). A dialogue is judged by its last
    turns: what is asked now, in sentences of the length the reranker was trained on (the whole text as well cost
    MADial zh .02 of R@5; the first pass reads the whole)."""
    weight = profile.second_look_weight
    if reranker is None or weight <= 0 or (profile.second_look_needs_about and plan.about is None):
        return lambda fused: fused
    asked = [recent_turns(query, profile.recent_turns) or query]

    def looked(fused: list[Scored]) -> list[Scored]:
        head = fused[:profile.second_look_depth]
        return second_look(fused, reranker.margins(asked, [m.content for m, _ in head]), weight)
    return looked


def across_for(reranker: Reranks | None, profile: RankingProfile, query: str) -> Reread:
    """The fused list with its candidates in the other language read by the reranker as well
    (pipeline.score.across_languages). A dialogue's profile gives this no weight: its head is judged by the
    second look already."""
    if reranker is None or profile.cross_language_weight <= 0:
        return lambda fused: fused
    asked_in = language(query)

    def across(fused: list[Scored]) -> list[Scored]:
        judged = judged_across(fused, asked_in, profile.second_look_depth)
        margins = reranker.margins([query], [fused[i][0].content for i in judged]) if judged else []
        return across_languages(fused, judged, margins, asked_in, profile.cross_language_weight)
    return across


def ranked(profile: RankingProfile, scored: list[Scored], now: datetime, k: int,
           pending: Mapping[str, Pending] | None = None) -> list[Hit]:
    """The top k of the fused candidates, scored and chosen as the profile says; pending ones marked, each
    pending correction above what it corrects (`pipeline.pending.served`)."""
    lifecycle = profile.lifecycle()
    hits = rank(scored, now, k, lifecycle, collapse=profile.collapse_records)
    if not pending:
        return hits
    relevance = dict((m.id, r) for m, r in scored)
    return served(hits, pending, lambda p: to_hit(p.memory, lifecycle_scores(
        p.memory, relevance.get(p.memory.id, 0.0), now, lifecycle)), k)
