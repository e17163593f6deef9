"""Route fusion and the plan switches of the read path (pure)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from memflow.pipeline.models import Dir, Memory, MType, Period, QueryPlan, Route, Source, Tier
from memflow.pipeline.score import (
    Found,
    Lifecycle,
    collapse_records,
    confirmed_scopes,
    dense_scaler,
    flat_plan,
    fuse,
    fuse_found,
    in_period,
    lifecycle_scores,
    noise_floor,
    normalised,
    rank,
    reweight,
    second_look,
    smoothed,
    strength,
    unscoped,
    visible_at,
    with_reserved,
    within_quotas,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def memory(mid: str, **extra: object) -> Memory:
    fields = {"id": mid, "subject": "s", "uri": f"mem://s/general/{mid}", "dir": Dir.general, "mtype": MType.fact,
              "key": mid, "content": f"content {mid}", "confidence": 0.9, "source": Source.explicit,
              "created_at": T0, "updated_at": T0} | extra
    return Memory.model_validate(fields)


def test_rrf_fusion_adds_up_ranks_and_respects_weights() -> None:
    a, b, c = memory("a"), memory("b"), memory("c")
    fused = fuse([(1.0, [(a, 9.0), (b, 1.0)]), (1.0, [(c, 5.0), (b, 4.0)])], "rrf")
    assert [m.id for m, _ in fused] == ["b", "a", "c"]
    assert fused[0][1] == 1 / 62 + 1 / 62
    assert [m.id for m, _ in fuse([(0.2, [(a, 1.0)]), (1.0, [(b, 1.0)])], "rrf")] == ["b", "a"]
    assert fuse([]) == []


def test_score_fusion_sums_weighted_normalised_scores() -> None:
    a, b, c = memory("a"), memory("b"), memory("c")
    keyword = normalised([(a, 8.0), (b, 2.0)])
    assert [s for _, s in keyword] == [1.0, 0.25]
    meaning = normalised([(b, 0.6), (c, 0.5), (a, 0.1)], floor=0.2)
    assert [round(s, 6) for _, s in meaning] == [1.0, 0.75, 0.0]
    fused = fuse([(1.0, keyword), (0.7, meaning)])
    assert [(m.id, round(s, 6)) for m, s in fused] == [("a", 1.0), ("b", 0.95), ("c", 0.525)]
    assert normalised([]) == [] and normalised([(a, 0.0)]) == [(a, 1.0)]


def test_plan_switches() -> None:
    plan = QueryPlan(intent="preference_query", routes=[Route(text="q", dirs=[Dir.preferences]), Route(text="q")])
    assert all(r.dirs == [] for r in unscoped(plan).routes)
    weighted = reweight(plan, whole_subject=0.7, exact_match=0.0, bm25=0.5, topic=0.5)
    assert [r.weight for r in weighted.routes] == [1.0, 0.7]
    exact = QueryPlan(intent="entity_recall", routes=[Route(text="q", dirs=[Dir.entities]),
                                                       Route(text="Mia", dirs=[Dir.entities], strategy="exact_match")])
    assert [r.strategy for r in reweight(exact, whole_subject=0.3, exact_match=0.0, bm25=0.5, topic=0.5).routes] == ["semantic"]
    assert flat_plan("q").routes == [Route(text="q")]


def test_rank_hides_the_future_and_the_expired_and_flags_contested() -> None:
    now = T0 + timedelta(days=10)
    later = memory("later", created_at=now + timedelta(seconds=1))
    expired = memory("expired", expires_at=now - timedelta(seconds=1))
    contested = memory("contested", status="contested")
    assert not visible_at(later, now) and not visible_at(expired, now)
    hits = rank([(later, 3.0), (expired, 2.0), (contested, 1.0)], now, k=5)
    assert [h.id for h in hits] == ["contested"] and hits[0].contested


def test_a_record_of_only_contested_statements_is_flagged_like_them() -> None:
    wish = memory("wish", mtype=MType.preference, status="contested", source_event_ids=["e2"], content="Keep it short")
    said = memory("said", mtype=MType.episode, source_event_ids=["e2"], content="Ugh, too long. Keep it short.")
    other = memory("other", mtype=MType.episode, source_event_ids=["e3"])
    hits = {h.id: h.contested for h in rank([(said, 0.9), (wish, 0.8), (other, 0.5)], T0, 5, collapse=True)}
    assert hits == {"said": True, "wish": True, "other": False}


def test_a_live_temporary_wish_speaks_before_the_standing_preference_of_its_topic() -> None:
    standing = memory("standing", mtype=MType.preference, key="reply.length", tier=Tier.long_term)
    wish = memory("wish", mtype=MType.temp_preference, key="reply.length.now", expires_at=T0 + timedelta(days=1))
    chatter = [memory(f"c{i}") for i in range(4)]
    found = [(standing, 1.0), *[(c, 0.9) for c in chatter], (wish, 0.1)]
    assert [h.id for h in rank(found, T0 + timedelta(hours=1), 3, Lifecycle())] == ["wish", "standing", "c0"]
    assert [h.id for h in rank(found, T0 + timedelta(days=2), 3, Lifecycle())] == ["standing", "c0", "c1"]


# -- lifecycle scoring --------------------------------------------------------------

TAUS = {"session_context": 48.0, "preference": 90 * 24.0}


def test_strength_decays_by_type_from_the_last_use_and_never_for_pinned_or_system() -> None:
    chat = memory("chat", mtype=MType.session_context)
    assert strength(chat, T0, TAUS) == 1.0
    assert abs(strength(chat, T0 + timedelta(hours=48), TAUS) - math.exp(-1)) < 1e-9
    used = chat.model_copy(update={"last_accessed_at": T0 + timedelta(hours=48)})
    assert strength(used, T0 + timedelta(hours=48), TAUS) == 1.0  # an access refreshes it
    pref = memory("pref", mtype=MType.preference)
    later = T0 + timedelta(days=30)
    assert strength(pref, later, TAUS) > strength(chat, later, TAUS)
    assert strength(memory("rule", dir=Dir.system, mtype=MType.session_context), later, TAUS) == 1.0
    assert strength(memory("pinned", pinned=True, mtype=MType.session_context), later, TAUS) == 1.0
    assert strength(memory("untabled", mtype=MType.skill), later, TAUS) == 1.0  # no τ: never decays


def test_lifecycle_factors_multiply_and_hotness_is_capped_and_not_for_system() -> None:
    cfg = Lifecycle(tau_hours=TAUS, floor=0.5, hotness_step=0.05, hotness_cap=0.5, long_term_bonus=0.15)
    hot = memory("hot", access_count=100, tier=Tier.long_term)
    scores = lifecycle_scores(hot, 2.0, T0, cfg)
    assert scores["hotness"] == 1.5 and scores["tier"] == 1.15 and scores["final"] == 2.0 * 1.5 * 1.15
    assert lifecycle_scores(memory("sys", dir=Dir.system, access_count=100), 1.0, T0, cfg)["hotness"] == 1.0
    stale = memory("stale", mtype=MType.session_context)
    faded = lifecycle_scores(stale, 1.0, T0 + timedelta(days=60), cfg)
    assert 0.5 <= faded["final"] < 0.51  # the floor: relevance still counts however old
    assert lifecycle_scores(hot, 2.0, T0, Lifecycle.off()) == {"relevance": 2.0, "final": 2.0}


def test_a_fresh_short_lived_memory_loses_to_a_long_term_preference_of_equal_relevance() -> None:
    now = T0 + timedelta(days=5)
    chatter = memory("chatter", mtype=MType.session_context, created_at=now, updated_at=now)
    old_pref = memory("pref", mtype=MType.preference, tier=Tier.long_term, access_count=4)
    cfg = Lifecycle(tau_hours=TAUS)
    assert [h.id for h in rank([(chatter, 1.0), (old_pref, 0.98)], now, 2, cfg)] == ["pref", "chatter"]
    assert [h.id for h in rank([(chatter, 1.0), (old_pref, 0.98)], now, 2)] == ["chatter", "pref"]


def test_quotas_keep_one_type_from_filling_the_top_k_but_never_return_fewer() -> None:
    chats = [(memory(f"c{i}", mtype=MType.session_context), {"final": 1.0 - i / 100}) for i in range(5)]
    pref = (memory("p", mtype=MType.preference), {"final": 0.1})
    picked = within_quotas([*chats, pref], 5, {"session_context": 0.4})
    assert [m.id for m, _ in picked] == ["c0", "c1", "p", "c2", "c3"]
    assert [m.id for m, _ in within_quotas(chats, 3, {"session_context": 0.4})] == ["c0", "c1", "c2"]


def test_an_episode_gives_way_to_what_was_distilled_from_the_same_turn() -> None:
    episode = memory("ep", mtype=MType.episode, source_event_ids=["e1"], content="Mel: I prefer short answers.")
    fact = memory("fact", source_event_ids=["e1", "e7"], content="Mel: I prefer short answers")
    other = memory("other-ep", mtype=MType.episode, source_event_ids=["e2"])
    both = memory("both", mtype=MType.episode, source_event_ids=["e1", "e3"])  # e3 is covered by no memory
    collapsed = collapse_records([(episode, 0.9), (other, 0.5), (fact, 0.3), (both, 0.2)])
    assert [(m.id, s) for m, s in collapsed] == [("other-ep", 0.5), ("fact", 0.9), ("both", 0.2)]
    assert [h.id for h in rank([(episode, 0.9), (fact, 0.3)], T0, 5, collapse=True)] == ["fact"]
    # The turn said more than was distilled from it: the episode stays.
    longer = episode.model_copy(update={"content": "Mel: I prefer short answers; keep any example under 10 lines."})
    assert [m.id for m, _ in collapse_records([(longer, 0.9), (fact, 0.3)])] == ["ep", "fact"]


def test_smoothing_lifts_a_turn_by_the_turns_its_context_came_from() -> None:
    question = memory("q", mtype=MType.episode, source_event_ids=["e1"], context_event_ids=["e2"])
    answer = memory("a", mtype=MType.episode, source_event_ids=["e2"], context_event_ids=["e1", "e3"])
    loner = memory("l", mtype=MType.episode, source_event_ids=["e9"], context_event_ids=["e8"])
    lifted = smoothed([(question, 1.0), (loner, 0.8), (answer, 0.6)], 0.3)
    assert [(m.id, round(s, 6)) for m, s in lifted] == [("q", 1.18), ("a", 0.9), ("l", 0.8)]
    assert smoothed([(loner, 0.8)], 0.0) == [(loner, 0.8)]


def test_a_scoped_route_boosts_its_dirs_but_cannot_lift_a_weak_match_to_the_top() -> None:
    strong, weak = memory("strong"), memory("weak", dir=Dir.preferences)
    whole = Found(1.0, keyword=[(strong, 10.0), (weak, 2.0)], dense=[(strong, 0.8), (weak, 0.3)])
    scoped = Found(1.0, keyword=[(weak, 2.0)], dense=[(weak, 0.3)])  # its best is weak, and stays weak
    fused = fuse_found([whole, scoped], dense_weight=0.5)
    assert [m.id for m, _ in fused] == ["strong", "weak"]
    weak_score = (1.0 + 1.0) * (2.0 / 10.0 + 0.5 * 0.3 / 0.8)
    assert abs(dict((m.id, s) for m, s in fused)["weak"] - weak_score) < 1e-9
    assert Found(1.0).empty and not whole.empty


def test_a_relevant_long_term_preference_keeps_a_place_among_chatter() -> None:
    chatter = [(memory(f"c{i}", mtype=MType.event), {"final": 1.0 - i / 100}) for i in range(5)]
    pref = (memory("p", mtype=MType.preference, tier=Tier.long_term), {"final": 0.4})
    faint = (memory("f", mtype=MType.preference, tier=Tier.long_term), {"final": 0.1})
    ranked = [*chatter, pref, faint]
    picked = with_reserved(chatter, ranked, {"preference": 1}, 0.25)
    assert [m.id for m, _ in picked] == ["c0", "c1", "c2", "c3", "p"]  # the weakest chatter gave way
    assert with_reserved(chatter, [*chatter, faint], {"preference": 1}, 0.25) == chatter  # too weak to matter
    short = (memory("s", mtype=MType.preference), {"final": 0.9})  # an inference on probation: no place kept
    assert with_reserved(chatter, [*chatter, short], {"preference": 1}, 0.25) == chatter
    assert with_reserved([pref, *chatter[:4]], ranked, {"preference": 1}, 0.25) == [pref, *chatter[:4]]


def test_a_topic_key_route_adds_a_flat_score_to_what_is_stored_under_the_key() -> None:
    chatter, manager = memory("chatter"), memory("manager", key="person.manager")
    whole = Found(1.0, keyword=[(chatter, 4.0)], dense=[(chatter, 0.6), (manager, 0.3)])
    keyed = Found(0.5, keyword=[], dense=[(manager, 0.3)], flat=True)
    fused = dict((m.id, round(s, 6)) for m, s in fuse_found([whole, keyed], dense_weight=0.3))
    assert fused == {"chatter": 1.3, "manager": round(0.3 * 0.5 + 0.5, 6)}


def test_a_scoped_route_whose_dirs_miss_the_best_match_is_dropped_and_one_that_holds_it_stays() -> None:
    best, rule, chat = memory("best"), memory("rule", dir=Dir.system), memory("chat")
    whole = Found(1.0, keyword=[(best, 8.0), (rule, 2.0), (chat, 1.0)])
    weak_scope = Found(1.0, keyword=[(rule, 2.0)])
    kept = confirmed_scopes([whole, weak_scope], [False, True], 0, min_share=0.8, dense_weight=0.3)
    assert [f.weight for f in kept] == [1.0, 0.0]
    assert [m.id for m, _ in fuse_found(kept, dense_weight=0.3)][:1] == ["best"]
    # Planned dirs that hold a match close to the whole subject's best keep their boost.
    near = Found(1.0, keyword=[(rule, 7.0)])
    whole_near = Found(1.0, keyword=[(best, 8.0), (rule, 7.0)])
    assert [f.weight for f in confirmed_scopes([whole_near, near], [False, True], 0, min_share=0.8,
                                               dense_weight=0.3)] == [1.0, 1.0]
    # Dense evidence counts on the same scale as in fusion.
    dense_scope = Found(1.0, dense=[(rule, 0.9)])
    mixed = confirmed_scopes([Found(1.0, keyword=[(best, 8.0)], dense=[(rule, 0.9)]), dense_scope], [False, True], 0,
                             min_share=0.3, dense_weight=0.5)
    assert [f.weight for f in mixed] == [1.0, 1.0]


def test_a_query_s_noise_floor_is_its_best_cosine_with_unrelated_text() -> None:
    """e5 scores unrelated text 0.74–0.86: against a floor of 0 every candidate would look nearly as
    good as the best. What the query scores against text about nothing it asks is the floor."""
    query = [1.0, 0.0, 0.0]
    unrelated = [[0.8, 0.6, 0.0], [0.6, 0.0, 0.8]]
    assert noise_floor(query, unrelated) == 0.8
    assert noise_floor(query, []) == 0.0
    a, b, c = memory("a"), memory("b"), memory("c")
    route = Found(1.0, dense=[(a, 0.92), (b, 0.86), (c, 0.78)])
    assert [round(v, 6) for _, v in dense_scaler([route], 0.8)(route.dense)] == [1.0, 0.5, 0.0]
    weak = Found(1.0, dense=[(a, 0.7)])
    assert dense_scaler([weak], 0.8)(weak.dense) == [(a, 1.0)]  # nothing beats the floor: no spread
    spread = dict((m.id, round(s, 6)) for m, s in fuse_found([route], dense_weight=1.0, dense_floor=0.8))
    assert spread == {"a": 1.0, "b": 0.5, "c": 0.0}
    flat = dict((m.id, round(s, 6)) for m, s in fuse_found([route], dense_weight=1.0))
    assert flat["c"] > 0.84


def test_each_memory_is_measured_against_the_noise_floor_of_its_language() -> None:
    """A Chinese query comes closer to unrelated Chinese than to an English answer: one floor for both would zero
    every cross-lingual match."""
    zh, en = memory("zh").model_copy(update={"content": "办公室的空调总是太冷"}), memory("en")
    route = Found(1.0, dense=[(zh, 0.86), (en, 0.80)])
    scaled = dict((m.id, round(v, 6)) for m, v in dense_scaler([route], {"zh": 0.84, "en": 0.76})(route.dense))
    assert scaled == {"zh": 0.5, "en": 1.0}
    assert dict((m.id, v) for m, v in dense_scaler([route], 0.84)(route.dense))["en"] == 0.0


def test_what_was_said_in_the_period_asked_about_ranks_higher_but_nothing_is_dropped() -> None:
    before, inside, after = (memory(m, created_at=T0 + timedelta(days=d)) for m, d in (("b", -3), ("i", 0), ("a", 1)))
    period = Period(start=T0 - timedelta(hours=1), end=T0 + timedelta(days=1), label="that day")
    found = [(before, 1.0), (after, 0.9), (inside, 0.6)]
    lifted = in_period(found, period, boost=1.0)
    assert [(m.id, s) for m, s in lifted] == [("i", 1.2), ("b", 1.0), ("a", 0.9)]  # end is exclusive
    assert in_period(found, period, boost=0.0) == found and in_period(found, None, boost=1.0) == found


def test_the_second_look_reorders_the_head_by_the_judge_and_keeps_the_tail_below() -> None:
    shares, answer, near, tail = memory("shares-a-word"), memory("answer"), memory("near"), memory("tail")
    fused = [(shares, 2.0), (answer, 1.0), (near, 0.9), (tail, 0.8)]
    looked = second_look(fused, [0.0, 0.2, 0.1], weight=0.7)  # the judge saw the head of three
    assert [m.id for m, _ in looked] == ["answer", "near", "shares-a-word", "tail"]
    # the head's best margin gains weight × the head's best relevance; a margin ≤ 0 gains nothing
    assert dict((m.id, round(s, 6)) for m, s in looked) == {
        "answer": round(0.3 * 1.0 + 0.7 * 2.0, 6), "near": round(0.3 * 0.9 + 0.7 * 1.0, 6),
        "shares-a-word": round(0.3 * 2.0, 6), "tail": round(0.3 * 0.8, 6)}
    assert max(s for _, s in looked if _.id == "tail") < min(s for m, s in looked if m.id != "tail")


def test_a_judge_with_nothing_to_say_leaves_the_list_as_it_was() -> None:
    fused = [(memory("a"), 2.0), (memory("b"), 1.0)]
    assert second_look(fused, [-0.1, 0.0], weight=0.7) == fused  # every margin at or below the noise floor
    assert second_look(fused, [0.3, 0.1], weight=0.0) == fused
    assert second_look([], [], weight=0.7) == []
