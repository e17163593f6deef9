"""What a search reads through (pipeline.search.Reader): the store, the encoders, the reranker, the pending layer
and a model's plans. The ranking order itself is pipeline/search.py's; this module only reads."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import redis
from numpy.typing import NDArray

from memflow.pipeline import llm_plan
from memflow.pipeline.models import SEARCHABLE_STATUSES, Memory, QueryPlan, Route, SearchRequest
from memflow.pipeline.pending import Pending, Said
from memflow.pipeline.ranking import RankingProfile, RankingProfiles
from memflow.pipeline.score import Floor, Found, Fusion, Scored
from memflow.pipeline.search import ModelPlan, Vectors
from memflow.shared.codec import decode, encode
from memflow.shared.errors import MemflowError, Retryable, StoreUnavailable
from memflow.shared.inference.embedder import Embedder
from memflow.shared.inference.llm import LLM, Reading
from memflow.shared.inference.reranker import Reranker, floors_by_language
from memflow.shared.redisdb.keys import Keys
from memflow.shared.search.pending import Shown, about_to_be_written, with_pending
from memflow.shared.settings import PendingSettings, Settings
from memflow.shared.storage import sparse
from memflow.shared.storage.store import MemoryFilter, Query, SearchMode, Store, admits, narrowed
from memflow.shared.storage.store import Scored as StoreScored
from memflow.shared.unstored import pending

log = logging.getLogger(__name__)


def profile_for(settings: Settings, profiles: RankingProfiles, query: str) -> RankingProfile:
    """The profile one search ranks by: its kind's (`RankingProfiles.of`), with what the deployment chose."""
    chosen = settings.ranking
    return replace(profiles.of(query), candidate_pool=chosen.candidate_pool, intent_planning=chosen.intent_planning,
                   dir_scoping=chosen.dir_scoping, fusion=chosen.fusion, collapse_records=chosen.collapse_records,
                   lifecycle_scoring=chosen.lifecycle_scoring, type_quotas=chosen.type_quotas,
                   reserved_types=chosen.reserved_types, decay_tau_hours=settings.lifecycle.decay_tau_hours)


@dataclass(frozen=True)
class SearchReader:
    """pipeline.search.Reader over this process's parts: the settings (the pending layer, the write path's duplicate
    threshold, the LLM's planning), the store, the embedder of questions, the second look's reranker (None: off),
    the unrelated passages a noise floor is measured against (measured when first asked for), Redis (the pending
    layer; the plan cache on `transient`) and the LLM."""

    settings: Settings
    store: Store
    embedder: Embedder
    reranker: Reranker | None
    unrelated: Callable[[], NDArray[np.float64]]
    client: redis.Redis
    keys: Keys
    llm: LLM | None = None
    # Where the plan cache lives: the transient server (docs/architecture.md "Which writes are durable"), else `client`.
    transient: redis.Redis | None = None

    @property
    def failure(self) -> type[Exception]:
        return MemflowError

    @property
    def plans(self) -> bool:
        return self.llm is not None and self.settings.llm.plan

    def model_plan(self, req: SearchRequest, heuristic: QueryPlan) -> ModelPlan:
        """The LLM's plan (cached per subject and normalised query, as it answered), or the heuristic plan marked
        `fallback` with why, on any error."""
        assert self.llm is not None  # asked only when `plans`
        cache = PlanCache(self.transient or self.client, self.keys, self.settings.llm.plan_cache_ttl_s)
        cached = cache.get(req.subject, req.query)
        if cached is not None:
            return ModelPlan(cached)
        # No retry: the plan timeout is all a search waits for a plan (retried, a slow model outlived the search's job).
        asked = self.llm.ask(req.subject, "plan", llm_plan.prompt(req.query), timeout=self.settings.llm.plan_timeout_s,
                             retries=0, read=lambda text: _plan_read(text, heuristic),
                             fallback=lambda: Reading(heuristic.model_copy(update={"fallback": True})))
        if asked.fallback is not None:
            return ModelPlan(asked.value, asked.fallback)
        cache.put(req.subject, req.query, asked.value)
        return ModelPlan(asked.value)

    def said(self, subject: str) -> list[Said]:
        return pending_of(self.settings.pending, self.client, self.keys, subject)

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embedder.encode_queries(texts)

    def find(self, req: SearchRequest, routes: Sequence[Route], vectors: Vectors, pool: int,
             fusion: Fusion) -> list[Found]:
        return run_routes(self.store, fusion, req, routes, vectors, pool)

    def find_route(self, req: SearchRequest, route: Route, vectors: Vectors, pool: int, fusion: Fusion) -> Found:
        return run_route(self.store, fusion, req, route, vectors, pool)

    def pending(self, req: SearchRequest, vectors: Vectors, found: Sequence[Found],
                said: Sequence[Said]) -> PendingRoutes:
        return PendingRoutes.of(self.embedder, self.settings.write.duplicate_threshold, req, vectors, found, said)

    def noise_floor(self, vector: Sequence[float]) -> Floor:
        return floors_by_language(self.unrelated(), vector)

    def query_terms(self, query: str) -> list[int]:
        return sparse.embed_query(query)[0]

    def memory_terms(self, memory: Memory) -> Mapping[int, float]:
        return sparse.memory_terms(memory)


# -- a model's plans --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCache:
    """The LLM's plans, per subject and normalised query (`Keys.plan_cache`), each kept `ttl_s`."""

    client: redis.Redis
    keys: Keys
    ttl_s: int

    def _key(self, subject: str, query: str) -> str:
        return self.keys.plan_cache(subject, hashlib.sha256(llm_plan.cache_key(query).encode()).hexdigest()[:32])

    def get(self, subject: str, query: str) -> QueryPlan | None:
        cached = self.client.get(self._key(subject, query))
        return None if cached is None else decode(cached, QueryPlan)

    def put(self, subject: str, query: str, plan: QueryPlan) -> None:
        self.client.set(self._key(subject, query), encode(plan), ex=self.ttl_s)


def _plan_read(reply: str, heuristic: QueryPlan) -> Reading[QueryPlan]:
    plan = llm_plan.read_reply(reply, heuristic)
    return Reading(plan, items=len(plan.routes))


# -- what the subject said, not stored yet ----------------------------------------------------------------------


def pending_of(layer: PendingSettings, client: redis.Redis, keys: Keys, subject: str) -> list[Said]:
    """What the subject said that is not stored yet (shared/unstored/pending.py); none when the layer is off. A layer
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
class PendingRoutes:
    """The pending memories one search ranks (`shared.search.pending`), added to each route's candidates."""

    req: SearchRequest
    vectors: Vectors
    shown: Shown

    @classmethod
    def of(cls, embedder: Embedder, duplicate_threshold: float, req: SearchRequest, vectors: Vectors,
           found: Sequence[Found], said: Sequence[Said]) -> PendingRoutes:
        shown = about_to_be_written(said, req.subject, found, embedder, query=req.query,
                                    query_vector=vectors[req.query], keep=req.k + PENDING_SPARE,
                                    duplicate_threshold=duplicate_threshold) if said else Shown()
        return cls(req, vectors, shown)

    @property
    def by_id(self) -> Mapping[str, Pending]:
        return self.shown.by_id

    def route(self, route: Route, found: Found) -> Found:
        """A route's candidates, with the pending memories its filter admits."""
        if not self.shown:
            return found
        admitted = [p for p in self.shown.by_id.values() if admits(route_filter(self.req, route), p.memory)]
        dense = self.vectors.get(route.text) if route.strategy == "semantic" else None
        return with_pending(found, route.text, dense, admitted, self.shown.vectors)


# -- the store ----------------------------------------------------------------------------------------------------

# The whole-subject route fetches this many times the pool when a scoped route may be read off its candidates:
# a scope holding at least 1/WIDEN of the subject then finds a pool's worth among them (store.narrowed).
WIDEN = 1.5


def run_routes(store: Store, fusion: Fusion, req: SearchRequest, routes: Sequence[Route], vectors: Vectors,
               pool: int) -> list[Found]:
    """Every route's raw candidates, as `run_route` finds them, from one engine call (`Store.query_many`);
    a second one only for scoped routes whose candidates the whole-subject route's could not answer.

    "rrf" fusion runs route by route: it ranks by position, and the engine orders points of equal score
    differently in a batch than alone. When the store fails, route by route too: a scoped route's failure is
    stood in for, the whole-subject route's fails the search."""
    if fusion == "score":
        try:
            return _batched(store, req, routes, vectors, pool)
        except StoreUnavailable:
            log.warning("a batched search failed; its routes are searched one by one")
    return [run_route(store, fusion, req, route, vectors, pool) for route in routes]


def _batched(store: Store, req: SearchRequest, routes: Sequence[Route], vectors: Vectors, pool: int) -> list[Found]:
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


def _searches(req: SearchRequest, route: Route, vectors: Vectors, limit: int) -> list[Query]:
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


def run_route(store: Store, fusion: Fusion, req: SearchRequest, route: Route, vectors: Vectors, pool: int) -> Found:
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
