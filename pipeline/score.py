"""Turning engine candidates into ranked hits, as of `now` (docs/ranking.md).

score = relevance × lifecycle, where relevance is the routes' fused score (`fuse_found`) and

    lifecycle = (floor + (1 − floor) · strength) × hotness × (1 + long_term_bonus if long-term)
    strength  = exp(−Δt / τ[type])    Δt since the memory was last used or changed
    hotness   = 1 + min(cap, step · access_count)     (not for `system`: rules do not get "popular")

τ per type: docs/ranking.md#lifecycle-scoring; pinned and `system` memories never decay. The floor
keeps relevance in charge: an old memory that answers the question still beats a fresh
one that does not (LoCoMo asks about a year of sessions at its end). Per-type quotas
then keep short-lived chatter from filling the top k. What must never be returned as
current is taken out (memories from after `now`, expired events) and contested memories
are flagged. Every weight is a setting; bench/RESULTS.md has the measurements behind
the defaults.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from memflow.pipeline.holders import matches
from memflow.pipeline.models import Dir, Hit, Memory, MType, Period, QueryPlan, Route, Status, Tier
from memflow.pipeline.records import said_by_assistant
from memflow.pipeline.statements import CJK, coverage
from memflow.pipeline.topics import topic_base

# A document at rank r (0-based) in one list adds weight / (r + 1 + RRF_K); 60 is the value of the
# original RRF paper. The store engines fuse their prefetches with the same constant.
RRF_K = 60

Scored = tuple[Memory, float]
Fusion = Literal["score", "rrf"]


def normalised(found: Sequence[Scored], floor: float = 0.0, best: float | None = None) -> list[Scored]:
    """Scores mapped onto [0, 1] relative to `best` (default: the list's own): (s − floor) / (best − floor), ≥ 0.

    BM25 scores start at 0 (floor 0: the best match is 1, half its score is 0.5); a cosine
    has a floor of its own below which it means nothing.
    """
    if not found:
        return []
    top = max(score for _, score in found) if best is None else best
    span = top - floor
    if span <= 0:
        return [(m, 1.0) for m, _ in found]
    return [(m, max(0.0, (score - floor) / span)) for m, score in found]


@dataclass(frozen=True)
class Found:
    """What one route found: its weight and its raw keyword (BM25) and dense (cosine) lists, best first."""

    weight: float
    keyword: Sequence[Scored] = ()
    dense: Sequence[Scored] = ()
    # Every memory found counts 1 (a topic-key route: being stored under the asked topic is the match).
    flat: bool = False

    @property
    def empty(self) -> bool:
        return not self.keyword and not self.dense


def fuse_found(found: Sequence[Found], *, dense_weight: float, dense_floor: Floor = 0.0,
               smoothing: float = 0.0, keyword_ceiling: float = 0.0) -> list[Scored]:
    """Every route's keyword and dense matches as one ranked list (score fusion).

    Scores are scaled against the best of their signal over ALL routes, not per route: a
    route scoped to one directory must not lift its best, however weak, to 1. A scoped
    route thus adds its weight × the same score a memory has in the whole-subject route,
    which boosts the planned directories without letting them outrank a better match.
    Keyword scores are scaled against the best hit or `keyword_ceiling` (what the question's own
    terms could score, `ceiling`), whichever is higher.
    """
    keyword_best = keyword_scale(found, keyword_ceiling)
    meaning_of = dense_scaler(found, dense_floor)
    routes = []
    for f in found:
        if f.flat:
            routes.append((f.weight, [(m, 1.0) for m in {m.id: m for m, _ in [*f.keyword, *f.dense]}.values()]))
            continue
        keyword = smoothed(normalised(f.keyword, 0.0, keyword_best), smoothing)
        meaning = meaning_of(f.dense)
        routes.append((f.weight, fuse([(1.0, keyword), (dense_weight, meaning)])))
    return fuse(routes)


def keyword_scale(found: Sequence[Found], ceiling: float = 0.0) -> float:
    """The BM25 score that counts 1: the best keyword hit over all routes, or `ceiling` if higher."""
    return max(ceiling, max((score for f in found for _, score in f.keyword), default=0.0))


def ceiling(idf: Mapping[int, float]) -> float:
    """What a memory holding each of a question's terms once, at the average length, scores: the sum of their
    IDFs (a term's BM25 weight is (k1 + 1)·tf / (tf + k1·length norm) = 1 there).

    Scaled against the best hit, a keyword match scores 1 however little of the question it covers: "What
    do I do for a living?" and "My brother does marketing for a living" share one word. Scaled against this,
    a hit scores the share of the question's weight it matches, and a question whose rarest words nothing
    holds leaves the ranking to meaning (docs/ranking.md#keyword-evidence)."""
    return sum(idf.values())


# The cosine that counts 0: one for every memory, or one per language of the memory (`UNRELATED_LANGUAGES`).
Floor = float | Mapping[str, float]


def language(text: str) -> str:
    """"zh" for text with Chinese characters, else "en": what a memory's noise floor is measured in."""
    return "zh" if CJK.search(text) else "en"


def dense_scaler(found: Sequence[Found], floor: Floor) -> Callable[[Sequence[Scored]], list[Scored]]:
    """Cosines mapped onto [0, 1]: each one's margin over the floor of its memory's language, relative to the best
    margin over all routes. When no candidate beats its floor, every one counts 1 (the dense side says nothing)."""
    def margin(m: Memory, score: float) -> float:
        return score - (floor if isinstance(floor, float | int) else floor.get(language(m.content), 0.0))

    best = max((margin(m, score) for f in found for m, score in f.dense), default=0.0)
    if best <= 0:
        return lambda dense: [(m, 1.0) for m, _ in dense]
    return lambda dense: [(m, max(0.0, margin(m, score)) / best) for m, score in dense]


# Sentences about nothing a memory search asks (office, weather, errands; Chinese and English): how
# close a query comes to them is the model's "unrelated" for that query (`noise_floor`).
UNRELATED = (
    "The invoice was paid on Tuesday.", "今天的天气预报说下午会下雨。",
    "The meeting room on the third floor is booked.", "这家餐厅的菜单每个季度更换一次。",
    "Set the thermostat to 21 degrees.", "火车晚点了二十分钟。",
    "The library closes at eight in the evening.", "请把文件发到我的邮箱。",
    "The package weighs about two kilograms.", "他们在讨论明年的预算。",
    "Remember to water the plants.", "这本书的第三章讲的是历史。",
    "The software update will be released next month.", "停车场在大楼的后面。",
    "She bought a new pair of running shoes.", "我们需要更多的打印纸。",
)


# The language of each of them: a memory's cosine counts from the query's floor among those of its own language
# (e5 scores a Chinese query 0.05–0.1 higher against unrelated Chinese than against the English sentence that
# answers it, so one floor for both zeroed every cross-lingual answer).
UNRELATED_LANGUAGES = tuple(language(text) for text in UNRELATED)


def noise_floor(query: Sequence[float], unrelated: Sequence[Sequence[float]]) -> float:
    """The cosine a memory must beat to count as related to `query`: the best it scores against
    `UNRELATED` (unit vectors). MiniLM puts unrelated text near 0, e5 at 0.74–0.86, a paired vector
    in between, and each query has a level of its own; measured per query, one rule fits every model
    and every subject size (the weakest candidate fetched also fits the model, but in a subject of
    three memories it is a related one)."""
    # map(mul) rather than a generator: this runs in every search (16 × 768 products: 0.7 ms, against 1.6 with fsum).
    return max((sum(map(operator.mul, query, ref)) for ref in unrelated), default=0.0)


def route_bests(found: Sequence[Found], *, dense_weight: float, dense_floor: Floor = 0.0,
                keyword_ceiling: float = 0.0) -> list[float]:
    """Each route's best relevance, on the scale `fuse_found` uses (signals scaled against their best
    over all routes), before route weights: how good the best match each route found is."""
    keyword_best = keyword_scale(found, keyword_ceiling)
    meaning_of = dense_scaler(found, dense_floor)
    return [max((score for _, score in fuse([(1.0, normalised(f.keyword, 0.0, keyword_best)),
                                             (dense_weight, meaning_of(f.dense))])),
                default=0.0) for f in found]


def confirmed_scopes(found: Sequence[Found], scoped: Sequence[bool], whole: int, *, min_share: float,
                     dense_weight: float, dense_floor: Floor = 0.0, keyword_ceiling: float = 0.0) -> list[Found]:
    """The routes, with each scoped route dropped (weight 0) unless its best match holds up against
    the whole subject's: best ≥ min_share × the whole-subject route's best.

    A plan is a guess from the query's wording; the candidates are evidence. When the planned
    directories do not hold the subject's best match (a recall question worded like a preference,
    a long dialogue whose words cue every intent), boosting them can only push better matches
    down: the whole subject ranks alone.
    """
    bests = route_bests(found, dense_weight=dense_weight, dense_floor=dense_floor, keyword_ceiling=keyword_ceiling)
    bar = min_share * bests[whole]
    return [replace(f, weight=0.0) if is_scoped and bests[i] < bar else f
            for i, (f, is_scoped) in enumerate(zip(found, scoped, strict=True))]


def in_period(found: Sequence[Scored], period: Period | None, boost: float) -> list[Scored]:
    """The candidates with those said within `period` scored × (1 + boost), best first.

    "What did Evan injure in August 2023?": the words find every mention of a knee; when it
    was said tells which one. A boost, not a filter: a period misread from the wording
    ("in may" as a verb) or a memory written later about it still ranks by relevance.
    On LoCoMo's questions that name a date or a month: R@5 +1.8 overall (bench/RESULTS.md).
    """
    if period is None or boost <= 0:
        return list(found)
    lifted = [(m, score * (1.0 + boost) if period.start <= m.created_at < period.end else score) for m, score in found]
    return sorted(lifted, key=lambda pair: pair[1], reverse=True)


def second_look(found: Sequence[Scored], margins: Sequence[float], weight: float) -> list[Scored]:
    """The head of a fused list (`found`, best first; one judge's margin per memory of the head) re-ranked by two
    judges: each memory keeps (1 − weight) of its relevance and gains weight × its share of the head's best
    margin, on the scale of the head's best relevance. A margin ≤ 0 (the judge reads it as unrelated) gains
    nothing, and neither does what follows the head (the judge did not see it). When no margin is above 0 the
    judge says nothing and `found` stays as it was (docs/ranking.md#the-second-look)."""
    head = list(found[:len(margins)])
    best_margin = max(margins, default=0.0)
    top = max((score for _, score in head), default=0.0)
    if weight <= 0 or best_margin <= 0 or top <= 0:
        return list(found)
    looked = [(m, (1 - weight) * score + weight * top * max(0.0, margin) / best_margin)
              for (m, score), margin in zip(head, margins, strict=True)]
    rest = [(m, (1 - weight) * score) for m, score in found[len(head):]]
    return sorted(looked, key=lambda pair: pair[1], reverse=True) + rest


def by_holder(found: Sequence[Scored], asked: str | None, mismatch: float) -> list[Scored]:
    """The candidates, those about someone other than whom the query asks about scored × `mismatch`, best first.

    "What diet do I follow?" shares "diet" with "My wife is on a keto diet"; the wife's diet is still an
    answer to "what does my wife eat", not to this. Ranked down, never out: a question about the mother
    asked with words the rules do not read as hers ("妈说她…") still finds what she said
    (docs/ranking.md#holders)."""
    if asked is None or mismatch >= 1.0:
        return list(found)
    lifted = [(m, score if matches(asked, m.about) else score * mismatch) for m, score in found]
    return sorted(lifted, key=lambda pair: pair[1], reverse=True)


def by_speaker(found: Sequence[Scored], asked: str | None, to_assistant: bool, weight: float) -> list[Scored]:
    """The candidates, an assistant's turns scored × `weight` when the request asks about someone (`asked`, the
    plan's `about`) without speaking to the assistant, best first.

    An assistant's turn holds the assistant's words: "Nice to meet you! How can I help today?" is close to any
    question to every encoder, and its exchange's context holds the user's words, so it outranked the fact it
    followed. What the user said or accepted of it lives in the user's own record (its context holds the turn);
    what the assistant committed to is asked of it in the second person ("When will you remind me?"), which
    keeps every turn as it is. Ranked down, never out (docs/ranking.md#the-assistants-turns)."""
    if asked is None or to_assistant or weight >= 1.0:
        return list(found)
    lifted = [(m, score * weight if said_by_assistant(m) else score) for m, score in found]
    return sorted(lifted, key=lambda pair: pair[1], reverse=True)


def judged_across(found: Sequence[Scored], asked_in: str, depth: int) -> list[int]:
    """Which candidates of a fused list the judge reads for `across_languages`: the head (its `depth` best, the
    scale) and the `depth` best in the other language after it — none when no candidate is in the other
    language, so that a search within one language never pays for the judge."""
    head = list(range(min(depth, len(found))))
    other = [i for i in range(len(head), len(found)) if language(found[i][0].content) != asked_in][:depth]
    if not other and all(language(m.content) == asked_in for m, _ in found[:depth]):
        return []
    return head + other


def across_languages(found: Sequence[Scored], judged: Sequence[int], margins: Sequence[float], asked_in: str,
                     weight: float) -> list[Scored]:
    """The candidates, each in the other language than the question's (`asked_in`) scored by the better of its
    relevance and weight × the head's best relevance × its share of the best judge margin, best first.

    The first pass's encoder reads an answer in the other language barely above unrelated sentences of that
    language ("What's my cat called?" — "我养了一只橘猫，叫年糕"), below small talk in the question's own; the
    judge was trained on translation pairs and reads it as an answer. Only the other language's candidates are
    lifted: within one language the first pass reads keywords and topics the judge overrides
    (docs/ranking.md#the-second-look), and a monolingual subject is ranked exactly as before."""
    best_margin = max(margins, default=0.0)
    top = max((score for _, score in found), default=0.0)
    if weight <= 0 or best_margin <= 0 or top <= 0:
        return list(found)
    margin_of = dict(zip(judged, margins, strict=True))

    def lifted(i: int, m: Memory, score: float) -> float:
        if i not in margin_of or language(m.content) == asked_in:
            return score
        return max(score, weight * top * max(0.0, margin_of[i]) / best_margin)

    return sorted(((m, lifted(i, m, score)) for i, (m, score) in enumerate(found)),
                  key=lambda pair: pair[1], reverse=True)


def smoothed(found: Sequence[Scored], weight: float) -> list[Scored]:
    """Each memory gains `weight` × the scores of the candidates its context was taken from.

    A question's answer is often the reply to the turn that matches it best ("Did you go?" —
    "Yes, twice"); both are candidates, and the pair outranks either turn alone. Only
    candidates count: nothing is fetched.
    """
    if weight <= 0:
        return list(found)
    by_event = {m.source_event_ids[0]: score for m, score in found if m.mtype is MType.episode and m.source_event_ids}
    lifted = [(m, score + weight * sum(by_event.get(e, 0.0) for e in m.context_event_ids)) for m, score in found]
    return sorted(lifted, key=lambda pair: pair[1], reverse=True)


def fuse(lists: Sequence[tuple[float, Sequence[Scored]]], method: Fusion = "score", k: int = RRF_K) -> list[Scored]:
    """Weighted fusion of ranked lists, best first; a memory found by several lists adds up.

    "score" sums the weighted (normalised) scores, so a list that is sure of its best match
    counts for more than one that barely separates its candidates; "rrf" sums weight / (k + rank)
    and ignores the scores. Measured on LoCoMo (bench/RESULTS.md), score fusion of BM25 and
    dense beats RRF at every weight tried: RRF gives a weak dense list's guesses as much say
    as BM25's sure hits.
    """
    scores: dict[str, float] = {}
    found: dict[str, Memory] = {}
    for weight, ranked in lists:
        for rank, (memory, score) in enumerate(ranked):
            gain = weight / (k + rank + 1) if method == "rrf" else weight * score
            scores[memory.id] = scores.get(memory.id, 0.0) + gain
            found.setdefault(memory.id, memory)
    return sorted(((found[i], s) for i, s in scores.items()), key=lambda pair: pair[1], reverse=True)


def flat_plan(query: str) -> QueryPlan:
    """One route over the whole subject: the plan when intent planning is off."""
    return QueryPlan(intent="general_chat", routes=[Route(text=query)])


def unscoped(plan: QueryPlan) -> QueryPlan:
    """The same routes without their dirs: the plan when directory scoping is off."""
    return plan.model_copy(update={"routes": [r.model_copy(update={"dirs": []}) for r in plan.routes]})


def reweight(plan: QueryPlan, *, whole_subject: float, exact_match: float, bm25: float,
             topic: float) -> QueryPlan:
    """The plan with the weights that live in settings: whole-subject routes (no dirs), exact-match,
    bm25 and topic-key routes. A route weighted 0 is dropped (not run at all)."""
    def weight(r: Route) -> float:
        if r.keys:
            return topic
        if r.strategy == "exact_match":
            return exact_match
        if r.strategy == "bm25":
            return bm25
        return r.weight if r.dirs else whole_subject

    routes = [r.model_copy(update={"weight": weight(r)}) for r in plan.routes]
    kept = [r for r in routes if r.weight > 0] or routes[:1]
    return plan.model_copy(update={"routes": kept})


# A distilled memory stands in for its episode only if it repeats this much of the turn's wording.
COLLAPSE_COVERAGE = 0.8


def collapse_records(candidates: Sequence[tuple[Memory, float]]) -> list[tuple[Memory, float]]:
    """One entry per thing said: an episode gives way to a memory distilled from the same events
    that says (nearly) all the episode says.

    A turn is kept verbatim (episode) and may also yield a preference or fact; both would
    otherwise fill two of the k places (and two lines of a packed prompt) with the same
    words. The distilled memory stays, with the better of the two relevances; its
    provenance names the same events. A turn that said more than was distilled ("I don't
    like long examples; keep any example under 10 lines") keeps its episode.
    """
    by_event: dict[str, int] = {}
    for i, (memory, _) in enumerate(candidates):
        if memory.mtype is not MType.episode:
            for event in memory.source_event_ids:
                by_event.setdefault(event, i)
    best = [score for _, score in candidates]
    dropped: set[int] = set()
    for i, (memory, score) in enumerate(candidates):
        if memory.mtype is not MType.episode or not memory.source_event_ids:
            continue
        owner = by_event.get(memory.source_event_ids[0])
        if owner is None or any(by_event.get(e) != owner for e in memory.source_event_ids):
            continue
        if coverage(candidates[owner][0].content, memory.content) >= COLLAPSE_COVERAGE:
            best[owner] = max(best[owner], score)
            dropped.add(i)
    return [(m, best[i]) for i, (m, _) in enumerate(candidates) if i not in dropped]


def visible_at(memory: Memory, now: datetime) -> bool:
    """A memory exists for a search at `now` if it was made by then and has not expired."""
    if memory.created_at > now:
        return False
    return memory.expires_at is None or memory.expires_at > now


_HOUR_S = 3600.0
# Why each τ: docs/ranking.md#lifecycle-scoring. Missing from the table: never decays.
DEFAULT_TAU_HOURS: dict[str, float] = {
    MType.session_context.value: 48.0,
    MType.task_state.value: 7 * 24.0,
    MType.temp_preference.value: 14 * 24.0,
    MType.preference.value: 90 * 24.0,
    MType.fact.value: 180 * 24.0,
    # An event matters around when it happens; its expires_at removes it when it has one.
    MType.event.value: 30 * 24.0,
    MType.decision.value: 180 * 24.0,
    MType.skill.value: 180 * 24.0,
    MType.pattern.value: 180 * 24.0,
    MType.insight.value: 180 * 24.0,
    MType.rule.value: 365 * 24.0,
    # What was said, verbatim: as long-lived as a fact, or "what did we talk about in May" fails.
    MType.episode.value: 180 * 24.0,
}
# At most this share of k per type (soft: filled from the rest when nothing else is left).
DEFAULT_QUOTAS: dict[str, float] = {
    MType.session_context.value: 0.4,
    MType.task_state.value: 0.4,
    MType.temp_preference.value: 0.4,
}

# Places in the top k kept for long-term memories of these types, when one is relevant at all
# (final score ≥ reserve_min_share × the best): the other half of the quotas (docs/ranking.md#quotas).
DEFAULT_RESERVED: dict[str, int] = {MType.preference.value: 1, MType.rule.value: 1}


@dataclass(frozen=True)
class Lifecycle:
    """The weights of lifecycle scoring; `off()` ranks by relevance alone."""

    tau_hours: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TAU_HOURS))
    floor: float = 0.9
    hotness_step: float = 0.05
    hotness_cap: float = 0.5
    long_term_bonus: float = 0.15
    quotas: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    reserved: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RESERVED))
    reserve_min_share: float = 0.25
    enabled: bool = True

    @classmethod
    def off(cls) -> Lifecycle:
        return cls(enabled=False, quotas={}, reserved={})


def strength(memory: Memory, now: datetime, tau_hours: Mapping[str, float]) -> float:
    """How much of a memory is left at `now`: 1 when just used or changed, → 0 with disuse.

    Pure function of the payload and `now`; the decay jobs store the same value in `strength`.
    """
    tau = tau_hours.get(memory.mtype.value)
    if memory.pinned or memory.dir is Dir.system or not tau:
        return 1.0
    idle_h = max(0.0, (now - touched(memory)).total_seconds() / _HOUR_S)
    return math.exp(-idle_h / tau)


def touched(memory: Memory) -> datetime:
    """When it was last written, restated or used: what decay counts from."""
    return max(memory.updated_at, memory.last_accessed_at or memory.updated_at)


def hotness(memory: Memory, cfg: Lifecycle) -> float:
    if memory.dir is Dir.system:
        return 1.0
    return 1.0 + min(cfg.hotness_cap, cfg.hotness_step * memory.access_count)


def lifecycle_scores(memory: Memory, relevance: float, now: datetime, cfg: Lifecycle) -> dict[str, float]:
    """Every factor of the final score, for the hit and its trace."""
    if not cfg.enabled:
        return {"relevance": relevance, "final": relevance}
    kept = strength(memory, now, cfg.tau_hours)
    tier = 1.0 + cfg.long_term_bonus if memory.tier is Tier.long_term else 1.0
    hot = hotness(memory, cfg)
    factor = (cfg.floor + (1.0 - cfg.floor) * kept) * hot * tier
    return {"relevance": relevance, "strength": kept, "hotness": hot, "tier": tier, "lifecycle": factor,
            "final": relevance * factor}


def rank(candidates: Sequence[tuple[Memory, float]], now: datetime, k: int,
         cfg: Lifecycle | None = None, *, collapse: bool = False) -> list[Hit]:
    """The top k visible candidates by relevance × lifecycle, within the per-type quotas;
    with `collapse`, one entry per thing said (`collapse_records`)."""
    cfg = cfg or Lifecycle.off()
    visible = [(m, s) for m, s in candidates if visible_at(m, now)]
    flagged = disputed_records(m for m, _ in visible)
    if collapse:
        visible = collapse_records(visible)
    scored = [(m, lifecycle_scores(m, s, now, cfg)) for m, s in visible]
    scored.sort(key=lambda pair: pair[1]["final"], reverse=True)
    chosen = with_reserved(within_quotas(scored, k, cfg.quotas), scored, cfg.reserved, cfg.reserve_min_share)
    if cfg.enabled:
        chosen = wishes_first(chosen, scored, k)
    return [to_hit(m, scores, disputed=m.id in flagged) for m, scores in chosen]


def disputed_records(candidates: Iterable[Memory]) -> set[str]:
    """Episodes that recorded only statements now contested (among the candidates): flagged like them.

    "Ugh, that was way too long. Keep it short." said against a well-used wish for detail contests it;
    served unflagged, its verbatim record would settle what the contest holds open.
    """
    memories = list(candidates)
    contested = {e for m in memories if m.mtype is not MType.episode and m.status is Status.contested
                 for e in m.source_event_ids}
    return {m.id for m in memories
            if m.mtype is MType.episode and m.source_event_ids and set(m.source_event_ids) <= contested}


Ranked = tuple[Memory, dict[str, float]]


def within_quotas(ranked: Sequence[Ranked], k: int, quotas: Mapping[str, float]) -> list[Ranked]:
    """The first k in order, a type over its share of k waiting until nothing else is left
    (docs/ranking.md#quotas: short-term chatter must not crowd long-term preferences out of the top k)."""
    caps = {mtype: max(1, math.floor(share * k)) for mtype, share in quotas.items()}
    taken: dict[str, int] = {}
    chosen, waiting = [], []
    for pair in ranked:
        mtype = pair[0].mtype.value
        if mtype in caps and taken.get(mtype, 0) >= caps[mtype]:
            waiting.append(pair)
            continue
        taken[mtype] = taken.get(mtype, 0) + 1
        chosen.append(pair)
        if len(chosen) == k:
            return chosen
    return chosen + waiting[: k - len(chosen)]


def with_reserved(chosen: list[Ranked], ranked: Sequence[Ranked], reserved: Mapping[str, int],
                  min_share: float) -> list[Ranked]:
    """`chosen`, with each reserved type's best long-term memories swapped in for the weakest
    others (docs/ranking.md#quotas: a standing preference must not be crowded out by a flood of chatter)."""
    if not chosen or not reserved:
        return chosen
    floor = min_share * ranked[0][1]["final"]
    kept, swapped = list(chosen), False
    for mtype, places in reserved.items():
        def lasting(pair: Ranked, mtype: str = mtype) -> bool:
            return pair[0].mtype.value == mtype and pair[0].tier is Tier.long_term
        missing = places - sum(1 for pair in kept if lasting(pair))
        ids = {pair[0].id for pair in kept}
        extra = [p for p in ranked if lasting(p) and p[0].id not in ids and p[1]["final"] >= floor][:max(0, missing)]
        for pair in extra:
            weakest = next((i for i in range(len(kept) - 1, -1, -1) if kept[i][0].mtype.value not in reserved), None)
            if weakest is None:
                break
            kept[weakest], swapped = pair, True
    return sorted(kept, key=lambda pair: pair[1]["final"], reverse=True) if swapped else kept


def wishes_first(chosen: list[Ranked], ranked: Sequence[Ranked], k: int) -> list[Ranked]:
    """A temporary wish that has not lapsed speaks for its topic: it goes just before the standing
    preference it overrides for now, brought in from below the top k if need be ("today, keep it
    short" answers "how long should answers be?" over "I like detail" until the day is over).
    Its score is left as it was: the order says who speaks, the score how well it matched."""
    wishes: dict[str, Ranked] = {}
    for pair in ranked:
        if pair[0].mtype is MType.temp_preference:
            wishes.setdefault(topic_base(pair[0].key), pair)
    if not wishes:
        return chosen
    ordered: dict[str, Ranked] = {}
    for pair in chosen:
        wish = wishes.get(pair[0].key) if pair[0].mtype is MType.preference else None
        if wish is not None:
            ordered.setdefault(wish[0].id, wish)
        ordered.setdefault(pair[0].id, pair)
    return list(ordered.values())[:k]


def to_hit(memory: Memory, scores: dict[str, float], *, disputed: bool = False) -> Hit:
    return Hit(id=memory.id, content=memory.content, dir=memory.dir, mtype=memory.mtype, key=memory.key,
               status=memory.status, tier=memory.tier, confidence=memory.confidence, score=scores["final"],
               scores=scores, source_event_ids=memory.source_event_ids,
               created_at=memory.created_at, contested=disputed or memory.status is Status.contested,
               about=memory.about)
