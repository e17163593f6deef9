"""The ranking check (bench/ranking_check.py): a kept store built once, recorded twice alike, and a compare that
fails on one swapped hit.

The data here is invented, in each benchmark's format (LoCoMo's JSON, MADial's JSON Lines, an eval scenario);
the real sets are read in place and never copied here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from memflow.bench.ranking_check import Sources, build, compare, main, record, summary
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings

CONVERSATION = {
    "sample_id": "conv-rc",
    "conversation": {
        "speaker_a": "Ava", "speaker_b": "Ben",
        "session_1_date_time": "9:05 am on 3 March, 2024",
        "session_1": [
            {"speaker": "Ava", "dia_id": "D1:1", "text": "I adopted a golden retriever puppy named Biscuit last week!"},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! I just started learning the cello."},
            {"speaker": "Ava", "dia_id": "D1:3", "text": "Biscuit already loves running on the beach."},
        ],
        "session_2_date_time": "2:30 pm on 10 March, 2024",
        "session_2": [
            {"speaker": "Ben", "dia_id": "D2:1", "text": "My cello teacher lives in Lisbon, so lessons are online."},
            {"speaker": "Ava", "dia_id": "D2:2", "text": "I am training for a marathon in Porto this October."},
        ],
    },
    "qa": [
        {"question": "What is the name of Ava's dog?", "answer": "Biscuit", "evidence": ["D1:1"], "category": 4},
        {"question": "Where does Ben's cello teacher live?", "answer": "Lisbon", "evidence": ["D2:1"], "category": 1},
        {"question": "What did Ava say about her tennis coach?", "adversarial_answer": "nothing", "evidence": [],
         "category": 5},
    ],
}
MADIAL: dict[str, list[dict[str, Any]]] = {
    "memory": [{"1": {"time": "2023-05-15", "event": "Bart tried the mango ice cream at the new shop.", "user-id": 1}},
               {"2": {"time": "2023-08-16", "event": "Bart was flying a kite at the beach.", "user-id": 1}}],
    "dialogue": [{"dialogue": ["<BOD>\n", "<Bart>: \"I want some ice cream!\"\n", "<Assistant>: \"Which one?\"\n",
                               "<EOD>\n"], "test-turn": [2], "relevant-id": [1], "user-id": 1, "id": 0}],
}
SCENARIO = {"id": "rc-pet", "subject": "rc-pet", "steps": [
    {"at": "2026-06-10T08:00:00Z", "say": {"session": "s1", "text": "My cat Miso is afraid of the vacuum cleaner."}},
    {"at": "2026-06-10T08:01:00Z", "say": {"session": "s1", "text": "I take the train to work every day."}},
    {"at": "2026-06-10T09:00:00Z", "end_session": "s1"},
    {"at": "2026-07-01T08:00:00Z", "query": "what pet do I have?", "expect": {"top1": "Miso"}}]}


def write_sources(folder: Path) -> Sources:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "locomo.json").write_bytes(orjson.dumps([CONVERSATION]))
    for kind, rows in MADIAL.items():  # the same invented memories stand for both languages
        for lang in ("zh", "en"):
            (folder / f"MADial-Bench-{lang}-{kind}.json").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    (folder / "semantic.jsonl").write_bytes(orjson.dumps(SCENARIO) + b"\n")
    return Sources(folder / "locomo.json", folder, folder / "semantic.jsonl")


@pytest.mark.timeout(120)
def test_two_records_of_a_kept_store_agree_and_one_swapped_hit_fails_the_compare(
        tmp_path: Path, settings: Settings, embedder: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    sources = write_sources(tmp_path / "data")
    manifest = build(tmp_path / "store", sources, settings, embedder, light_in_process=True)
    assert manifest["locomo"]["conversations"] == ["conv-rc"] and manifest["semantic-dev"]["scenarios"] == ["rc-pet"]

    first = record(tmp_path / "store", settings, embedder)
    second = record(tmp_path / "store", settings, embedder)

    # Every question (the adversarial one too), every dialogue, every scenario query, each found something.
    assert {name: sorted(queries) for name, queries in first["sets"].items()} == {
        "locomo": ["conv-rc/0", "conv-rc/1", "conv-rc/2"], "madial": ["en/0", "zh/0"], "semantic-dev": ["rc-pet/3"]}
    assert all(q["status"] == "ok" and 0 < len(q["hits"]) <= 10 for s in first["sets"].values() for q in s.values())
    assert any(h["sources"] == ["D1:1"] for h in first["sets"]["locomo"]["conv-rc/0"]["hits"])
    assert "0 failed searches" in summary(first)
    diffs, text = compare(first, second)
    assert all(d.same for d in diffs) and text.endswith("IDENTICAL: every query's top hits are the same")

    (tmp_path / "a.json").write_bytes(orjson.dumps(first))
    (tmp_path / "b.json").write_bytes(orjson.dumps(swapped(first, "locomo", "conv-rc/0")))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    assert "locomo: 3 queries, 1 differ in their top 10" in out and "conv-rc/0" in out and "rank 1:" in out
    assert "madial: 2 queries, 0 differ" in out and out.rstrip().endswith("DIFFERENT")


def swapped(recorded: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    """The record with one query's first two hits in the other order."""
    out = copy.deepcopy(recorded)
    hits = out["sets"][name][key]["hits"]
    if len(hits) < 2:  # a single hit: dropping it is the change
        hits.clear()
    else:
        hits[0], hits[1] = hits[1], hits[0]
    return out


def test_a_record_missing_a_query_or_with_moved_scores_only() -> None:
    hit = {"content": "x", "mtype": "episode", "key": "k", "status": "active", "about": "self", "contested": False,
           "sources": ["e1"], "pending": False}
    query = {"query": "q", "status": "ok", "hits": [hit], "scores": [0.5], "ids": ["m1"], "ties": []}
    a: dict[str, Any] = {"format": 1, "top": 10, "store": {"path": "s", "sources": {}}, "sets": {"locomo": {"c/0": query, "c/1": query}}}
    b = copy.deepcopy(a)
    del b["sets"]["locomo"]["c/1"]
    b["sets"]["locomo"]["c/0"]["scores"] = [0.6]
    b["sets"]["locomo"]["c/0"]["ids"] = ["m2"]  # another store names the memory otherwise: not a difference

    (diff,), text = compare(a, b)

    assert diff.differ == [] and diff.missing == ["c/1"] and diff.scores_moved == ["c/0"] and not diff.same
    assert "c/1: only in A" in text and "1 same hits with moved scores" in text
