"""What a natural chat leaves behind (issue 39, docs/write-path.md#one-fact-per-statement and
#corrections-said-in-passing): one memory per fact of a compound statement, and a change said in passing
replacing only what it names — pure: extraction, then `decide` against what the earlier turns left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memflow.pipeline.clauses import ended, ends, parts
from memflow.pipeline.extract import extract
from memflow.pipeline.holders import SELF
from memflow.pipeline.ids import PUBLIC, NextVersion
from memflow.pipeline.models import (
    Action,
    Candidate,
    ExtractTask,
    Memory,
    MType,
    PatchOp,
    PutOp,
    Role,
    Source,
    Status,
    TriggerReason,
    Turn,
)
from memflow.pipeline.resolve import Neighbour, decide, first_per_key

T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


def said(text: str, event: str = "e1", at: datetime = T0) -> list[Candidate]:
    """The statements a session's end reads from one user turn."""
    task = ExtractTask(subject="u1", session_id=f"s-{event}", reason=TriggerReason.session_end, ts=at,
                       turns=[Turn(event_id=event, role=Role.user, text=text, ts=at)])
    return [c for c in extract(task) if c.mtype is not MType.episode]


def stored(candidates: list[Candidate]) -> list[Memory]:
    return [NextVersion(1, PUBLIC).memory(c) for c in candidates]


def after(known: list[Memory], candidate: Candidate) -> tuple[Action, set[str]]:
    """What `candidate` does to `known`: its action, and the contents it retires."""
    batch = decide(candidate, [Neighbour(m, 0.0) for m in known])
    retired = {op.id for op in batch.ops if isinstance(op, PatchOp) and op.set.get("status") == "superseded"}
    return batch.action, {m.content for m in known if m.id in retired}


# -- one fact per statement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("I live in Porto and I work as a pharmacist at the old hospital.", {"location.city", "work.role"}),
        ("I live in Graz and work as a software engineer.", {"location.city", "work.role"}),
        ("大家好，我叫阿杰，在成都当程序员，住在高新区。", {"person.name", "work.role", "location.city"}),
        ("我住在厦门，我老婆在泉州上班。", {"location.city", "of.wife.work.employer"}),
    ],
)
def test_a_compound_statement_leaves_one_memory_per_fact(text: str, keys: set[str]) -> None:
    found = said(text)
    assert {c.key for c in found} == keys
    for c in found:  # each reads on its own, rests on its own span of the turn, and says whose it is
        assert c.evidence.strip("。.") in text and c.evidence != text.strip("。.")
        assert c.content.startswith(("I ", "我")) or c.about != SELF
    assert {c.about for c in found if c.key.startswith("of.wife")} <= {"wife"}


@pytest.mark.parametrize(
    "text",
    [
        "我养了一只柯基，叫豆豆，两岁了。",  # an elaboration keeps its fact
        "Honestly I don't play squash anymore, these days it's mostly cycling.",  # a new value keeps what it replaces
        "这周我在外地，只能用手机看消息，回复简短一点就行。",  # a wish keeps its qualifier
        "Update: my manager is now Priya, Marco moved to the Berlin office.",  # Marco's move is not the user's city
    ],
)
def test_a_statement_that_states_one_thing_stays_whole(text: str) -> None:
    (only,) = parts(text)
    assert only.text == text.strip("。.")


def test_a_change_to_one_fact_leaves_the_others_current() -> None:
    known = stored(said("I live in Porto and I work as a pharmacist at the old hospital."))
    (move,) = said("Small news: we relocated to Lisbon in April, closer to my parents.", "e2", T0 + timedelta(days=30))
    assert move.mtype is MType.fact and move.key == "location.city" and move.source is Source.explicit_correction
    action, retired = after(known, move)
    assert action is Action.supersede and retired == {"I live in Porto"}


def test_a_chinese_move_said_in_passing_replaces_the_district_and_keeps_the_job() -> None:
    known = stored(said("大家好，我叫阿杰，在成都当程序员，住在高新区。"))
    (move,) = said("顺便说一下，我上周搬到重庆了，房子比以前大。", "e2", T0 + timedelta(days=9))
    action, retired = after(known, move)
    assert action is Action.supersede and retired == {"我住在高新区"}


# -- what is said to be over ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("I play squash every Thursday night with my colleagues.",
         "Honestly I don't play squash anymore, these days it's mostly cycling."),
        ("I smoke about ten cigarettes a day.", "Good news, I quit smoking in January."),
        ("我每天早上都要喝两杯咖啡。", "我已经戒咖啡了，早上改喝豆浆。"),
        ("我周末经常去打麻将。", "我现在不再打麻将了，太费时间。"),
    ],
)
def test_what_is_said_to_be_over_is_replaced_under_whatever_key_it_had(old: str, new: str) -> None:
    known = stored(said(old))
    (ending,) = said(new, "e2", T0 + timedelta(days=12))
    assert known and known[0].key != ending.key  # no key would have met it
    action, retired = after(known, ending)
    assert action is Action.supersede and retired == {known[0].content}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("I drink a beer with friends on Fridays.", "I don't drink coffee anymore, tea suits me better."),
        ("My brother plays squash every week.", "I don't play squash anymore."),  # another person's
        ("I have a cat named Pixel.", "I also have a dog now, a beagle called Hopper."),  # a second pet adds
        ("我喜欢周末去爬山。", "我最近还开始学游泳了。"),  # a second hobby adds
    ],
)
def test_a_statement_that_adds_or_ends_something_else_replaces_nothing(old: str, new: str) -> None:
    known = stored(said(old))
    for statement in said(new, "e2", T0 + timedelta(days=3)):
        action, retired = after(known, statement)
        assert retired == set() and action is not Action.supersede


def test_a_rule_is_never_ended_in_passing() -> None:
    (rule,) = said("永远不要在代码里写死密码。")
    (ending,) = said("我已经不写死密码了。", "e2", T0 + timedelta(days=1))
    action, retired = after(stored([rule]), ending)
    assert retired == set()


@pytest.mark.parametrize(
    ("ending", "statement", "held"),
    [
        ("drink oolong", "I drink oolong tea every morning", True),
        ("drink oolong", "I drink beer on Fridays", False),  # the verb alone names nothing
        ("smoking", "I smoke a pack a day", True),
        ("可乐", "我每天晚上都要喝一杯可乐", True),
        ("打麻将", "我周末经常去打麻将", True),
        ("打麻将", "我周末经常去打羽毛球", False),
    ],
)
def test_ends_reads_the_words_of_what_is_over(ending: str, statement: str, held: bool) -> None:
    assert ends(ending, statement) is held


def test_ended_names_what_is_over_and_nothing_else() -> None:
    assert ended("I'm not vegan anymore, fish is back on the menu") == "vegan"
    assert ended("I no longer work at Siemens") == "work at Siemens"
    assert ended("我把烟戒了") == "烟"
    assert ended("I still love oolong tea") is None and ended("我还是每天喝可乐") is None


def test_a_statement_that_ends_one_of_its_own_batch_waits_until_that_one_is_stored() -> None:
    (old,) = said("I play squash every Thursday night with my colleagues.")
    (ending,) = said("Honestly I don't play squash anymore, these days it's mostly cycling.", "e2",
                     T0 + timedelta(days=1))
    assert first_per_key([old, ending]) == [True, False]
    assert first_per_key([ending]) == [True]


def test_a_replaced_value_takes_its_verbatim_turn_along() -> None:
    (old,) = said("My phone is a Galaxy S10, the screen is cracked.")
    (new,) = said("Finally replaced my phone, I've got a Pixel 9 now.", "e2", T0 + timedelta(days=5))
    record = NextVersion(1, PUBLIC).memory(old.model_copy(update={"mtype": MType.episode, "key": "episode.e1"}))
    batch = decide(new, [Neighbour(m, 0.0) for m in stored([old])], records=[record])
    assert batch.action is Action.supersede
    put = next(op.memory for op in batch.ops if isinstance(op, PutOp))
    assert put.status is Status.active and "Pixel 9" in put.content
    assert record.id in {op.id for op in batch.ops if isinstance(op, PatchOp)}


def test_one_speaker_ends_nothing_of_another() -> None:
    """In a conversation of several (LoCoMo) the speaker owns the statement: Melanie's "I don't paint anymore" is
    no end of Caroline's painting."""
    task = ExtractTask(subject="u1", session_id="s1", reason=TriggerReason.session_end, ts=T0, turns=[
        Turn(event_id="e1", role=Role.user, text="I paint landscapes every weekend.", ts=T0, speaker="Caroline"),
        Turn(event_id="e2", role=Role.user, text="I don't paint anymore, no time.", ts=T0 + timedelta(minutes=1),
             speaker="Melanie")])
    old, ending = [c for c in extract(task) if c.mtype is not MType.episode]
    assert after(stored([old]), ending) == (Action.add, set())
    assert after(stored([old]), ending.model_copy(update={"content": ending.content.replace("Melanie", "Caroline")}))[1]


def test_a_replaced_turn_leaves_the_context_of_the_records_beside_it() -> None:
    """"I prefer short answers", said right after "I live in Lyon…", was keyword-indexed with it, and kept
    answering "where do I live?" by the old city's words once the city was replaced."""
    (old,) = said("I live in Lyon.")
    (new,) = said("Quick news: we moved to Geneva last week.", "e3", T0 + timedelta(days=2))
    record = NextVersion(1, PUBLIC).memory(old.model_copy(update={"mtype": MType.episode, "key": "episode.e1",
                                                                 "content": "I live in Lyon."}))
    beside = NextVersion(1, PUBLIC).memory(old.model_copy(update={
        "mtype": MType.episode, "key": "episode.e2", "content": "Great, how can I help?", "source_event_ids": ["e2"],
        "context": "I live in Lyon.\nI prefer short answers.", "context_event_ids": ["e1", "e4"]}))
    batch = decide(new, [Neighbour(m, 0.0) for m in stored([old])], records=[record, beside])
    (scrubbed,) = [op for op in batch.ops if isinstance(op, PatchOp) and op.id == beside.id]
    assert not scrubbed.quiet and scrubbed.set == {"context": "I prefer short answers.", "context_event_ids": ["e4"]}


def test_a_statement_older_than_the_current_value_retires_nothing() -> None:
    (current,) = said("Quick news: we moved to Geneva last week.", "e3", T0 + timedelta(days=2))
    (late,) = said("I live in Lyon.")
    record = NextVersion(1, PUBLIC).memory(current.model_copy(update={"mtype": MType.episode, "key": "episode.e3"}))
    batch = decide(late, [Neighbour(m, 0.0) for m in stored([current])], records=[record])
    assert [op for op in batch.ops if isinstance(op, PatchOp)] == []
