"""The MADial-Bench harness: its scoring and reading on hand-made cases, and one tiny run end to end.

The data here is invented, in the benchmark's format (JSON Lines; dialogue lines such as
`<Bart>:"…"\\n`); the real development split is read in place and never copied here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from memflow.bench.madial import (
    ASKED_AFTER,
    Bm25,
    Dialogue,
    figures,
    load,
    query_of,
    recall_at,
    reciprocal_rank,
    run_cli,
    terms,
    turn_text,
)
from memflow.bench.recall import Item

MEMORIES = {
    "zh": [
        {"1": {"time": "2023-12-25", "scene": "活动类", "emotion": "开心", "event": "Bart在圣诞节晚会上跳舞，感觉非常开心。",
               "user-id": 1, "id": "1"}},
        {"2": {"time": "2023-05-15", "scene": "喜好类", "emotion": "开心",
               "event": "Bart在新开的冰淇淋店尝试了芒果口味的冰淇淋。", "user-id": 1, "id": "2"}},
        {"3": {"time": "2023-08-16", "scene": "活动类", "emotion": "开心", "event": "Bart在海边放风筝，感到非常开心。",
               "user-id": 1, "id": "3"}},
        {"4": {"time": "2024-02-01", "scene": "物品类", "emotion": "难过", "event": "Bart的自行车坏了，他很难过。",
               "user-id": 1, "id": "4"}},
    ],
    # The English file has no user-id: it comes from the Chinese one.
    "en": [
        {"1": {"time": "2023-12-25", "scene": "Activity", "emotion": "Happy",
               "event": "Bart danced at the Christmas party and felt very happy."}},
        {"2": {"time": "2023-05-15", "scene": "Preferences", "emotion": "Happy",
               "event": "Bart tried the mango ice cream at the new ice cream shop."}},
        {"3": {"time": "2023-08-16", "scene": "Activity", "emotion": "Happy",
               "event": "Bart was flying a kite at the beach and felt very happy."}},
        {"4": {"time": "2024-02-01", "scene": "Items", "emotion": "Sad", "event": "Bart's bicycle broke and he was sad."}},
    ],
}
DIALOGUES = {
    "zh": [
        {"dialogue": ["<BOD>\n", "<Bart>:\"我想吃冰淇淋！\"\n", "<Assistant>:\"你喜欢什么口味？\"\n",
                      "<Bart>:\"芒果冰淇淋最好吃。\"\n", "<Assistant>:\"记得那家新开的冰淇淋店吗？\"\n", "<EOD>\n"],
         "test-turn": [4], "relevant-id": [2], "user-id": 1, "id": 0},
        {"dialogue": [" <BOD>\n", " <Bart>:\"今天风好大，我想去海边放风筝。\"\n", " <Assistant>:\"好主意！\"\n",
                      " <Bart>:\"圣诞节我还要跳舞。\"\n", "<Assistant>:\"…\"\n", "<EOD>\n"],
         "test-turn": [4, 6], "relevant-id": [3, 1], "user-id": 1, "id": 1},
    ],
    "en": [
        {"dialogue": ["<BOD>\n", "<Bart>: \"I want some ice cream!\"\n", "<Assistant>: \"Which flavour do you like?\"\n",
                      "<Bart>: \"Mango ice cream is the best.\"\n", "<Assistant>: \"Remember the new shop?\"\n",
                      "<EOD>\n"],
         "test-turn": [4], "relevant-id": [2], "user-id": 1},
        {"dialogue": ["<BOD>\n", "<Bart>: \"It is windy today, I want to fly a kite at the beach.\"\n",
                      "\"Great idea!\"\n", "<Bart>: \"And I will dance at the Christmas party again.\"\n",
                      "<Assistant>: \"…\"\n", "<EOD>\n"],
         "test-turn": [4, 6], "relevant-id": [3, 1], "user-id": 1},
    ],
}


def write_data(folder: Path, langs: tuple[str, ...] = ("zh", "en")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for lang in langs:
        for kind, rows in (("memory", MEMORIES[lang]), ("dialogue", DIALOGUES[lang])):
            lines = [orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS).decode() for row in rows]
            (folder / f"MADial-Bench-{lang}-{kind}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def ranked(*ids: str) -> tuple[Item, ...]:
    """Memories best first; "a+b" is one memory made from two writes."""
    return tuple(Item(tuple(i.split("+")), 0) for i in ids)


# -- scoring ----------------------------------------------------------------------


def test_recall_at_k_is_the_share_of_gold_in_the_top_k() -> None:
    top = ranked("7", "2", "9", "3")
    assert recall_at(("2", "3"), top, 1) == 0.0
    assert recall_at(("2", "3"), top, 3) == 0.5
    assert recall_at(("2", "3"), top, 10) == 1.0
    assert recall_at(("2", "3", "5"), ranked("2+3"), 1) == pytest.approx(2 / 3)  # one memory from two writes
    assert recall_at(("2",), (), 5) == 0.0


def test_reciprocal_rank_is_that_of_the_first_gold_within_k() -> None:
    assert reciprocal_rank(("3", "9"), ranked("1", "2", "9", "3")) == pytest.approx(1 / 3)
    assert reciprocal_rank(("1",), ranked("1", "2")) == 1.0
    assert reciprocal_rank(("5",), ranked("1", "2")) == 0.0
    assert reciprocal_rank(("9",), ranked(*map(str, range(10)), "x", "9")) == 0.1  # rank 10 counts …
    assert reciprocal_rank(("x",), ranked(*map(str, range(10)), "x")) == 0.0  # … rank 11 does not


def test_figures_are_means_over_dialogues() -> None:
    dialogues = [Dialogue("0", "1", "q", ("a",)), Dialogue("1", "1", "q", ("b", "c"))]
    out = figures(dialogues, [ranked("x", "a"), ranked("b", "y", "z", "w", "v", "c")])
    assert out == {"R@1": pytest.approx((0 + 0.5) / 2), "R@3": pytest.approx((1 + 0.5) / 2),
                   "R@5": pytest.approx((1 + 0.5) / 2), "R@10": 1.0, "MRR@10": pytest.approx((0.5 + 1) / 2)}


# -- the data ---------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ("<BOD>\n", None),
    (" <EOD>\n", None),
    ('<Bart>:"嘿，你知道吗？"\n', "Bart: 嘿，你知道吗？"),
    ('<Assistant>: "Of course!"\n', "Assistant: Of course!"),
    ('"Great idea!"\n', "Great idea!"),  # a turn without its speaker tag (the English file has some)
])
def test_a_dialogue_line_becomes_one_turn(line: str, expected: str | None) -> None:
    assert turn_text(line) == expected


def test_the_query_is_the_dialogue_before_the_test_turn_without_marks() -> None:
    lines = DIALOGUES["zh"][0]["dialogue"]
    assert query_of(lines, 4) == "Bart: 我想吃冰淇淋！\nAssistant: 你喜欢什么口味？\nBart: 芒果冰淇淋最好吃。"


def test_a_split_is_loaded_with_users_from_the_chinese_file(tmp_path: Path) -> None:
    data = write_data(tmp_path / "madial")
    en = load(data, "en")
    assert [m.id for m in en.memories] == ["1", "2", "3", "4"]
    assert {m.user for m in en.memories} == {"1"}
    assert en.memories[0].ts == datetime(2023, 12, 25, tzinfo=UTC)
    assert en.now == datetime(2024, 2, 1, tzinfo=UTC) + ASKED_AFTER
    second = en.dialogues[1]
    assert (second.id, second.user, second.gold) == ("1", "1", ("3", "1"))  # no id in the file: its line
    assert second.query.splitlines() == ["Bart: It is windy today, I want to fly a kite at the beach.",
                                         "Great idea!", "Bart: And I will dance at the Christmas party again."]
    assert load(data, "zh").dialogues[0].id == "0"


def test_a_memory_without_any_user_is_refused(tmp_path: Path) -> None:
    data = write_data(tmp_path / "madial", langs=("en",))
    with pytest.raises(OSError):  # no Chinese file to take the users from
        load(data, "en")
    write_data(data, langs=("zh",))
    (data / "MADial-Bench-en-memory.json").write_text('{"9": {"time": "2024-01-01", "event": "x"}}\n')
    with pytest.raises(ValueError, match="memory 9"):
        load(data, "en")


# -- the BM25 baseline --------------------------------------------------------------


def test_terms_are_words_and_chinese_unigrams_and_bigrams() -> None:
    assert terms("Bart's KITE, 2024") == ["bart", "s", "kite", "2024"]
    assert terms("Bart放风筝。") == ["bart", "放", "风", "筝", "放风", "风筝"]


def test_bm25_ranks_the_rare_term_first_and_leaves_out_memories_without_a_match() -> None:
    index = Bm25(["Bart walked the dog", "the dog barked at the cat next door", "Bart's kite flew high", "nothing"])
    assert index.rank("kite dog") == [2, 0, 1]  # "kite" is rarer than "dog"; the short text beats the long one
    # Term frequency against length (k1 1.2, b 0.75, mean length 4.5): "dog" twice in 8 words scores
    # 2·2.2 / (2 + 1.9) = 1.13, above once in 4 words, 2.2 / (1 + 1.1) = 1.05.
    assert Bm25(["Bart walked the dog", "the dog barked at the dog next door", "a b c d e", "x"]).rank("dog") == [1, 0]
    assert index.rank("zebra") == []
    assert Bm25(["芒果冰淇淋", "香草冰淇淋", "放风筝"]).rank("芒果") == [0]


# -- end to end -------------------------------------------------------------------


def test_a_tiny_split_runs_end_to_end(tmp_path: Path, settings, embedder, capsys) -> None:
    data = write_data(tmp_path / "madial")

    code = run_cli(data, as_json=True, settings=settings, embedder=embedder, light_in_process=True)

    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert set(out) == {"systems", "search_ms", "writes"}
    # Four distinct memories per language, each held by a live memory; writing them again changes nothing.
    assert out["writes"] == {"zh": {"uncovered": [], "replay_changed": 0}, "en": {"uncovered": [], "replay_changed": 0}}
    assert set(out["systems"]) == {"memflow", "bm25", "dense"}
    for name, by_lang in out["systems"].items():
        assert set(by_lang) == {"zh", "en"}, name
        for lang, row in by_lang.items():
            assert list(row) == ["R@1", "R@3", "R@5", "R@10", "MRR@10"]
            assert 0.0 <= row["R@1"] <= row["R@3"] <= row["R@5"] <= row["R@10"] <= 1.0, (name, lang)
    # Every gold shares words with its dialogue: the keyword baseline finds the ice cream first.
    assert out["systems"]["bm25"]["en"]["MRR@10"] == 1.0
    assert out["systems"]["bm25"]["zh"]["R@10"] == 1.0
    assert out["systems"]["memflow"]["en"]["R@10"] == 1.0  # four memories: every one is within the top 10
    assert out["systems"]["memflow"]["en"]["MRR@10"] > 0.0
    assert out["search_ms"]["p95"] >= out["search_ms"]["p50"] > 0


def test_one_language_only_and_the_table(tmp_path: Path, settings, embedder, capsys) -> None:
    data = write_data(tmp_path / "madial", langs=("en",))  # no Chinese file needed: users are given here
    (data / "MADial-Bench-en-memory.json").write_text(
        '{"1": {"time": "2023-12-25", "event": "Bart danced at the Christmas party.", "user-id": 1}}\n')

    assert run_cli(data, langs=("en",), as_json=False, settings=settings, embedder=embedder,
                   light_in_process=True) == 0

    table = capsys.readouterr().out
    assert "en: 1 memories written, 2 dialogues" in table
    assert "memflow   en" in table and "zh" not in table.split("system")[1]


def test_unreadable_data_is_exit_code_2_with_one_line(tmp_path: Path, settings, capsys) -> None:
    assert run_cli(tmp_path / "missing", as_json=True, settings=settings) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read MADial-Bench data" in err
    data = write_data(tmp_path / "madial")
    (data / "MADial-Bench-zh-dialogue.json").write_text("[1, 2]\n")
    assert run_cli(data, as_json=True, settings=settings) == 2
    assert "line 1: not a JSON object" in capsys.readouterr().err


def test_the_command_is_registered_and_checks_its_language(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memflow.workers.cli import app

    assert CliRunner().invoke(app, ["bench", "madial", "--lang", "fr"]).exit_code == 2
    result = CliRunner().invoke(app, ["bench", "madial", "--data", str(tmp_path / "missing"), "--lang", "en"])
    assert result.exit_code == 2
