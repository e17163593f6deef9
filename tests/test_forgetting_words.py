"""Forget reaches the words (issue 39 item 6): forgetting a memory distilled from a turn also forgets the
verbatim record of that turn where it holds the words, and the records around it stop quoting it; the
other facts of the turn stay. What still holds the words is named, and the proof checks the words, not
only the ids."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from memflow.pipeline.models import MType, Status
from memflow.pipeline.statements import normal
from tests.conftest import System, run_cli

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=1)
WORDS = "I prefer oolong tea in the morning"
TURN = f"I live in Hamburg and I work as a nurse. {WORDS}."


def chat(system: System, subject: str, *more: tuple[str, str]) -> None:
    """A compound turn, the assistant's reply and a later turn: both of those quote the first as context."""
    turns = [("user", TURN), ("assistant", "Noted, oolong in the morning."), ("user", "I also swim on Sundays."),
             *more]
    for i, (role, text) in enumerate(turns):
        system.client.publish({"event_id": f"{subject}-e{i}", "subject": subject, "session_id": "s1",
                               "kind": "message", "role": role, "text": text, "ts": T0 + timedelta(minutes=i)})
    system.client.publish({"event_id": f"{subject}-end", "subject": subject, "session_id": "s1",
                           "kind": "session_end", "ts": T0 + timedelta(minutes=10)})
    assert system.client.wait_idle(timeout_s=60)


def holding(system: System, subject: str) -> list[str]:
    """The active points whose content, evidence or context holds the words (compared normalised)."""
    return [m.id for m in system.client.inspect(subject, now=NOW).memories if m.status is Status.active
            and normal(WORDS) in normal(" ".join([m.content, m.evidence, *m.context.split("\n")]))]


def test_forgetting_a_preference_forgets_its_turns_words_and_keeps_the_turns_other_fact(system: System) -> None:
    chat(system, "olga")
    shown = system.client.inspect("olga", now=NOW).memories
    [tea] = [m for m in shown if m.mtype is not MType.episode and "oolong" in m.content]
    [turn] = [m for m in shown if m.mtype is MType.episode and m.source_event_ids == ["olga-e0"]]
    assert len(holding(system, "olga")) >= 4  # the preference, its turn's record, and two contexts quoting it

    report = system.client.forget_report("olga", [tea.id])
    assert report.ids == [tea.id] and report.count == 1
    assert report.records == [turn.id] and report.still_held == []

    assert holding(system, "olga") == []  # inspect: no active point holds the words
    found = system.client.search("olga", "do I prefer oolong tea in the morning?", k=20, now=NOW)
    assert not [h.id for h in found.hits if normal(WORDS) in normal(h.content)]
    proof = system.client.verify_forgotten("olga", report.forgotten_ids)
    assert proof.verified and proof.still_held == [] and proof.in_store == [] and proof.residue == {}

    # The other fact of the same turn stays, active and found.
    kept = [m for m in system.client.inspect("olga", now=NOW).memories
            if m.status is Status.active and m.mtype is not MType.episode and "Hamburg" in m.content]
    assert kept
    where = system.client.search("olga", "where do I live?", k=5, now=NOW)
    assert {m.id for m in kept} & {h.id for h in where.hits}


def test_what_still_holds_the_words_is_named_and_the_proof_fails_until_it_goes(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of another turn saying the same words (not the turn the preference came from): not forgotten
    unasked, but named by the forget, and the proof is not verified while it holds them."""
    chat(system, "pia", ("assistant", f"You told me: {WORDS}."))
    shown = system.client.inspect("pia", now=NOW).memories
    [tea] = [m for m in shown if m.mtype is not MType.episode and m.content == WORDS]
    echoes = [m.id for m in shown if m.mtype is MType.episode and m.source_event_ids == ["pia-e3"]]
    assert echoes

    forgot = json.loads(run_cli(system, monkeypatch, "forget", "pia", tea.id, "--json"))
    assert set(forgot["still_held"]) >= set(echoes) and forgot["records"]
    # Named: what holds the words itself; a record only quoting the echo in its context goes with the echo.
    assert set(forgot["still_held"]) <= set(holding(system, "pia"))
    proof = system.client.verify_forgotten("pia", [tea.id, *forgot["records"]])
    assert not proof.verified and set(proof.still_held) >= set(echoes)

    again = system.client.forget_report("pia", forgot["still_held"])
    assert again.still_held == []
    assert holding(system, "pia") == []
    ids = [tea.id, *forgot["records"], *again.forgotten_ids]
    out = run_cli(system, monkeypatch, "forget", "pia", *ids, "--verify")
    assert "verified: True" in out and "points still holding their words: none" in out
