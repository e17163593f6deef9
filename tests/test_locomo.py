"""The LoCoMo benchmark: its pure parts on hand-made cases, and one tiny run end to end.

The data here is invented (two people, two sessions); the real dataset is never copied
into the repository (CC BY-NC, evaluation use only).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from memflow.bench.locomo import (
    TURN_GAP,
    Asked,
    Bm25,
    Step,
    events_of,
    load,
    parse_session_time,
    read_conversation,
    render,
    report,
    run_cli,
    split_evidence,
)
from memflow.bench.recall import (
    Answered,
    Item,
    budget_recall,
    evidence_recall,
    mean_tokens_at,
    percentile_ms,
    recall_at,
    summarise,
    within_budget,
)
from memflow.pipeline.models import ChatEvent

SAMPLE = {
    "sample_id": "conv-test",
    "conversation": {
        "speaker_a": "Ava",
        "speaker_b": "Ben",
        "session_1_date_time": "9:05 am on 3 March, 2024",
        "session_1": [
            {"speaker": "Ava", "dia_id": "D1:1", "text": "I adopted a golden retriever puppy named Biscuit last week!"},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! I just started learning the cello.",
             "img_url": ["http://example.invalid/cello.jpg"], "blip_caption": "a cello leaning on a chair"},
            {"speaker": "Ava", "dia_id": "D1:3", "text": "Biscuit already loves running on the beach."},
        ],
        "session_2_date_time": "2:30 pm on 10 March, 2024",
        "session_2": [
            {"speaker": "Ben", "dia_id": "D2:1", "text": "My cello teacher lives in Lisbon, so lessons are online."},
            {"speaker": "Ava", "dia_id": "D2:2", "text": "I am training for a marathon in Porto this October."},
        ],
        # A date for a session that does not exist (the real data has these too).
        "session_3_date_time": "4:00 pm on 20 March, 2024",
    },
    "qa": [
        {"question": "What is the name of Ava's dog?", "answer": "Biscuit", "evidence": ["D1:1"], "category": 4},
        {"question": "Where does the teacher of Ben's new instrument live?", "answer": "Lisbon",
         "evidence": ["D2:1; D1:2"], "category": 1},
        {"question": "What did Ava say about her tennis coach?", "adversarial_answer": "nothing",
         "evidence": [], "category": 5},
    ],
}


def items(*ids: str, tokens: int = 10) -> tuple[Item, ...]:
    return tuple(Item(tuple(i.split("+")), tokens) for i in ids)


# -- the data ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
    ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9, tzinfo=UTC)),
    ("12:06 pm on 11 November, 2022", datetime(2022, 11, 11, 12, 6, tzinfo=UTC)),
    ("10:04 AM on 19 December, 2023", datetime(2023, 12, 19, 10, 4, tzinfo=UTC)),
    (" 7:31  pm on 21 January, 2024 ", datetime(2024, 1, 21, 19, 31, tzinfo=UTC)),
])
def test_session_times_parse_to_utc(text: str, expected: datetime) -> None:
    assert parse_session_time(text) == expected


@pytest.mark.parametrize("text", ["8 May 2023", "25:00 pm on 8 May, 2023", ""])
def test_a_malformed_session_time_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_session_time(text)


@pytest.mark.parametrize(("evidence", "expected"), [
    (["D1:3"], ("D1:3",)),
    (["D8:6; D9:17"], ("D8:6", "D9:17")),
    (["D9:1 D4:4 D4:6", "D2:2"], ("D9:1", "D4:4", "D4:6", "D2:2")),
    (["D1:1;D1:2 ;  D1:3"], ("D1:1", "D1:2", "D1:3")),
    ([], ()),
    ([" "], ()),
])
def test_evidence_strings_split_on_semicolons_and_whitespace(evidence: list[str], expected: tuple[str, ...]) -> None:
    assert split_evidence(evidence) == expected


def test_a_conversation_is_read_with_captions_times_and_no_orphan_sessions() -> None:
    conv = read_conversation(SAMPLE)
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    assert conv.turns[1].text == "Lovely! I just started learning the cello. [shares a photo: a cello leaning on a chair]"
    assert conv.turns[1].said.startswith("Ben: Lovely!")
    start = datetime(2024, 3, 3, 9, 5, tzinfo=UTC)
    assert [t.ts for t in conv.turns[:3]] == [start, start + TURN_GAP, start + 2 * TURN_GAP]
    assert [n for n, _ in conv.session_ends] == [1, 2]  # session 3 has a date but no turns
    assert conv.session_ends[0][1] == start + 3 * TURN_GAP
    assert conv.now > conv.session_ends[-1][1] > conv.turns[-1].ts
    assert conv.questions[1].evidence == ("D2:1", "D1:2")
    assert conv.questions[2].evidence == ()


def test_events_are_valid_chat_events_in_order_with_one_end_per_session() -> None:
    events = events_of(read_conversation(SAMPLE))
    checked = [ChatEvent.model_validate(e) for e in events]
    assert [e.event_id for e in checked] == ["D1:1", "D1:2", "D1:3", "session_1:end", "D2:1", "D2:2", "session_2:end"]
    assert all(e.role is not None and e.role.value == "user" for e in checked if e.kind.value == "message")
    assert checked[1].meta == {"speaker": "Ben"}
    assert [e.kind.value for e in checked].count("session_end") == 2
    assert all(a.ts < b.ts for a, b in zip(checked, checked[1:], strict=False))


# -- scoring ----------------------------------------------------------------------


def test_recall_is_the_fraction_of_distinct_evidence_found() -> None:
    assert evidence_recall(["D1:1", "D1:2"], items("D1:1", "D3:3")) == 0.5
    assert evidence_recall(["D1:1", "D1:2"], items("D1:2+D1:1")) == 1.0  # one memory from two turns
    assert evidence_recall(["D4:5", "D4:5", "D5:5"], items("D4:5")) == 0.5  # listed twice, counted once
    assert evidence_recall(["D1:1"], ()) == 0.0
    assert evidence_recall([], items("D1:1")) == 1.0  # no evidence counts 1, as in the paper
    assert evidence_recall(["D9:99"], items("D1:1")) == 0.0  # an id that points to no turn is never found


def test_recall_at_k_scores_prefixes_and_averages_questions() -> None:
    answers = [Answered(4, ("A",), items("x", "y", "A")), Answered(1, ("B", "C"), items("B", "x", "C")),
               Answered(5, (), items("x"))]
    assert recall_at(answers, 1) == pytest.approx(100 * (0 + 0.5 + 1) / 3)
    assert recall_at(answers, 2) == pytest.approx(100 * (0 + 0.5 + 1) / 3)
    assert recall_at(answers, 3) == pytest.approx(100.0)


def test_budget_packing_skips_what_does_not_fit_and_keeps_trying() -> None:
    ranked = (Item(("a",), 300), Item(("big",), 400), Item(("b",), 150), Item(("c",), 60))
    assert [i.source_ids for i in within_budget(ranked, 500)] == [("a",), ("b",)]
    assert [i.source_ids for i in within_budget(ranked, 1000)] == [("a",), ("big",), ("b",), ("c",)]
    assert within_budget(ranked, 100) == [Item(("c",), 60)]
    assert within_budget((), 500) == []


def test_budget_recall_packs_from_the_deeper_pool() -> None:
    top = (Item(("x",), 400),)
    pool = (*top, Item(("A",), 90), Item(("B",), 200))
    answers = [Answered(4, ("A", "B"), top, pool)]
    assert budget_recall(answers, 500) == pytest.approx(50.0)
    assert budget_recall(answers, 1000) == pytest.approx(100.0)
    assert budget_recall([Answered(4, ("A",), pool)], 100) == pytest.approx(100.0)  # no pool: the items


def test_a_summary_has_every_k_budget_and_category_and_leaves_unasked_ones_empty() -> None:
    answers = [Answered(4, ("A",), items("A", "x", tokens=20)), Answered(5, ("B",), items("x", "B", tokens=30))]
    summary = summarise(answers, ks=(1, 2), budgets=(30, 100))
    assert summary["recall"] == {"1": 50.0, "2": 100.0}
    assert summary["recall_no_adversarial"] == {"1": 100.0, "2": 100.0}
    assert summary["budget_recall"] == {"30": 50.0, "100": 100.0}
    assert summary["mean_tokens_at_k"] == {"1": 25.0, "2": 50.0}
    assert summary["by_category"]["5"] == {"name": "adversarial", "questions": 1, "recall": {"1": 0.0, "2": 100.0},
                                           "budget_recall": {"30": 0.0, "100": 100.0}}
    assert summary["by_category"]["2"]["recall"] == {"1": None, "2": None}
    assert mean_tokens_at([], 5) == 0.0


def test_percentiles_are_nearest_rank_in_ms() -> None:
    seconds = [0.001 * i for i in range(1, 101)]
    assert percentile_ms(seconds, 0.5) == pytest.approx(51.0)
    assert percentile_ms(seconds, 0.95) == pytest.approx(95.0)
    assert percentile_ms([], 0.95) == 0.0


def test_bm25_ranks_the_rare_term_first_and_leaves_out_turns_without_a_match() -> None:
    index = Bm25(["Ava: we walked the dog", "Ben: the dog barked at the dog next door",
                  "Ava: my cello teacher lives in Lisbon", "Ben: nothing much today"])
    ranked = index.rank("cello dog")
    assert ranked[0] == 2  # "cello" is in one turn only: it outweighs the common "dog"
    assert set(ranked) == {0, 1, 2}
    assert index.rank("zebra") == []


def test_the_report_shows_unbuilt_ablation_steps_and_the_reference() -> None:
    conv = read_conversation(SAMPLE)
    answered = Asked(answers=[Answered(q.category, q.evidence, items("D1:1")) for q in conv.questions],
                     latencies_s=[0.01, 0.02, 0.03])
    ingest = {"events": 7, "seconds": 1.0, "events_per_s": 7.0, "memories": 6, "memories_by_type": {"episode": 5},
              "dead_letters": 0}
    steps = [Step("flat retrieval", {}, ingest, answered), Step("+ directory scoping", None)]
    out = report([conv], steps, {"flat_dense": answered, "bm25": answered}, wall_s=3.0)
    assert [row["built"] for row in out["ablation"]] == [True, False]
    assert out["systems"]["memflow"]["recall"]["5"] == pytest.approx(100 * (1 + 0 + 1) / 3, abs=0.01)
    text = render(out)
    assert "+ directory scoping" in text and "not built" in text
    assert "DRAGON" in text and "56.7" in text


def test_the_ladder_adds_one_mechanism_per_step_and_shares_ingests() -> None:
    from memflow.bench.ablation import BASE, ingest_key, ladder

    steps = ladder()
    first, last = steps[0][1], steps[-1][1]
    assert first == BASE and last is not None
    assert all(last[name] != value for name, value in BASE.items())  # every mechanism is on at the end
    built = [overrides for _, overrides in steps if overrides is not None]
    assert all(len(set(b.items()) - set(a.items())) == 1 for a, b in zip(built, built[1:], strict=False))
    assert len({ingest_key(o) for o in built}) == 2  # only context indexing changes what is written


def test_variants_name_known_settings_or_are_refused(tmp_path: Path) -> None:
    from memflow.bench.locomo import read_variants

    good = tmp_path / "good.json"
    named = {"floor 0.5": {"decay_floor": 0.5}, "rrf": {"fusion": "rrf"}, "dialogues": {"dialogue.dense_weight": 1.0}}
    good.write_bytes(orjson.dumps(named))
    assert read_variants(good) == named  # settings, and tuned ranking values (pipeline/ranking.py)
    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps({"typo": {"decay_flor": 0.5}}))
    with pytest.raises(ValueError, match="decay_flor"):
        read_variants(bad)
    bad.write_bytes(orjson.dumps({"no such kind": {"chat.dense_weight": 0.5}}))
    with pytest.raises(ValueError, match="chat.dense_weight"):
        read_variants(bad)
    bad.write_bytes(b"[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        read_variants(bad)


# -- end to end -------------------------------------------------------------------


def test_a_tiny_conversation_runs_end_to_end(tmp_path: Path, settings, embedder, capsys) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps([SAMPLE]))

    code = run_cli(data, conversations=None, as_json=True, ablation=False, settings=settings, embedder=embedder,
                   light_in_process=True)

    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert (out["conversations"], out["turns"], out["questions"]) == (1, 5, 3)
    assert out["ingest"]["events"] == 7
    assert out["ingest"]["memories_by_type"]["episode"] == 5
    assert out["ingest"]["dead_letters"] == 0
    for name in ("memflow", "flat_dense", "bm25"):
        system = out["systems"][name]
        assert set(system["recall"]) == set(system["recall_no_adversarial"]) == {"5", "10", "25", "50"}
        assert set(system["budget_recall"]) == {"500", "1000", "2000"}
        assert system["recall"]["50"] == 100.0, name  # five turns: everything is within the top 50
        assert system["by_category"]["5"]["recall"]["5"] == 100.0  # no evidence counts 1
        assert system["search_p95_ms"] >= system["search_p50_ms"] >= 0
    assert out["systems"]["memflow"]["search_p50_ms"] > 0
    assert out["systems"]["memflow"]["failed_searches"] == 0


def test_variants_share_an_ingest_and_each_gets_a_row(tmp_path: Path, settings, embedder, capsys) -> None:
    data, variants = tmp_path / "tiny.json", tmp_path / "variants.json"
    data.write_text(json.dumps([SAMPLE]))
    variants.write_bytes(orjson.dumps({"rrf": {"fusion": "rrf"}, "score": {"fusion": "score"},
                                       "no context": {"episode_context": False}}))
    code = run_cli(data, conversations=None, as_json=True, ablation=False, settings=settings, embedder=embedder,
                   light_in_process=True, variants=variants)
    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    rows = {row["step"]: row for row in out["ablation"]}
    assert list(rows) == ["rrf", "score", "no context"] and all(r["built"] for r in rows.values())
    assert rows["rrf"]["ingest"] == rows["score"]["ingest"]  # one ingest (its seconds would differ otherwise)
    assert rows["no context"]["overrides"] == {"episode_context": False}
    assert all(r["recall"]["50"] == 100.0 for r in rows.values())


def test_unreadable_data_is_exit_code_2(tmp_path: Path, settings, capsys) -> None:
    assert run_cli(tmp_path / "missing.json", conversations=1, as_json=True, ablation=False, settings=settings) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_first_conversations_only(tmp_path: Path) -> None:
    other = {**SAMPLE, "sample_id": "conv-other"}
    path = tmp_path / "two.json"
    path.write_bytes(orjson.dumps([SAMPLE, other]))
    assert [c.sample_id for c in load(path, 1)] == ["conv-test"]
    assert [c.sample_id for c in load(path)] == ["conv-test", "conv-other"]
    assert load(path)[0].now - load(path)[0].session_ends[-1][1] == timedelta(minutes=1)
