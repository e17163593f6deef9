"""Whom a memory is about (pipeline/holders.py): read from statements and questions in Chinese and English, part
of a memory's identity on the write path, and a ranking factor that ranks down but never out."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.pipeline import llm_extract
from memflow.pipeline.extract import extract
from memflow.pipeline.holders import SELF, asked_holder, held_key, holder_named, holder_of, matches, people
from memflow.pipeline.ids import new_memory
from memflow.pipeline.lifecycle import Policy, plan_patterns, plan_review
from memflow.pipeline.models import (
    Action,
    Candidate,
    Dir,
    ExtractTask,
    Hit,
    MType,
    PatchOp,
    Role,
    Source,
    Status,
    Tier,
    TriggerReason,
    Turn,
)
from memflow.pipeline.pack import pack
from memflow.pipeline.pending import about_to_write
from memflow.pipeline.plan import plan
from memflow.pipeline.resolve import Neighbour, decide
from memflow.pipeline.score import by_holder
from memflow.pipeline.tagging import TAG_VERSION, retag

T0 = datetime(2026, 6, 10, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(("statement", "holder"), [
    ("I'm vegetarian.", SELF),
    ("I drive my son to school every morning.", SELF),  # the subject holds it, not every person named
    ("We have a grey tabby called Mochi.", SELF),
    ("Peanuts make my throat swell up.", SELF),  # a capitalised word is no person
    ("My wife is on a keto diet.", "wife"),
    ("Oh, my mom loves gardening.", "mother"),
    ("Mom loves gardening.", "mother"),
    ("Momentum matters more than speed.", SELF),
    ("My sister-in-law works at a bank.", "sister_in_law"),  # never read as "sister"
    ("My wife's sister Anna lives in Oslo.", "wife.sister:anna"),
    ("Our kids love the beach.", "child"),
    ("我住在苏州。", SELF),
    ("我们部门周五聚餐。", SELF),
    ("哥伦比亚咖啡很好喝。", SELF),  # 哥 starts a word here, not a brother
    ("我老公的生日是八月十号。", "husband"),
    ("我老婆的爱好是烘焙。", "wife"),
    ("我哥在北京工作。", "brother"),
    ("我女朋友住在新加坡。", "girlfriend"),  # never read as 朋友
    ("邻居家的孩子晚上很吵。", "neighbour.child"),
    ("我朋友小李住在深圳。", "friend:小李"),
    ("我同事王芳下个月辞职。", "colleague:王芳"),
])
def test_the_holder_of_a_statement_is_its_subject(statement: str, holder: str) -> None:
    assert holder_of(statement) == holder


@pytest.mark.parametrize(("question", "holder"), [
    ("What diet do I follow?", SELF),
    ("Where does my husband work?", "husband"),
    ("Is my daughter allergic to anything?", "daughter"),
    ("What does my sister do for work?", "sister"),
    ("What does Dad drink in the morning?", "father"),
    ("我生日是哪天？", SELF),
    ("我爸爸爱喝什么？", "father"),
    ("我女朋友住在哪？", "girlfriend"),
    ("我家孩子什么时候开始读书？", "child"),
    ("What did Caroline research?", None),  # nobody of the user's: no holder to rank by
])
def test_a_question_names_whom_it_asks_about(question: str, holder: str | None) -> None:
    assert asked_holder(question) == holder
    assert plan(question).about == holder


def test_a_wider_relation_takes_in_narrower_ones_and_siblings_stay_apart() -> None:
    assert matches("child", "son") and matches("parents", "mother") and matches("friend", "friend:小李")
    assert matches("son", "child") and matches("husband", "partner")  # "My kids love Lego" answers about the son
    assert not matches("son", "daughter") and not matches(SELF, "son") and not matches("sister", "sister_in_law")
    assert matches(":tom", "brother:tom") and not matches("brother:tom", "brother:jim")


def test_another_persons_fact_has_a_key_of_its_own_and_the_users_keeps_its_key() -> None:
    assert held_key("location.city", SELF) == "location.city"
    assert held_key("location.city", "girlfriend") != "location.city"
    assert held_key("diet", "wife") != held_key("diet", "wife.sister")


def said(text: str, event: str, at: datetime = T0) -> list[Candidate]:
    turn = Turn(event_id=event, role=Role.user, text=text, ts=at)
    task = ExtractTask(subject="u1", session_id=f"s-{event}", reason=TriggerReason.session_end, turns=[turn], ts=at)
    return [c for c in extract(task) if c.mtype is not MType.episode]


def test_extraction_records_the_holder_on_every_statement_and_its_record() -> None:
    mine, hers = said("我住在苏州。", "e1")[0], said("My girlfriend lives in Singapore.", "e2")[0]
    assert (mine.about, hers.about) == (SELF, "girlfriend")
    assert mine.key == "location.city" and hers.key == held_key("location.city", "girlfriend")
    turn = Turn(event_id="e3", role=Role.user, text="我妈妈住在杭州。", ts=T0)
    task = ExtractTask(subject="u1", session_id="s3", reason=TriggerReason.session_end, turns=[turn], ts=T0)
    assert {c.about for c in extract(task)} == {"mother"}  # the verbatim record too


def test_a_relatives_value_on_the_users_single_valued_topic_never_supersedes_it() -> None:
    mine = new_memory(said("我住在苏州。", "e1")[0])
    hers = said("My girlfriend lives in Singapore.", "e2", T0 + timedelta(days=2))[0]
    batch = decide(hers, [Neighbour(mine, 0.95)])
    assert batch.action is Action.add and not [op for op in batch.ops if isinstance(op, PatchOp)]


def test_a_relatives_same_words_are_no_duplicate_of_the_users() -> None:
    mine = new_memory(said("I'm allergic to penicillin.", "e1")[0])
    theirs = said("My daughter is allergic to penicillin.", "e2", T0 + timedelta(days=1))[0]
    batch = decide(theirs, [Neighbour(mine, 0.97)])
    assert batch.action is not Action.duplicate and batch.ops[0].memory.about == "daughter"  # type: ignore[union-attr]


def statement(content: str, about: str, *, source: Source = Source.explicit, key: str = "diet",
              pinned: bool = False, at: datetime = T0, event: str = "e1") -> Candidate:
    return Candidate(subject="u1", session_id=f"s-{event}", mtype=MType.rule if pinned else MType.fact,
                     dir=Dir.system if pinned else Dir.entities, key=held_key(key, about), content=content,
                     confidence=0.9, source=source, source_event_ids=[event], ts=at, pinned=pinned, about=about)


def test_no_write_path_decision_crosses_holders() -> None:
    """Supersede (a correction), contest (a weaker value), review (a pinned rule): each against the user's own
    memory on the same topic, by a statement about someone else, adds beside it and touches nothing."""
    mine = new_memory(statement("I'm vegetarian", SELF)).model_copy(update={"access_count": 9})
    rule = new_memory(statement("Never book me meat dishes", SELF, pinned=True))
    later = T0 + timedelta(days=3)
    for incoming in (statement("My wife is on a keto diet", "wife", source=Source.explicit_correction, at=later),
                     statement("My wife eats meat", "wife", source=Source.inferred, at=later),
                     statement("My wife eats only meat dishes", "wife", pinned=True, at=later)):
        batch = decide(incoming, [Neighbour(mine, 0.9), Neighbour(rule, 0.9)])
        assert batch.action is Action.add, batch.why
        assert [op.memory.status for op in batch.ops] == [Status.active]  # type: ignore[union-attr]


def test_review_and_consolidation_keep_holders_apart() -> None:
    mine = new_memory(statement("I'm vegetarian", SELF)).model_copy(update={"status": Status.contested, "key": "diet"})
    hers = new_memory(statement("My wife is vegan", "wife")).model_copy(
        update={"status": Status.contested, "key": "diet", "id": "00000000-0000-0000-0000-00000000000b",
                "session_ids": ["s9", "s8"]})
    verdict = plan_review([mine, hers], T0 + timedelta(days=30), Policy())
    assert not any(step.fields.get("status") == Status.superseded.value for step in verdict.steps)
    sessions = [new_memory(statement("My wife is vegan", "wife", at=T0 + timedelta(hours=h), event=f"w{h}"))
                for h in range(3)]
    patterns = plan_patterns(sessions, T0 + timedelta(days=1), Policy())
    assert patterns and all(p.about == "wife" for p in patterns)


def test_the_pending_layer_never_shows_a_relatives_value_as_superseding_the_users() -> None:
    mine = new_memory(said("我住在苏州。", "e1")[0])
    hers = said("My girlfriend lives in Singapore.", "e2", T0 + timedelta(days=2))[0]
    shown = about_to_write("e2", 0, hers, [Neighbour(mine, 0.95)], duplicate_threshold=0.92)
    assert shown is not None and shown.superseding is None and shown.memory.about == "girlfriend"


def test_a_mismatch_ranks_down_never_out() -> None:
    mine = new_memory(statement("I'm vegetarian", SELF))
    hers = new_memory(statement("My wife is on a keto diet", "wife"))
    found = [(hers, 1.0), (mine, 0.6)]
    assert [m.about for m, _ in by_holder(found, SELF, 0.5)] == [SELF, "wife"]
    assert [m.about for m, _ in by_holder(found, "wife", 0.5)] == ["wife", SELF]
    assert [m.about for m, _ in by_holder(found, None, 0.5)] == ["wife", SELF]  # nobody asked about: as it was
    assert len(by_holder(found, "mother", 0.5)) == 2


HOLDERS = st.sampled_from([SELF, "wife", "mother", "brother", "friend:小李", "wife.sister", "son", "colleague"])


@settings(max_examples=60, deadline=None)
@given(HOLDERS, HOLDERS, st.sampled_from([Source.explicit, Source.explicit_correction, Source.inferred]),
       st.floats(0.5, 1.0), st.integers(0, 9))
def test_a_statement_never_changes_a_memory_of_another_holder(old: str, new: str, source: Source, similarity: float,
                                                              uses: int) -> None:
    stored = new_memory(statement("lives in Suzhou", old, key="location.city")).model_copy(update={"access_count": uses})
    incoming = statement("lives in Suzhou" if similarity > 0.9 else "lives in Singapore", new, source=source,
                         key="location.city", at=T0 + timedelta(days=1), event="e2")
    batch = decide(incoming, [Neighbour(stored, similarity)])
    touched = {op.id for op in batch.ops if isinstance(op, PatchOp)}
    if old != new:
        assert stored.id not in touched and batch.action is not Action.duplicate
        assert all(op.memory.id != stored.id for op in batch.ops if not isinstance(op, PatchOp))  # type: ignore[union-attr]


@pytest.mark.parametrize(("given", "holder"), [
    ("the user", SELF), ("Mom", "mother"), ("wife's sister", "wife.sister"), ("老婆的妹妹", "wife.sister"),
    ("sister of my wife", "wife.sister"), ("我妈妈", "mother"), ("friend:Li", "friend:li"), ("Tom", ":tom"),
])
def test_a_holder_an_llm_names_is_read_into_the_rules_form(given: str, holder: str) -> None:
    assert holder_named(given) == holder


def test_the_llm_extractor_records_the_holder_it_was_given_or_the_rules_read() -> None:
    turn = Turn(event_id="e1", role=Role.user, text="My wife is on a keto diet. I'm vegetarian.", ts=T0)
    task = ExtractTask(subject="u1", session_id="s1", reason=TriggerReason.session_end, turns=[turn], ts=T0)
    batch = next(b for b in llm_extract.batches(task) if b.kind == "context")
    items = [{"type": "fact", "content": "Wife follows a keto diet", "turn": "t1", "evidence": "My wife is on a keto diet",
              "about": "my wife"},
             {"type": "fact", "content": "I'm vegetarian", "turn": "t1", "evidence": "I'm vegetarian"}]
    found, _ = llm_extract.read_reply(task, batch, json.dumps({"items": items}))
    assert [(c.about, c.key == held_key(c.key.removeprefix("of.wife."), c.about)) for c in found] == [
        ("wife", True), (SELF, True)]


def test_inspect_lists_the_people_talked_about_with_what_is_known_of_them() -> None:
    turns = [Turn(event_id=f"e{i}", role=Role.user, text=text, ts=T0 + timedelta(minutes=i)) for i, text in
             enumerate(["My wife is on a keto diet.", "I'm vegetarian.", "我老婆的妹妹住在奥斯陆。", "My wife loves jazz."])]
    task = ExtractTask(subject="u1", session_id="s1", reason=TriggerReason.session_end, turns=turns, ts=T0)
    known = people(new_memory(c) for c in extract(task))
    assert list(known) == ["wife", "wife.sister"]
    # What was distilled from a turn stands for it; a turn nothing was distilled from is shown as said.
    assert [m.content for m in known["wife"]] == ["My wife is on a keto diet", "My wife loves jazz."]


def test_a_packed_prompt_says_whose_fact_a_line_is_and_never_makes_anothers_taste_a_users_rule() -> None:
    theirs = Hit(id="a", content="likes very spicy food", dir=Dir.preferences, mtype=MType.preference, key="k",
                 status=Status.active, tier=Tier.long_term, confidence=0.95, score=1.0, created_at=T0, about="wife")
    mine = theirs.model_copy(update={"id": "b", "about": SELF, "content": "short answers", "key": "k2"})
    packed = pack([theirs, mine], "", 500, lambda text: len(text.split()))
    assert packed.preferences == ["- The user MUST be served this way: short answers"]
    assert packed.memories == ["- [2026-06-10] (about the user's wife) likes very spicy food"]


@pytest.mark.parametrize("statement", ["My manager is Tom Berger.", "my manager is not Dana anymore, it's Priya now",
                                       "我老板是王总", "我女朋友叫小雨", "My wife is Anna."])
def test_naming_who_a_relation_is_is_a_fact_of_the_users_own(statement: str) -> None:
    """A new manager replaces the old one on the user's key; "my manager is on holiday" is about the manager."""
    assert holder_of(statement) == SELF
    assert holder_of("My manager is on holiday.") == "boss" and holder_of("My husband is a doctor.") == "husband"


def test_the_retag_job_migrates_memories_written_before_holders_were_read() -> None:
    """A store written before: every memory reads as the user's (the payload's default), and `retag` (tag_version 2)
    reads each one's holder from its words, giving another person's keyed fact the key it would have had."""
    old = [new_memory(c).model_copy(update={"about": SELF, "key": "location.city", "tag_version": 1})
           for c in said("My girlfriend lives in Singapore.", "e1")]
    fields = retag(old[0])
    assert fields is not None and fields["about"] == "girlfriend"
    assert fields["key"] == held_key("location.city", "girlfriend") and str(fields["uri"]).endswith(str(fields["key"]))
    mine = new_memory(said("我住在苏州。", "e2")[0]).model_copy(update={"tag_version": 1})
    assert retag(mine) == {"dir": mine.dir.value, "uri": mine.uri, "tag_version": TAG_VERSION}
