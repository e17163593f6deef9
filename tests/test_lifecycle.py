"""The lifecycle planners (pipeline/lifecycle.py): decay, promotion, patterns, review, rollback,
and what resolve does with an archived memory. Pure: time is a parameter, nothing sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memflow.pipeline.extract import extract
from memflow.pipeline.ids import episode_id, episode_key, memory_id
from memflow.pipeline.lifecycle import (
    Policy,
    day_sessions,
    durable,
    plan_accept,
    plan_decay,
    plan_patterns,
    plan_promotions,
    plan_reject,
    plan_review,
    plan_rollback,
)
from memflow.pipeline.models import (
    Action,
    Candidate,
    Dir,
    ExtractTask,
    Memory,
    MType,
    PatchOp,
    Role,
    Source,
    Status,
    Tier,
    TriggerReason,
    Turn,
)
from memflow.pipeline.resolve import Neighbour, apply_patch, decide

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
POLICY = Policy()


def memory(content: str, key: str = "location.city", *, mtype: MType = MType.fact, at: datetime = T0,
           tier: Tier = Tier.short_term, status: Status = Status.active, version: int = 1,
           sessions: tuple[str, ...] = ("s1",), events: tuple[str, ...] = ("e1",), **extra: Any) -> Memory:
    dirs = {MType.preference: Dir.preferences, MType.episode: Dir.events, MType.event: Dir.events}
    return Memory(id=extra.pop("id", memory_id("u1", key, version)), subject="u1", uri=f"mem://u1/x/{key}",
                  dir=dirs.get(mtype, Dir.entities), mtype=mtype, key=key, content=content, confidence=0.9,
                  source=extra.pop("source", Source.explicit), status=status, tier=tier, created_at=at,
                  updated_at=at, version=version, session_ids=list(sessions), source_event_ids=list(events), **extra)


def episode(text: str, event: str, at: datetime = T0) -> Memory:
    return memory(text, episode_key(event), mtype=MType.episode, at=at, events=(event,),
                  id=episode_id("u1", event), evidence=text)


def apply(memories: list[Memory], steps: list[Any]) -> list[Memory]:
    changed = {st.memory.id: st.fields for st in steps}
    return [m.model_copy(update=_typed(changed[m.id])) if m.id in changed else m for m in memories]


def _typed(fields: dict[str, Any]) -> dict[str, Any]:
    return Memory.model_validate(memory("x").model_dump() | fields).model_dump(include=set(fields))


# -- decay ------------------------------------------------------------------------------


def test_session_context_fades_within_days_while_a_long_term_preference_stays_a_year() -> None:
    context = memory("我正在写第三版方案", "context.draft", mtype=MType.session_context, events=("e1",))
    liking = memory("我平时喜欢去海边度假", "travel.holiday", mtype=MType.preference, tier=Tier.long_term,
                    events=("e2",), version=1)
    year = T0 + timedelta(days=365)
    steps = {st.memory.id: st for st in plan_decay([context, liking], T0 + timedelta(days=5), POLICY)}
    assert steps[context.id].fields["status"] == "archived" and steps[context.id].fields["tier"] == "archive"
    later = {st.memory.id: st for st in plan_decay([context, liking], year, POLICY)}
    assert later[liking.id].fields.keys() == {"strength", "strength_at"}
    assert 0.01 < later[liking.id].fields["strength"] < 0.1


def test_a_short_term_preference_unused_for_eight_months_is_archived_a_long_term_one_is_not() -> None:
    short = memory("喜欢深色主题", "ui.theme", mtype=MType.preference)
    long = short.model_copy(update={"tier": Tier.long_term, "id": "other"})
    steps = {st.memory.id: st.fields for st in plan_decay([short, long], T0 + timedelta(days=240), POLICY)}
    assert steps[short.id]["status"] == "archived" and "status" not in steps[long.id]


def test_an_event_is_archived_when_it_is_over_and_takes_its_record_along() -> None:
    trip = memory("下个月要去日本出差一周", "event.japan", mtype=MType.event, events=("e1",),
                  expires_at=T0 + timedelta(days=40))
    record = episode("我下个月要去日本出差一周。", "e1")
    other = episode("我平时喜欢去海边度假。", "e2")
    liking = memory("我平时喜欢去海边度假", "travel.holiday", mtype=MType.preference, events=("e2",),
                    tier=Tier.long_term)
    world = [trip, record, other, liking]
    assert all("status" not in st.fields for st in plan_decay(world, T0 + timedelta(days=39), POLICY))
    steps = {st.memory.id: st for st in plan_decay(world, T0 + timedelta(days=41), POLICY)}
    assert steps[trip.id].fields["status"] == "archived" and "expired" in steps[trip.id].why
    assert steps[record.id].fields["status"] == "archived" and "transient" in steps[record.id].why
    assert other.id not in steps or "status" not in steps[other.id].fields


def test_a_record_that_also_said_something_lasting_keeps_its_own_decay() -> None:
    context = memory("今天下午三点开评审会", "context.review", mtype=MType.session_context, events=("e1",))
    lasting = memory("偏好要点式文档", "doc.style", mtype=MType.preference, events=("e1",), tier=Tier.long_term)
    record = episode("今天下午三点开评审会；我一直偏好要点式文档。", "e1")
    steps = {st.memory.id: st for st in plan_decay([context, lasting, record], T0 + timedelta(days=30), POLICY)}
    assert steps[context.id].fields["status"] == "archived"
    assert "status" not in steps[record.id].fields


def test_pinned_and_system_memories_never_decay() -> None:
    pinned = memory("合同已签署", "contract", pinned=True)
    steps = plan_decay([pinned], T0 + timedelta(days=3000), POLICY)
    assert steps == []


def test_decay_by_tier_touches_only_that_tier() -> None:
    short = memory("a", "k.a", mtype=MType.session_context)
    long = memory("b", "k.b", mtype=MType.preference, tier=Tier.long_term)
    later = T0 + timedelta(days=10)
    assert {st.memory.id for st in plan_decay([short, long], later, POLICY, Tier.short_term)} == {short.id}
    assert {st.memory.id for st in plan_decay([short, long], later, POLICY, Tier.long_term)} == {long.id}


def test_a_decay_run_with_an_earlier_now_never_raises_strength() -> None:
    m = memory("喜欢深色主题", "ui.theme", mtype=MType.preference)
    m = apply([m], plan_decay([m], T0 + timedelta(days=60), POLICY))[0]
    earlier = plan_decay([m], T0 + timedelta(days=10), POLICY)
    assert earlier == []
    used = m.model_copy(update={"last_accessed_at": T0 + timedelta(days=61)})
    assert plan_decay([used], T0 + timedelta(days=62), POLICY)[0].fields["strength"] > m.strength


# -- consolidation ----------------------------------------------------------------------


def test_a_key_seen_in_three_sessions_is_promoted_and_superseded_ones_do_not_count() -> None:
    inferred = memory("偏好简短回答", "reply.length", mtype=MType.preference, source=Source.inferred,
                      sessions=("s1", "s2"))
    wrong = memory("偏好长回答", "reply.length", mtype=MType.preference, status=Status.superseded, version=2,
                   sessions=("s3", "s4"))
    assert plan_promotions([inferred, wrong], POLICY) == []
    seen = inferred.model_copy(update={"session_ids": ["s1", "s2", "s5"]})
    (step,) = plan_promotions([seen, wrong], POLICY)
    assert step.fields == {"tier": "long_term", "source": "repeated", "confidence": 0.9}


def test_records_and_passing_states_are_never_promoted() -> None:
    ctx = memory("正在写方案", "context.x", mtype=MType.session_context, sessions=("a", "b", "c"))
    assert plan_promotions([ctx], POLICY) == []


def test_a_topic_in_three_sessions_this_week_becomes_one_pattern_once() -> None:
    now = T0 + timedelta(days=6)
    found = [memory(f"项目 A 用 PostgreSQL {i}", "project.a.db", mtype=MType.fact, version=i + 1,
                    status=Status.contested, at=T0 + timedelta(days=i), sessions=(f"s{i}",), events=(f"e{i}",))
             for i in range(3)]
    (pattern,) = plan_patterns(found, now, POLICY)
    assert pattern.mtype is MType.pattern and pattern.dir is Dir.patterns and pattern.key == "pattern.project.a.db"
    assert "3 sessions" in pattern.content and sorted(pattern.source_event_ids) == ["e0", "e1", "e2"]
    assert plan_patterns([*found, pattern], now, POLICY) == []
    assert plan_patterns(found, T0 + timedelta(days=9), POLICY) == []  # the first one left the 7-day window


def test_consolidation_rereads_the_days_records_and_holds_a_found_rule_for_review() -> None:
    records = [episode("以后永远不要在周末给我发消息。", "e1"), episode("我喜欢用 vim 写代码。", "e2")]
    records = [r.model_copy(update={"session_ids": ["s1"]}) for r in records]
    tasks = day_sessions(records, T0 + timedelta(hours=2))
    assert [len(t.turns) for t in tasks] == [2] and tasks[0].turns[0].role is Role.user
    found = durable(c for t in tasks for c in extract(t))
    rules = [c for c in found if c.mtype is MType.rule]
    assert rules and all(c.source is Source.derived for c in rules)
    assert decide(rules[0], []).action is Action.review
    assert any(c.mtype is MType.preference for c in found)
    assert day_sessions(records, T0 + timedelta(days=2)) == []


# -- review -----------------------------------------------------------------------------


def _contested(now: datetime) -> tuple[Memory, Memory]:
    a = memory("住在北京", version=1, status=Status.contested, sessions=("s1",), at=now)
    b = memory("住在上海", version=2, status=Status.contested, sessions=("s2",), at=now)
    return a.model_copy(update={"conflicts_with": [b.id]}), b.model_copy(update={"conflicts_with": [a.id]})


def test_review_waits_for_the_timeout_then_lets_newer_evidence_decide() -> None:
    a, b = _contested(T0)
    assert plan_review([a, b], T0 + timedelta(days=1), POLICY).steps == []
    later = T0 + timedelta(days=8)
    tie = plan_review([a, b], later, POLICY)
    assert tie.steps == [] and {m.id for m in tie.undecided} == {a.id, b.id}
    b2 = b.model_copy(update={"session_ids": ["s2", "s3"]})
    verdict = plan_review([a, b2], later, POLICY)
    fields = {st.memory.id: st.fields for st in verdict.steps}
    assert fields[b.id]["status"] == "active" and fields[a.id]["status"] == "superseded"
    assert fields[a.id]["superseded_by"] == b.id and verdict.undecided == []


def test_review_weighs_what_was_gathered_since_the_contest_and_retires_the_losers_records() -> None:
    # VS Code was adopted six times before Neovim was said: that made the contest, it does not decide it.
    vscode = memory("喜欢用 VS Code", "tool.editor", mtype=MType.preference, status=Status.contested, events=("e1",),
                    access_count=6, contested_support=7)
    neovim = memory("更喜欢用 Neovim", "tool.editor", mtype=MType.preference, status=Status.contested, version=2,
                    at=T0 + timedelta(days=40), sessions=("s2",), events=("e2",), contested_support=1)
    # Nothing new on either side: the support in all decides (one remark against six adoptions).
    unchanged = {st.memory.id: st.fields["status"] for st in plan_review([vscode, neovim], T0 + timedelta(days=48),
                                                                         POLICY).steps}
    assert unchanged == {vscode.id: "active", neovim.id: "superseded"}
    # Restated three days into the contest: evidence, and no reason to wait a week more.
    neovim = neovim.model_copy(update={"session_ids": ["s2", "s3"], "source_event_ids": ["e2", "e3"],
                                       "updated_at": T0 + timedelta(days=43)})
    record = episode("我写代码喜欢用 VS Code 编辑器。", "e1")
    verdict = plan_review([vscode, neovim, record], T0 + timedelta(days=48), POLICY)
    fields = {st.memory.id: st.fields for st in verdict.steps}
    assert fields[neovim.id]["status"] == "active"
    assert fields[vscode.id]["status"] == fields[record.id]["status"] == "superseded"
    assert fields[record.id]["superseded_by"] == neovim.id and verdict.undecided == []


def test_accept_supersedes_the_rival_and_reject_frees_it() -> None:
    a, b = _contested(T0)
    accepted = {st.memory.id: st.fields for st in plan_accept(b, [a, b], T0)}
    assert accepted == {b.id: {"status": "active", "conflicts_with": []},
                        a.id: {"status": "superseded", "superseded_by": b.id, "valid_to": T0}}
    rejected = {st.memory.id: st.fields for st in plan_reject(b, [a, b])}
    assert rejected == {b.id: {"status": "deleted"}, a.id: {"conflicts_with": [], "status": "active"}}
    with pytest.raises(ValueError, match="only pending_review or contested"):
        plan_accept(memory("x"), [], T0)


# -- rollback ---------------------------------------------------------------------------


def test_rollback_restores_an_old_version_on_top_and_twice_is_once() -> None:
    v1 = memory("住在北京", version=1, status=Status.superseded)
    v2 = memory("住在上海", version=2, at=T0 + timedelta(days=1), supersedes=v1.id)
    plan = plan_rollback([v1, v2], 1, T0 + timedelta(days=2))
    assert plan.restored is not None
    assert (plan.restored.version, plan.restored.content, plan.restored.status) == (3, "住在北京", Status.active)
    assert plan.restored.id == memory_id("u1", "location.city", 3) and plan.restored.supersedes == v2.id
    assert [(st.memory.id, st.fields["status"]) for st in plan.steps] == [(v2.id, "superseded")]
    after = [v1, *apply([v2], plan.steps), plan.restored]
    assert plan_rollback(after, 1, T0 + timedelta(days=3)).restored is None
    with pytest.raises(ValueError, match="no version 9"):
        plan_rollback(after, 9, T0)


# -- resolve and the archive ------------------------------------------------------------


def _cand(content: str, key: str, *, mtype: MType = MType.preference, at: datetime = T0) -> Candidate:
    return Candidate(subject="u1", session_id="s9", mtype=mtype, dir=Dir.preferences, key=key, content=content,
                     confidence=0.9, source=Source.explicit, source_event_ids=["e9"], ts=at)


def test_a_later_mention_of_an_archived_memory_brings_it_back_less_trusted() -> None:
    old = memory("喜欢深色主题", "ui.theme", mtype=MType.preference, status=Status.archived, tier=Tier.archive)
    later = T0 + timedelta(days=400)
    batch = decide(_cand("喜欢深色主题", "ui.theme", at=later), [Neighbour(old, 1.0)])
    assert batch.action is Action.reactivate
    (op,) = batch.ops
    assert isinstance(op, PatchOp)
    revived = apply_patch(old, op, later)
    assert revived.status is Status.active and revived.confidence == pytest.approx(0.72)
    assert revived.updated_at == later and "e9" in revived.source_event_ids
    assert revived.revisions[-1].before["status"] == "archived"


def test_a_shorter_mention_brings_back_the_archived_memory_that_says_it_in_full() -> None:
    old = memory("I love sea kayaking on calm mornings around the San Juan Islands", "preference.kayak",
                 mtype=MType.preference, status=Status.archived, tier=Tier.archive)
    mention = _cand("I love sea kayaking on calm mornings", "preference.kayak.short", at=T0 + timedelta(days=450))
    assert decide(mention, [Neighbour(old, 0.85)]).action is Action.reactivate
    denied = _cand("I don't love sea kayaking on calm mornings", "preference.kayak.not", at=T0 + timedelta(days=450))
    assert decide(denied, [Neighbour(old, 0.85)]).action is Action.add
    # Its key has a live value since: the archived one stays history.
    live = memory("I love sea kayaking at dawn", "preference.kayak", mtype=MType.preference, version=2)
    assert decide(mention, [Neighbour(old, 0.85), Neighbour(live, 0.8)]).action is Action.add


def test_a_new_value_on_an_archived_key_is_a_new_version_and_the_archive_stays() -> None:
    old = memory("喜欢深色主题", "ui.theme", mtype=MType.preference, status=Status.archived, tier=Tier.archive)
    batch = decide(_cand("喜欢浅色主题", "ui.theme", at=T0 + timedelta(days=400)), [Neighbour(old, 0.8)])
    assert batch.action is Action.add and len(batch.ops) == 1


def test_apply_patch_logs_a_revision_for_a_change_of_state_but_not_for_a_repeat() -> None:
    m = memory("住在北京")
    op = PatchOp(id=m.id, expected_rev=1, set={"status": "contested"}, why="a rival")
    contested = apply_patch(m, op, T0)
    assert [(r.rev, r.why, r.before) for r in contested.revisions] == [(2, "a rival", {"status": "active"})]
    repeat = PatchOp(id=m.id, expected_rev=2, add_source_event_ids=["e7"], why="repeat")
    assert apply_patch(contested, repeat, T0).revisions == contested.revisions


def test_an_inferred_or_found_rule_waits_for_review_but_a_stated_one_does_not() -> None:
    for source, action in ((Source.derived, Action.review), (Source.inferred, Action.review),
                           (Source.explicit, Action.add)):
        rule = Candidate(subject="u1", mtype=MType.rule, dir=Dir.system, key="rule.weekend", content="周末不发消息",
                         confidence=0.9, source=source, source_event_ids=["e1"], ts=T0)
        assert decide(rule, []).action is action


def test_a_task_of_the_day_has_its_turns_in_order() -> None:
    records = [episode("b", "e2", T0 + timedelta(minutes=1)), episode("a", "e1", T0)]
    records = [r.model_copy(update={"session_ids": ["s1"]}) for r in records]
    (task,) = day_sessions(records, T0 + timedelta(hours=1))
    assert isinstance(task, ExtractTask) and task.reason is TriggerReason.session_end
    assert [t.text for t in task.turns] == ["a", "b"] and isinstance(task.turns[0], Turn)
