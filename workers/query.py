"""The query worker: search, pack, forget, inspect, feedback and the maintenance calls, as RQ jobs.

It runs as an RQ `SimpleWorker` (no fork per job: forking a process that holds torch
deadlocks, and the model and the store are loaded once). Every call is an RPC of the table in
`shared.rpc`: one entry point (`serve`) validates the job's request and hands it, with this
worker's context, to the call's handler; the reply goes back as JSON (RQ's JSONSerializer),
validated by its model.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, NamedTuple, cast

import numpy as np
import redis
from numpy.typing import NDArray
from pydantic import TypeAdapter
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.worker.base import StopRequested  # type: ignore[attr-defined]

from memflow.pipeline import llm_plan
from memflow.pipeline.gate import gate, redact
from memflow.pipeline.holders import asks_the_assistant
from memflow.pipeline.models import (
    SEARCHABLE_STATUSES,
    Hit,
    Memory,
    PackedPrompt,
    Period,
    QueryPlan,
    Route,
    SearchRequest,
    SearchResult,
    Trace,
)
from memflow.pipeline.pack import pack as build_prompt
from memflow.pipeline.pending import Said, estimated_idf, served
from memflow.pipeline.plan import is_ambiguous, is_transcript, recent_turns
from memflow.pipeline.plan import plan as make_plan
from memflow.pipeline.profile import ProfileReply
from memflow.pipeline.score import (
    Floor,
    Found,
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
from memflow.shared import metrics, pending, profiles, sparse
from memflow.shared.backlog import backlog
from memflow.shared.codec import decode, encode
from memflow.shared.embedder import Embedder, summed
from memflow.shared.errors import InvalidInput, MemflowError, NotFound, Retryable, StoreUnavailable
from memflow.shared.foreground import frozen_heap
from memflow.shared.judge import Judge, floors_by_language
from memflow.shared.keys import STAGES, Keys
from memflow.shared.llm import LLM, Reading
from memflow.shared.llm import usage as llm_usage
from memflow.shared.pending_search import Shown, about_to_be_written, with_pending
from memflow.shared.rpc import (
    EXPORT,
    FEEDBACK,
    FORGET,
    HEALTH,
    HISTORY,
    IMPORT,
    INSPECT,
    PACK,
    PROFILE,
    REVIEW_DECIDE,
    REVIEW_LIST,
    ROLLBACK,
    RUN_JOB,
    SEARCH,
    SUBJECTS,
    VERIFY_FORGOTTEN,
    WORKERS_MODULE,
    Adopted,
    ExportedSubject,
    ExportRequest,
    FeedbackRequest,
    ForgetProof,
    ForgetReport,
    ForgetRequest,
    Health,
    HealthRequest,
    History,
    HistoryRequest,
    Imported,
    ImportRequest,
    InspectReport,
    InspectRequest,
    JobReport,
    PackRequest,
    ProfileRequest,
    Rep,
    Req,
    ReviewDecideRequest,
    ReviewDecision,
    ReviewList,
    ReviewListRequest,
    RollbackReport,
    RollbackRequest,
    Rpc,
    RunJobRequest,
    SubjectList,
    SubjectsRequest,
    VerifyRequest,
    request_of,
)
from memflow.shared.settings import Fusion, PendingSettings, RankingSettings, Settings
from memflow.shared.status import Traces
from memflow.shared.store import MemoryFilter, Query, SearchMode, Store, admits, narrowed
from memflow.shared.store import Scored as StoreScored
from memflow.shared.uses import Uses
from memflow.workers import forgetting, jobs, ops, transfer
from memflow.workers.runtime import Context

log = logging.getLogger(__name__)
# What a call raises for its caller's mistake: answered to the caller, no error of the worker's.
ANSWERED = (NotFound, InvalidInput)


# -- search ------------------------------------------------------------------


def search(ctx: Context, req: SearchRequest) -> SearchResult:
    now = req.now or datetime.now(UTC)
    started = time.perf_counter()
    plan, plan_error = deep_plan(ctx.llm, PlanCache.of(ctx), ctx.settings, req, plan_for(ctx.settings, req))
    plan = dated(ctx.settings, plan, req.query, now)
    try:
        # before the store is read: what lands in between is found there
        said = pending_of(ctx.settings.pending, ctx.client, ctx.keys, req.subject)
        scored, fallback, shown = retrieve(Retrieval.of(ctx), req, plan, said)
        hits = ranked(ctx.settings, scored, now, req.k, shown)
        result = SearchResult(subject=req.subject, query=req.query, status="ok" if hits else "empty", hits=hits,
                              plan=plan.model_copy(update={"fallback": fallback}), fallback=fallback)
    except MemflowError as exc:
        scored, result = [], SearchResult(subject=req.subject, query=req.query, status="failed", plan=plan,
                                          error=f"{type(exc).__name__}: {exc}")
    result.latency_ms = (time.perf_counter() - started) * 1000
    record_trace(ctx.traces, ops.UtilisationCounters(ctx.client, ctx.keys), req, result, scored, now, plan_error)
    return result


def plan_for(settings: Settings, req: SearchRequest) -> QueryPlan:
    """The plan a search follows. Dirs given by the caller win over the planner's."""
    if req.dirs is not None:
        return QueryPlan(intent="caller_scoped", routes=[Route(text=req.query, dirs=req.dirs)])
    if not settings.ranking.intent_planning:
        return flat_plan(req.query)
    return routed(settings, make_plan(req.query))


def routed(settings: Settings, plan: QueryPlan) -> QueryPlan:
    """A planner's plan (the rules' or a model's) as the settings run it: their route weights (a route
    weighted 0 is dropped) and, with dir scoping off, no route scoped to dirs."""
    weights = settings.ranking
    plan = reweight(plan, whole_subject=weights.whole_subject_weight, exact_match=weights.exact_match_weight,
                    bm25=weights.bm25_route_weight, topic=weights.topic_route_weight)
    return plan if settings.ranking.dir_scoping else unscoped(plan)


def dated(settings: Settings, plan: QueryPlan, query: str, now: datetime) -> QueryPlan:
    """The plan with the period a request asks about, if it names one.

    Not for a dialogue handed over as the query: its time words are the story being told ("我去年
    夏天发现了一个乒乓球"), not the scope of a question, and its "去年" is relative to a day the
    search does not know. Measured: the one MADial dialogue whose last turns named a period
    (2023) lost its memory (from 2022) to memories of 2023 boosted past it."""
    if settings.ranking.period_boost <= 0 or is_transcript(query):
        return plan
    ref = asked_period(query, now)
    if ref is None:
        return plan
    return plan.model_copy(update={"period": Period(start=ref.start, end=ref.end, label=ref.label)})


@dataclass(frozen=True)
class PlanCache:
    """The LLM's plans, per subject and normalised query (`Keys.plan_cache`), each kept `ttl_s`."""

    client: redis.Redis
    keys: Keys
    ttl_s: int

    @classmethod
    def of(cls, ctx: Context) -> PlanCache:
        return cls(ctx.client, ctx.keys, ctx.settings.llm.plan_cache_ttl_s)

    def _key(self, subject: str, query: str) -> str:
        return self.keys.plan_cache(subject, hashlib.sha256(llm_plan.cache_key(query).encode()).hexdigest()[:32])

    def get(self, subject: str, query: str) -> QueryPlan | None:
        cached = self.client.get(self._key(subject, query))
        return None if cached is None else decode(cached, QueryPlan)

    def put(self, subject: str, query: str, plan: QueryPlan) -> None:
        self.client.set(self._key(subject, query), encode(plan), ex=self.ttl_s)


def deep_plan(llm: LLM | None, cache: PlanCache, settings: Settings, req: SearchRequest,
              heuristic: QueryPlan) -> tuple[QueryPlan, str | None]:
    """The LLM's plan for an ambiguous query (cached per subject and normalised query), else the heuristic
    one; on any error the heuristic plan with `fallback` set, and why.

    The cache keeps the model's plan as it answered: the settings' route weights and scoping apply
    each time it is used (`routed`), so a route they switch off never comes back through a model."""
    wanted = settings.llm.plan and settings.ranking.intent_planning and req.dirs is None
    if llm is None or not wanted or not is_ambiguous(req.query):
        return heuristic, None
    cached = cache.get(req.subject, req.query)
    if cached is not None:
        return routed(settings, cached), None
    asked = llm.ask(req.subject, "plan", llm_plan.prompt(req.query), timeout=settings.llm.plan_timeout_s,
                    read=lambda text: _plan_read(text, heuristic),
                    fallback=lambda: Reading(heuristic.model_copy(update={"fallback": True})))
    if asked.fallback is not None:
        return asked.value, asked.fallback
    cache.put(req.subject, req.query, asked.value)
    return routed(settings, asked.value), None


def _plan_read(reply: str, heuristic: QueryPlan) -> Reading[QueryPlan]:
    plan = llm_plan.read_reply(reply, heuristic)
    return Reading(plan, items=len(plan.routes))


def ranked(settings: Settings, scored: list[Scored], now: datetime, k: int, shown: Shown | None = None) -> list[Hit]:
    """The top k of the fused candidates, scored and chosen as the settings say; pending ones marked, each
    pending correction above what it corrects (`pipeline.pending.served`)."""
    lifecycle = settings.ranking.lifecycle(settings.lifecycle.decay_tau_hours)
    hits = rank(scored, now, k, lifecycle, collapse=settings.ranking.collapse_records)
    if not shown:
        return hits
    relevance = dict((m.id, r) for m, r in scored)
    return served(hits, shown.by_id, lambda p: to_hit(p.memory, lifecycle_scores(
        p.memory, relevance.get(p.memory.id, 0.0), now, lifecycle)), k)


def pending_of(layer: PendingSettings, client: redis.Redis, keys: Keys, subject: str) -> list[Said]:
    """What the subject said that is not stored yet (shared/pending.py); none when the layer is off. A layer
    that cannot be read fails the search, as a store that cannot be read does: never a silent "not known"."""
    if not layer.enabled:
        return []
    try:
        return pending.read(client, keys, subject)
    except redis.RedisError as exc:
        raise Retryable(f"the pending layer could not be read: {exc}") from exc


# Pending memories decided per search beyond the k asked for, by meaning and by words each (pending_search):
# each one decided costs its comparisons with every stored memory around it.
PENDING_SPARE = 2


@dataclass(frozen=True)
class Retrieval:
    """What a search reads the store with: the settings (ranking, and the write path's duplicate threshold for the
    pending memories), the store, the embedder of its questions, the second look's judge (None: off), and the
    unrelated passages its noise floor is measured against (measured when first asked for)."""

    settings: Settings
    store: Store
    embedder: Embedder
    judge: Judge | None
    unrelated: Callable[[], NDArray[np.float64]]

    @classmethod
    def of(cls, ctx: Context) -> Retrieval:
        return cls(ctx.settings, ctx.store, ctx.embedder, ctx.judge, lambda: ctx.unrelated)


class Retrieved(NamedTuple):
    scored: list[Scored]
    fallback: bool
    shown: Shown


def retrieve(reader: Retrieval, req: SearchRequest, plan: QueryPlan, said: Sequence[Said] = ()) -> Retrieved:
    """Run every route of the plan within the subject and fuse them (route weights), with the memories about
    to be written from what the subject said (`said`, read before the store) ranked among them.

    When every scoped route comes back empty (or fails), the whole subject answers alone
    and the search says `fallback`: a misrouted query never turns into "nothing".
    """
    settings, store, ranking = reader.settings, reader.store, reader.settings.ranking
    pool = max(ranking.candidate_pool, req.k * 4)
    vectors = query_vectors(reader.embedder, ranking, [req.query, *(r.text for r in plan.routes
                                                                      if r.strategy == "semantic")])
    found = run_routes(store, ranking.fusion, req, plan.routes, vectors, pool)
    layer = PendingRoutes.of(reader.embedder, settings.write.duplicate_threshold, req, vectors, found, said)
    ranked = [(route, layer.route(route, f)) for route, f in zip(plan.routes, found, strict=True)]
    floor: Floor = ranking.dense_floor if ranking.dense_floor is not None else \
        floors_by_language(reader.unrelated(), vectors[req.query])
    ceiling_score = keyword_ceiling_for(settings, req.query, [f for route, f in ranked if route.text == req.query])
    dense = Scales(dense_weight_for(settings, req.query), floor, ceiling_score)
    looked = after_fusion(reader.judge, ranking, req.query, plan)
    scoped = [found for route, found in ranked if route.dirs]
    whole = next((found for route, found in ranked if route == Route(text=req.query, weight=route.weight)),
                 None)  # the plan's own whole-subject route, when it has one: no need to search twice
    if scoped and all(found.empty for found in scoped):
        if whole is None:
            whole = layer.route(Route(text=req.query),
                                _run_route(store, ranking.fusion, req, Route(text=req.query), vectors, pool))
        return Retrieved(_fused(settings, [replace(whole, weight=1.0)], dense, plan, looked), True, layer.shown)
    return Retrieved(_fused(settings, _confirmed(settings, ranked, whole, dense), dense, plan, looked), False,
                     layer.shown)


@dataclass(frozen=True)
class PendingRoutes:
    """The pending memories one search ranks (`shared.pending_search`), added to each route's candidates."""

    req: SearchRequest
    vectors: dict[str, list[float]]
    shown: Shown

    @classmethod
    def of(cls, embedder: Embedder, duplicate_threshold: float, req: SearchRequest, vectors: dict[str, list[float]],
           found: Sequence[Found], said: Sequence[Said]) -> PendingRoutes:
        shown = about_to_be_written(said, req.subject, found, embedder, query=req.query,
                                    query_vector=vectors[req.query], keep=req.k + PENDING_SPARE,
                                    duplicate_threshold=duplicate_threshold) if said else Shown()
        return cls(req, vectors, shown)

    def route(self, route: Route, found: Found) -> Found:
        """A route's candidates, with the pending memories its filter admits."""
        if not self.shown:
            return found
        admitted = [p for p in self.shown.by_id.values() if admits(route_filter(self.req, route), p.memory)]
        dense = self.vectors.get(route.text) if route.strategy == "semantic" else None
        return with_pending(found, route.text, dense, admitted, self.shown.vectors)


class Scales(NamedTuple):
    """How much the dense side counts in this search and the cosine that counts 0; the BM25 score that counts
    at least 1 (what the question's own terms could score, × the settings' share)."""

    weight: float
    floor: Floor
    keyword_ceiling: float = 0.0


def keyword_ceiling_for(settings: Settings, query: str, found: Sequence[Found]) -> float:
    """What a memory holding each of the query's terms once would score (pipeline.score.ceiling) × the settings'
    share for a request or a dialogue, from the IDFs the store applied to its keyword hits (`estimated_idf`)."""
    share = settings.ranking.dialogue_keyword_ceiling if is_transcript(query) else settings.ranking.keyword_ceiling
    hits = [(sparse.memory_terms(m), score) for f in found for m, score in f.keyword]
    if share <= 0 or not hits:
        return 0.0
    terms, _ = sparse.embed_query(query)
    return share * ceiling(estimated_idf(terms, hits))


def dense_weight_for(settings: Settings, query: str) -> float:
    """A conversation handed over as the query leans on meaning; a request on its words.

    A request's words were chosen to ask (LoCoMo's questions share them with the evidence: BM25
    alone is within a few points of the fusion); a dialogue's are mostly small talk around what
    it is about, so keyword evidence is diluted and meaning carries the recall. Measured: MADial
    (dialogues) is best at 1.5, LoCoMo (questions) lost 2 points of R@5 from 1.0 to 1.5 (bench/RESULTS.md).
    """
    return settings.ranking.dialogue_dense_weight if is_transcript(query) else settings.ranking.dense_weight


def query_vectors(embedder: Embedder, ranking: RankingSettings, texts: list[str]) -> dict[str, list[float]]:
    """{text: its dense query vector}, from one encode call for every text a dense route needs (sparse
    routes need none). A dialogue's vector is the sum of its whole text's and its last turns'
    (`recent_turns`): a cosine with it ranks as the sum of the two cosines."""
    texts = list(dict.fromkeys(texts))
    recent = {t: r for t in texts if (r := recent_turns(t, ranking.recent_turns))}
    asked = list(dict.fromkeys([*texts, *recent.values()]))
    encoded = dict(zip(asked, embedder.encode_queries(asked), strict=True))
    return {t: summed([encoded[t], encoded[recent[t]]]) if t in recent else encoded[t] for t in texts}


def _confirmed(settings: Settings, ranked: list[tuple[Route, Found]], whole: Found | None,
               dense: Scales) -> list[Found]:
    found = [f for _, f in ranked]
    if whole is None or settings.ranking.scope_min_share <= 0:
        return found
    return confirmed_scopes(found, [bool(route.dirs) and not route.keys for route, _ in ranked],
                            next(i for i, f in enumerate(found) if f is whole),
                            min_share=settings.ranking.scope_min_share, dense_weight=dense.weight,
                            dense_floor=dense.floor, keyword_ceiling=dense.keyword_ceiling)


def second_look_for(judge: Judge | None, ranking: RankingSettings, query: str,
                    plan: QueryPlan) -> Callable[[list[Scored]], list[Scored]]:
    """The fused list with its head judged again (pipeline.score.second_look), or as it is when the settings turn
    the second look off.

    A request is judged again only when it asks about the user or someone in the user's life (the plan's `about`):
    "What sport do I practice?" is answered by a statement said in any words, "What did Caroline research?" by
    the one that names Caroline and research, which the judge weighs no more than any other word (judging every
    request cost LoCoMo, whose questions name third parties, 10 points of R@5). A dialogue is judged by its last
    turns: what is asked now, in sentences of the length the judge was trained on (the whole text as well cost
    MADial zh .02 of R@5; the first pass reads the whole)."""
    dialogue = is_transcript(query)
    weight = ranking.dialogue_second_look_weight if dialogue else ranking.second_look_weight
    if judge is None or weight <= 0 or (not dialogue and plan.about is None):
        return lambda fused: fused
    asked = [recent_turns(query, ranking.recent_turns) or query]

    def looked(fused: list[Scored]) -> list[Scored]:
        head = fused[:ranking.second_look_depth]
        return second_look(fused, judge.margins(asked, [m.content for m, _ in head]), weight)
    return looked


Reread = Callable[[list[Scored]], list[Scored]]


def after_fusion(judge: Judge | None, ranking: RankingSettings, query: str, plan: QueryPlan) -> Reread:
    """What a search makes of its fused list before holders and periods: the head judged again
    (`second_look_for`), a request's candidates in the other language read by the judge (`across_for`), and
    the assistant's turns weighed for a request about someone (pipeline.score.by_speaker)."""
    looked, across = second_look_for(judge, ranking, query, plan), across_for(judge, ranking, query)
    to_assistant = asks_the_assistant(query)

    def reread(fused: list[Scored]) -> list[Scored]:
        return by_speaker(across(looked(fused)), plan.about, to_assistant, ranking.assistant_turn)
    return reread


def across_for(judge: Judge | None, ranking: RankingSettings, query: str) -> Reread:
    """The fused list with a request's candidates in the other language read by the judge as well
    (pipeline.score.across_languages). A dialogue's head is judged by the second look already."""
    if judge is None or ranking.cross_language_weight <= 0 or is_transcript(query):
        return lambda fused: fused
    asked_in = language(query)

    def across(fused: list[Scored]) -> list[Scored]:
        judged = judged_across(fused, asked_in, ranking.second_look_depth)
        margins = judge.margins([query], [fused[i][0].content for i in judged]) if judged else []
        return across_languages(fused, judged, margins, asked_in, ranking.cross_language_weight)
    return across


def _fused(settings: Settings, found: list[Found], dense: Scales, plan: QueryPlan,
           looked: Callable[[list[Scored]], list[Scored]] = lambda fused: fused) -> list[Scored]:
    if settings.ranking.fusion == "rrf":
        fused = fuse([(f.weight, f.keyword) for f in found], "rrf")
    else:
        fused = fuse_found(found, dense_weight=dense.weight, dense_floor=dense.floor,
                           smoothing=settings.ranking.context_smoothing, keyword_ceiling=dense.keyword_ceiling)
    fused = by_holder(looked(fused), plan.about, settings.ranking.holder_mismatch)
    return in_period(fused, plan.period, settings.ranking.period_boost)


# The whole-subject route fetches this many times the pool when a scoped route may be read off its candidates:
# a scope holding at least 1/WIDEN of the subject then finds a pool's worth among them (store.narrowed).
WIDEN = 1.5


def run_routes(store: Store, fusion: Fusion, req: SearchRequest, routes: Sequence[Route],
               vectors: dict[str, list[float]], pool: int) -> list[Found]:
    """Every route's raw candidates, as `_run_route` finds them, from one engine call (`Store.query_many`);
    a second one only for scoped routes whose candidates the whole-subject route's could not answer.

    "rrf" fusion runs route by route: it ranks by position, and the engine orders points of equal score
    differently in a batch than alone. When the store fails, route by route too: a scoped route's failure is
    stood in for, the whole-subject route's fails the search."""
    if fusion == "score":
        try:
            return _batched(store, req, routes, vectors, pool)
        except StoreUnavailable:
            log.warning("a batched search failed; its routes are searched one by one")
    return [_run_route(store, fusion, req, route, vectors, pool) for route in routes]


def _batched(store: Store, req: SearchRequest, routes: Sequence[Route], vectors: dict[str, list[float]],
             pool: int) -> list[Found]:
    searches = [_searches(req, route, vectors, pool) for route in routes]
    whole = next((i for i, r in enumerate(routes) if r == Route(text=req.query, weight=r.weight)), None)
    narrow = [i for i, r in enumerate(routes) if whole is not None and i != whole and _reads_off(r, req)]
    if whole is None or not narrow:
        answers = _ask(store, dict(enumerate(searches)))
        return [_found(route, answers[i]) for i, route in enumerate(routes)]
    searches[whole] = [replace(q, limit=math.ceil(pool * WIDEN)) for q in searches[whole]]
    answers = _ask(store, {i: queries for i, queries in enumerate(searches) if i not in narrow})
    read = {i: _read_off(searches[whole], answers[whole], searches[i]) for i in narrow}
    answers |= {i: lists for i, lists in read.items() if lists is not None}
    answers |= _ask(store, {i: searches[i] for i, lists in read.items() if lists is None})
    answers[whole] = [found[:pool] for found in answers[whole]]  # its own candidates: the pool, as before
    return [_found(route, answers[i]) for i, route in enumerate(routes)]


def _reads_off(route: Route, req: SearchRequest) -> bool:
    """Whether `route` searches what the whole-subject route does within dirs, so that its candidates may be read
    off the whole subject's. Not a topic-key route: a topic holds a few memories, so it is searched at once."""
    return bool(route.dirs) and not route.keys and route.text == req.query and route.strategy in ("semantic", "bm25")


def route_filter(req: SearchRequest, route: Route) -> MemoryFilter:
    """What one route may find: the subject's searchable memories within the route's dirs and keys."""
    return MemoryFilter(req.subject, dirs=route.dirs or None, statuses=SEARCHABLE_STATUSES, mtypes=req.mtypes,
                        keys=route.keys or None, abouts=None if req.about is None else [req.about])


def _searches(req: SearchRequest, route: Route, vectors: dict[str, list[float]], limit: int) -> list[Query]:
    """The store queries of one route: its keyword list, and its dense list if it searches by meaning."""
    flt = route_filter(req, route)
    dense = vectors.get(route.text) if route.strategy == "semantic" else None
    keyword = Query(flt, "sparse", limit, text=route.text)
    return [keyword] if dense is None else [keyword, Query(flt, "dense", limit, dense=dense)]


def _ask(store: Store, asked: dict[int, list[Query]]) -> dict[int, list[list[StoreScored]]]:
    """Every route's queries in one engine call; each route's answers, by route."""
    flat = [(i, q) for i, queries in asked.items() for q in queries]
    answers: dict[int, list[list[StoreScored]]] = {i: [] for i in asked}
    for (i, _), found in zip(flat, store.query_many([q for _, q in flat]) if flat else [], strict=True):
        answers[i].append(found)
    return answers


def _read_off(wide: list[Query], found: list[list[StoreScored]], wanted: list[Query]) -> list[list[StoreScored]] | None:
    """The answers to `wanted` (a scoped route's queries) read off the whole-subject route's (`wide`, `found`),
    or None unless every one of them is certain (store.narrowed)."""
    by_mode = {q.mode: (q, hits) for q, hits in zip(wide, found, strict=True)}
    read = [narrowed(by_mode[q.mode][1], q.flt, q.limit, complete=len(by_mode[q.mode][1]) < by_mode[q.mode][0].limit)
            for q in wanted]
    return None if any(lists is None for lists in read) else [lists for lists in read if lists is not None]


def _found(route: Route, answers: list[list[StoreScored]]) -> Found:
    keyword, *dense = [[(hit.memory, hit.score) for hit in found] for found in answers]
    return Found(route.weight, keyword, dense[0] if dense else [], flat=bool(route.keys))


def _run_route(store: Store, fusion: Fusion, req: SearchRequest, route: Route, vectors: dict[str, list[float]],
               pool: int) -> Found:
    """One route's raw candidates (in "rrf" mode: the engine's fused list, as `keyword`)."""
    flt = route_filter(req, route)
    dense = vectors.get(route.text) if route.strategy == "semantic" else None
    try:
        if fusion == "rrf" and dense is not None:
            return Found(route.weight, _query(store, flt, "hybrid", route.text, dense, pool))
        meaning = _query(store, flt, "dense", None, dense, pool) if dense is not None else []
        return Found(route.weight, _query(store, flt, "sparse", route.text, None, pool), meaning, flat=bool(route.keys))
    except StoreUnavailable:
        if not route.dirs:
            raise
        log.warning("route %s over %s failed; the whole-subject route stands in", route.strategy, route.dirs)
        return Found(route.weight)


def _query(store: Store, flt: MemoryFilter, mode: SearchMode, text: str | None, dense: list[float] | None,
           pool: int) -> list[Scored]:
    return [(s.memory, s.score) for s in store.query(flt, mode=mode, dense=dense, text=text, limit=pool)]


def record_trace(traces: Traces, utilisation: ops.UtilisationCounters, req: SearchRequest, result: SearchResult,
                 scored: list[tuple[Memory, float]], now: datetime, plan_error: str | None = None) -> None:
    plan = result.plan
    dirs = sorted({d.value for route in plan.routes for d in route.dirs}) if plan else []
    trace = Trace(subject=req.subject, query=redact(req.query)[:200], intent=plan.intent if plan else "",
                  source=plan.source if plan else "heuristic", dirs=dirs,
                  candidates=_candidates(scored, result),
                  chosen=[h.id for h in result.hits], fallback=result.fallback or bool(plan and plan.fallback),
                  status=result.status, error=result.error, latency_ms=result.latency_ms, now=now,
                  plan_error=plan_error, period=plan.period.label if plan and plan.period else None)
    # The trace, the latency histogram (GET /metrics) and the subject's use go to Redis in one round trip.
    pipe = traces.client.pipeline(transaction=False)
    traces.add(trace, via=pipe)
    metrics.record_search(pipe, traces.keys, result.status, result.latency_ms / 1000)
    utilisation.count(req.subject, now, recalled=len(result.hits), via=pipe)
    traced = pipe.execute()[0]  # the trace's id in the feed: indexed under its subject (bounded)
    traces.remember(req.subject, traced)


def _candidates(scored: list[tuple[Memory, float]], result: SearchResult) -> list[dict[str, Any]]:
    """The top fused candidates with their relevance, and every chosen one (a reserved place may go to a
    memory below the top 20) with every factor of its score."""
    factors = {h.id: {name: round(v, 6) for name, v in h.scores.items()} for h in result.hits}
    shown = [(m, score) for i, (m, score) in enumerate(scored) if i < 20 or m.id in factors]
    return [{"id": m.id, "score": round(score, 6), **factors.get(m.id, {})} for m, score in shown]


def pack(ctx: Context, req: PackRequest) -> PackedPrompt:
    """A prompt for `query`; packing counts as adoption of every memory it used."""
    when = req.now or datetime.now(UTC)
    search_req = SearchRequest(subject=req.subject, query=req.query, k=20, now=when)
    asked = deep_plan(ctx.llm, PlanCache.of(ctx), ctx.settings, search_req, plan_for(ctx.settings, search_req))[0]
    plan = dated(ctx.settings, asked, req.query, when)
    said = pending_of(ctx.settings.pending, ctx.client, ctx.keys, req.subject)
    scored, _, shown = retrieve(Retrieval.of(ctx), search_req, plan, said)
    hits = ranked(ctx.settings, scored, when, search_req.k, shown)
    packed = build_prompt(hits, req.system_prompt, req.budget_tokens, ctx.embedder.count_tokens)
    # Its uses are recorded once per request and counted on the points without waiting for the write lock.
    ops.feedback(ctx.applier, Uses(ctx.client, ctx.keys), ops.UtilisationCounters(ctx.client, ctx.keys), req.subject,
                 packed.used_ids, when, req.request_id, recalled=len(hits))
    return packed


# -- adoption, forgetting, inspection -------------------------------------------


def feedback(ctx: Context, req: FeedbackRequest) -> Adopted:
    """Count memories as adopted (used in an answer): access_count + 1, per subject."""
    count = ops.feedback(ctx.applier, Uses(ctx.client, ctx.keys), ops.UtilisationCounters(ctx.client, ctx.keys),
                         req.subject, req.memory_ids, req.at or datetime.now(UTC), req.request_id)
    return Adopted(count=count)


def forget(ctx: Context, req: ForgetRequest) -> ForgetReport:
    """Forget memories everywhere memflow kept their words (workers/forgetting.py)."""
    report = forgetting.forget(ctx.applier, forgetting.Places.of(ctx), req.subject, req.memory_ids, req.contains,
                               datetime.now(UTC))
    return ForgetReport.model_validate(report)


def verify_forgotten(ctx: Context, req: VerifyRequest) -> ForgetProof:
    proof = forgetting.verify(ctx.store, forgetting.Places.of(ctx), req.subject, req.memory_ids, req.contains)
    return ForgetProof.model_validate(proof)


def inspect(ctx: Context, req: InspectRequest) -> InspectReport:
    """Each memory with its state, tier, strength now, uses and last change; utilisation; backlog."""
    when = req.now or datetime.now(UTC)
    memories = ctx.store.get(MemoryFilter(req.subject))
    memories.sort(key=lambda m: (m.created_at, m.id))
    taus = ctx.settings.lifecycle.decay_tau_hours
    llm = None if ctx.llm is None else {"subject": llm_usage(ctx.client, ctx.keys, req.subject, when),
                                        "everyone": llm_usage(ctx.client, ctx.keys, None, when)}
    return InspectReport.model_validate({
        "subject": req.subject, "now": when, "memories": [ops.memory_state(m, when, taus) for m in memories],
        "utilisation": ops.UtilisationCounters(ctx.client, ctx.keys).report(req.subject, when), "llm": llm,
        "backlog": backlog(ctx.client, ctx.keys, STAGES), "people": ops.people_of(memories),
        "pending": [{"event_id": s.turn.event_id, "session_id": s.session_id, "text": v.text, "ts": s.turn.ts}
                    for s in pending.read(ctx.client, ctx.keys, req.subject)
                    if (v := gate(s.turn.text, s.turn.role)).keep]})  # as a search would read it: gated


# -- maintenance: jobs, history, rollback, review (workers/jobs.py, workers/ops.py) -----


def run_job(ctx: Context, req: RunJobRequest) -> JobReport:
    """A maintenance job, run here because this process holds the store."""
    report = jobs.run(ctx, req.name, req.subject, req.now or datetime.now(UTC), req.dry_run,
                      req.tier.value if req.tier else None)
    return report_of(report, ctx.foreground.step_aside)


# A report names every memory a job changed: at 20k memories, 20k entries and ~0.1 s of validation.
REPORT_CHUNK = 1000


def report_of(report: dict[str, Any], between: Callable[[], object]) -> JobReport:
    """The reply of a job, its long lists validated REPORT_CHUNK entries at a time (`between` the chunks: the
    searches of the process go first) rather than in one stretch a search arriving would wait for."""
    lists = {name: report[name] for name in ("changed", "written", "sent", "undecided")}
    reply = JobReport.model_validate({**report, **dict.fromkeys(lists, [])})
    for name, entries in lists.items():
        adapter: TypeAdapter[list[Any]] = TypeAdapter(JobReport.model_fields[name].annotation or list[Any])
        validated: list[Any] = []
        for start in range(0, len(entries), REPORT_CHUNK):
            between()
            validated += adapter.validate_python(entries[start:start + REPORT_CHUNK])
        setattr(reply, name, validated)
    return reply


def history(ctx: Context, req: HistoryRequest) -> History:
    return History.model_validate(ops.history(ctx.store, req.memory_id, req.subject, req.within))


def rollback(ctx: Context, req: RollbackRequest) -> RollbackReport:
    report = ops.rollback(ctx.applier, ctx.embedder, req.memory_id, req.to_version, req.subject,
                          req.at or datetime.now(UTC), ctx.id_space)
    return RollbackReport.model_validate(report)


def review_list(ctx: Context, req: ReviewListRequest) -> ReviewList:
    return ReviewList.model_validate({"waiting": ops.review_list(ctx.store, req.subject)})


def review_decide(ctx: Context, req: ReviewDecideRequest) -> ReviewDecision:
    report = ops.review_decide(ctx.applier, req.memory_id, req.accept, req.subject,
                               req.at or datetime.now(UTC))
    return ReviewDecision.model_validate(report)


def health(ctx: Context, req: HealthRequest) -> Health:
    """The store answers a count: what `/healthz` asks of a query worker."""
    try:
        return Health(store="ok", memories=ctx.store.count())
    except StoreUnavailable as exc:
        return Health(store="unavailable", error=str(exc))


def subjects(ctx: Context, req: SubjectsRequest) -> SubjectList:
    """Every subject the store holds memories of (a front door shows a caller the ones its key covers)."""
    return SubjectList(subjects=sorted(ctx.store.subjects()))


def profile(ctx: Context, req: ProfileRequest) -> ProfileReply:
    """The subject's profile (shared/profiles.py): the materialized one, or built from the store and kept."""
    found = profiles.current(ctx.store, ctx.client, ctx.keys, req.subject, req.now or datetime.now(UTC))
    return profiles.reply(ctx.client, ctx.keys, found, req.since, req.max_tokens)


def export(ctx: Context, req: ExportRequest) -> ExportedSubject:
    """Every stored point of a subject, for `memflow export` (workers/transfer.py, docs/export-format.md)."""
    page = transfer.export_subject(ctx.store, ctx.embedder, req.subject, req.with_vectors, req.after, req.limit)
    return ExportedSubject.model_validate(page)


def import_subject(ctx: Context, req: ImportRequest) -> Imported:
    """Write what a subject lacks of an export, through the applier (workers/transfer.py)."""
    return Imported.model_validate(transfer.import_subject(ctx.applier, ctx.embedder, ctx.id_space, req))


# -- the worker ----------------------------------------------------------------


@dataclass(frozen=True)
class Handler(Generic[Req, Rep]):
    """What the worker runs for one RPC of the table (typed: the handler takes that RPC's request and
    answers its reply)."""

    rpc: Rpc[Req, Rep]
    run: Callable[[Context, Req], Rep]


HANDLERS: dict[str, Handler[Any, Any]] = {h.rpc.name: h for h in (
    Handler(SEARCH, search), Handler(PACK, pack), Handler(FORGET, forget),
    Handler(VERIFY_FORGOTTEN, verify_forgotten), Handler(FEEDBACK, feedback), Handler(INSPECT, inspect),
    Handler(RUN_JOB, run_job), Handler(HISTORY, history), Handler(ROLLBACK, rollback),
    Handler(REVIEW_LIST, review_list), Handler(REVIEW_DECIDE, review_decide), Handler(HEALTH, health),
    Handler(SUBJECTS, subjects), Handler(EXPORT, export), Handler(IMPORT, import_subject),
    Handler(PROFILE, profile))}


def serve(ctx: Context, job_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run one RPC job: its request validated (whoever enqueued it), its handler, its reply as JSON.
    An error (a refused request, a handler's MemflowError) fails the job: the client raises RpcError."""
    name = job_name.removeprefix(f"{WORKERS_MODULE}.")
    handler = HANDLERS.get(name) if job_name != name else None
    if handler is None:
        raise MemflowError(f"{job_name!r} is no RPC of the query worker: one of {', '.join(HANDLERS)}")
    return handler.run(ctx, request_of(handler.rpc, args, kwargs)).model_dump(mode="json")


class RpcJob(Job):
    """A job of the query worker: its function name names an RPC of the table (`serve`), run with the
    worker's context, as arq and saq hand a job its `ctx`. Nothing is imported by name and no module
    global holds the context; each worker binds its own (`bound_to`)."""

    ctx: ClassVar[Context]

    @classmethod
    def bound_to(cls, ctx: Context) -> type[RpcJob]:
        return type("RpcJob", (cls,), {"ctx": ctx})

    def _execute(self) -> Any:
        return serve(self.ctx, self.func_name or "", self.args, self.kwargs)


# The worker's beat keeps its key for worker_ttl + 60 s; once a second is plenty, and costs a search nothing.
BEAT_EVERY_S = 1.0
# A stop is seen between two dequeue waits (RQ's own: worker_ttl - 15 s, at least 1 s): a process, a test's system,
# stops within this long. An idle worker asks Redis 4 times a second, one blocking pop each: nothing to a server.
DEQUEUE_WAIT_S = 0.25
# RQ's command channel is read in waits this long (RQ's own: 60 s): a stop ends its thread within one.
COMMAND_READ_S = 0.25
# Past one read and RQ's 2 s pause after a lost connection, the command thread is not ending by itself.
COMMAND_JOIN_S = COMMAND_READ_S + 2.5


class Watchdog:
    """One thread that ends jobs that outlive their timeout, for every job of the process. RQ's
    TimerDeathPenalty starts a timer thread per job and waits for it to start: a thread and two handovers of
    the interpreter lock before every search. The thread runs while a query worker works (`running`), and
    ends with the last one, so a stopped worker leaves no thread behind."""

    _current: ClassVar[Watchdog | None] = None
    _users = 0
    _starting: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._due: dict[WatchedDeathPenalty, float] = {}
        self._changed = threading.Condition()
        self._ended = False
        self._thread = threading.Thread(target=self._watch, name="memflow-job-watchdog", daemon=True)
        self._thread.start()

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[None]:
        """The process's watchdog, started by the first worker to enter and ended by the last to leave."""
        with cls._starting:
            if cls._current is None:
                cls._current = Watchdog()
            cls._users += 1
        try:
            yield
        finally:
            with cls._starting:
                cls._users -= 1
                ending = cls._current if cls._users == 0 else None
                if ending is not None:
                    cls._current = None
            if ending is not None:
                ending._end()

    @classmethod
    def current(cls) -> Watchdog | None:
        return cls._current

    def arm(self, penalty: WatchedDeathPenalty, timeout_s: float) -> None:
        with self._changed:
            self._due[penalty] = time.monotonic() + timeout_s
            self._changed.notify()

    def disarm(self, penalty: WatchedDeathPenalty) -> None:
        with self._changed:  # once disarmed, never fired: the check below holds the same lock
            self._due.pop(penalty, None)

    def _end(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify()
        self._thread.join()

    def _watch(self) -> None:
        with self._changed:
            while not self._ended:
                now = time.monotonic()
                for penalty in [p for p, due in self._due.items() if due <= now]:
                    del self._due[penalty]
                    self._fire(penalty)
                self._changed.wait(min(self._due.values(), default=now + 60.0) - now)

    @staticmethod
    def _fire(penalty: WatchedDeathPenalty) -> None:
        try:
            penalty.handle_death_penalty()  # type: ignore[no-untyped-call]  # raises the timeout in the job's thread
        except (ValueError, SystemError) as exc:  # the job's thread is gone: nothing left to end
            log.warning("a job outlived its timeout, but its thread could not be told: %s", exc)


class WatchedDeathPenalty(TimerDeathPenalty):
    """TimerDeathPenalty (a job's timeout raised in the thread running it, wherever that thread is) on the
    process's one watchdog thread instead of a new thread per job; RQ's own timer thread when no query
    worker is running one (a job performed outside `QueryWorker.work`)."""

    def setup_death_penalty(self) -> None:
        self._watchdog = Watchdog.current()
        if self._watchdog is None:
            super().setup_death_penalty()  # type: ignore[no-untyped-call]
        elif self._timeout > 0:
            self._watchdog.arm(self, self._timeout)

    def cancel_death_penalty(self) -> None:
        if self._watchdog is None:
            super().cancel_death_penalty()  # type: ignore[no-untyped-call]
        elif self._timeout > 0:
            self._watchdog.disarm(self)


class QueryWorker(SimpleWorker):
    """A SimpleWorker that runs RPC jobs with its context, and can run in a thread and be stopped with
    an Event."""

    # The default death penalty arms SIGALRM, which only the main thread may do; a watchdog
    # thread enforces job timeouts wherever the worker runs.
    death_penalty_class = WatchedDeathPenalty

    def __init__(self, *args: Any, stop: threading.Event | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_event = stop or threading.Event()
        self._beaten_at = self._suspension_checked_at = -BEAT_EVERY_S

    def work(self, *args: Any, **kwargs: Any) -> bool:
        with Watchdog.running(), frozen_heap():  # a full collection walks no model or library (shared/foreground.py)
            return super().work(*args, **kwargs)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """A call a user waits for is in flight from its dequeue to its stored reply: the maintenance jobs of this
        process step aside meanwhile (shared/foreground.py). A maintenance job does not wait for itself."""
        ctx = cast(type[RpcJob], self.job_class).ctx
        if queue.name == ctx.keys.jobs_queue:
            return super().execute_job(job, queue)  # type: ignore[no-any-return]
        with ctx.foreground.serving():
            return super().execute_job(job, queue)  # type: ignore[no-any-return]

    @property
    def dequeue_timeout(self) -> float:  # type: ignore[override]  # RQ's is whole seconds; Redis takes fractions
        return DEQUEUE_WAIT_S

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """A call refused for what its caller asked (no such memory, a bad field) is answered to the caller,
        who is told: one line at DEBUG here, not RQ's ERROR with a traceback (a history 404 logged one)."""
        if isinstance(exc_info[1], ANSWERED):
            log.debug("job %s refused: %s: %s", job.id, type(exc_info[1]).__name__, exc_info[1])
            call_exception_handlers(self._exc_handlers, job, *exc_info)
            return
        super().handle_exception(job, *exc_info)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()  # type: ignore[no-untyped-call]

    def subscribe(self) -> None:
        """RQ's command channel (`rq` shutdown, stop-job), read by a thread of its own in COMMAND_READ_S waits."""
        self.pubsub = cast(Any, self.connection).pubsub()  # untyped before redis 8.2, typed after: no ignore fits both
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=COMMAND_READ_S, daemon=True, exception_handler=self._pubsub_exception_handler)

    def unsubscribe(self) -> None:
        """The command thread told to end, then waited for: it ends within one read and closes its connection.
        (RQ unsubscribes first and tells it after: a thread that read the confirmation in between went back to
        waiting for a subscription, RQ gave up on it after 1 s, and it outlived its worker by a minute.)"""
        thread = self.pubsub_thread
        if thread is None:
            return
        thread.stop()
        thread.join(timeout=COMMAND_JOIN_S)
        if thread.is_alive():  # a read that will not end: closing its socket ends it
            log.warning("worker %s: its command thread did not end within %.0f s; closing its connection",
                        self.name, COMMAND_JOIN_S)
            self.pubsub.close()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's beat, sent at most once a second unless it rides on a pipeline of RQ's: its loop beats three times
        a job (before a dequeue, after it, after the job), each three round trips, all while a search waits."""
        # Called on every turn of RQ's dequeue loop (at most dequeue_timeout apart).
        if self._stop_event.is_set():
            raise StopRequested()
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
        elif time.monotonic() - self._beaten_at >= BEAT_EVERY_S:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)
                pipe.execute()
            self._beaten_at = time.monotonic()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """The state, written once per change: SimpleWorker writes "idle" after a job and its loop again."""
        if pipeline is not None or state != self.get_state():
            super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        """`rq suspend` is seen within a second, not before every job (one round trip each)."""
        if time.monotonic() - self._suspension_checked_at >= BEAT_EVERY_S:
            super().check_for_suspension(burst)
            self._suspension_checked_at = time.monotonic()


SEARCHES, JOBS = "query", "jobs"


def build_worker(ctx: Context, stop: threading.Event | None = None,
                 serves: Sequence[str] = (SEARCHES, JOBS)) -> QueryWorker:
    """A worker of the queues named in `serves` (SEARCHES: every call but the maintenance jobs; JOBS: those).
    A process runs one of each (workers/system.py), so a job of an hour never holds a search: one worker
    serving both runs one job at a time, whatever its queues' order."""
    ctx.store  # noqa: B018 - load the model and open the store before the first job, not during it
    try:  # and measure what a query's noise floor is measured against, if the embedder answers now
        ctx.unrelated  # noqa: B018
    except MemflowError as exc:  # an endpoint that is down: the first search that can will measure it
        log.warning("noise floor not measured at start: %s", exc)
    # Searches first: RQ takes from the first non-empty queue, so a worker of both never starts a job
    # while a search waits in the queue.
    names = {SEARCHES: ctx.keys.query_queue, JOBS: ctx.keys.jobs_queue}
    queues = [Queue(names[kind], connection=ctx.queue_client or ctx.client, serializer=JSONSerializer)
              for kind in (SEARCHES, JOBS) if kind in serves]
    # worker_ttl 16 s: the key of a worker that died goes within a minute; its dequeue blocks DEQUEUE_WAIT_S.
    # No job descriptions in the log: a search's description is its query, and a query may hold a secret.
    return QueryWorker(queues, connection=ctx.queue_client or ctx.client, serializer=JSONSerializer, worker_ttl=16,
                       stop=stop, log_job_description=False, job_class=RpcJob.bound_to(ctx))
