"""What a forget reaches beyond the memories it names (pipeline/forgetting.py): the record of the turn they
came from where it holds their words, the context quoting that turn, and what still holds the words."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from memflow.pipeline.forgetting import fingerprint, reach, still_holding, wordings
from memflow.pipeline.models import Dir, Memory, MType, Source, Status

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TURN = "I live in Hamburg and I work as a nurse. I prefer oolong tea in the morning."
REPLY = "Noted, oolong in the morning."


def point(id_: str, mtype: MType, content: str, events: list[str], **more: Any) -> Memory:
    return Memory(id=id_, subject="s", uri=f"mem://s/general/{id_}", dir=Dir.general, mtype=mtype, key=id_,
                  content=content, confidence=0.9, source=Source.explicit, created_at=T0, updated_at=T0,
                  source_event_ids=events, **more)


def chat() -> dict[str, Memory]:
    """One compound turn (two facts and its record), the assistant's reply and a later turn quoting it."""
    return {
        "home": point("home", MType.fact, "I live in Hamburg and I work as a nurse", ["e0"],
                      evidence="I live in Hamburg and I work as a nurse."),
        "tea": point("tea", MType.preference, "I prefer oolong tea in the morning", ["e0"],
                     evidence="I prefer oolong tea in the morning."),
        "turn": point("turn", MType.episode, TURN, ["e0"], evidence=TURN, context=REPLY),
        "reply": point("reply", MType.episode, REPLY, ["e1"], evidence=REPLY, context=TURN,
                       context_event_ids=["e0"]),
        "later": point("later", MType.episode, "I also swim on Sundays.", ["e2"], context=f"{TURN}\n{REPLY}",
                       context_event_ids=["e1"]),
    }


def test_forgetting_a_fact_reaches_the_record_of_its_turn_and_the_context_quoting_it_not_its_sibling() -> None:
    points = chat()
    reached = reach([points["tea"]], list(points.values()))
    assert [r.id for r in reached.records] == ["turn"]  # whole: the sibling fact stays as its own memory
    assert {p.id: p.set["context"] for p in reached.unsaid} == {"reply": "", "later": REPLY}
    assert reached.still_held == []
    # The sibling holds none of the forgotten words, and is not reached.
    assert "home" not in {r.id for r in reached.records}


def test_a_record_of_the_same_turn_without_the_words_stays() -> None:
    points = chat()
    points["turn"] = points["turn"].model_copy(update={"content": "I live in Hamburg.", "evidence": ""})
    reached = reach([points["tea"]], list(points.values()))
    assert reached.records == [] and reached.unsaid == []
    # ...but the contexts still quoting a turn with the words are named.
    assert reached.still_held == ["reply", "later"]


def test_words_are_compared_normalised_and_what_still_holds_them_is_named() -> None:
    points = chat()
    again = point("again", MType.episode, "As I said: I PREFER oolong-tea, in the morning!", ["e9"])
    reached = reach([points["tea"]], [*points.values(), again])
    assert [r.id for r in reached.records] == ["turn"]
    assert reached.still_held == ["again"]  # another turn, not the one it was distilled from: named, kept


def test_a_record_named_reaches_nothing_and_names_the_facts_quoting_it() -> None:
    points = chat()
    reached = reach([points["turn"]], list(points.values()))
    assert reached.records == []
    assert reached.still_held == ["home", "tea"]


def test_a_forget_by_text_forgets_the_phrase_not_the_turns_other_sentences() -> None:
    points = chat()
    named = [points["tea"], points["turn"], points["reply"]]  # every content holding "oolong"
    reached = reach(named, list(points.values()), contains="oolong")
    assert reached.still_held == []  # "home" holds a sentence of the turn, not the forgotten words


def test_the_proof_recognises_the_words_by_fingerprints_alone() -> None:
    points = chat()
    reached = reach([points["tea"]], list(points.values()))
    prints = set(reached.fingerprints["tea"])
    assert fingerprint("ipreferoolongteainthemorning") in prints and set(reached.fingerprints["turn"]) == prints
    kept = [points["home"], points["later"].model_copy(update={"context": REPLY})]
    assert still_holding(kept, prints) == []
    # The reply quotes the turn in its context: forgetting the turn's record takes it out, so only that is named.
    assert still_holding([*kept, points["turn"], points["reply"]], prints) == ["turn"]
    assert still_holding([*kept, points["reply"]], prints) == ["reply"]
    # A point holding them inside a longer sentence is recognised when that sentence was there at the forget.
    longer = point("longer", MType.episode, "Really, I prefer oolong tea in the morning, always.", ["e5"])
    reached = reach([points["tea"]], [*points.values(), longer])
    assert reached.still_held == ["longer"] and still_holding([longer], set(reached.fingerprints["tea"])) \
        == ["longer"]


def test_short_wordings_are_not_looked_for() -> None:
    assert wordings(point("ok", MType.fact, "Yes.", ["e0"], evidence="ok")) == frozenset()
    assert wordings(point("cat", MType.fact, "我养猫了", ["e0"])) == frozenset({"我养猫了"})


def test_a_deleted_point_holds_nothing() -> None:
    points = chat()
    gone = points["turn"].model_copy(update={"status": Status.deleted})
    reached = reach([points["tea"]], [points["tea"], gone])
    assert reached.records == [] and reached.still_held == []
