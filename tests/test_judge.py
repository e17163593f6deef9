"""The second look's reranker on its real model (shared/inference/reranker.py): USE multilingual v3 reads an answer in either
language above a sentence that only shares the question's words, and calls unrelated what is unrelated."""

from __future__ import annotations

import pytest

from memflow.shared.inference.reranker import Reranker


@pytest.fixture(scope="module")
def reranker() -> Reranker:
    return Reranker.use()


@pytest.mark.parametrize(("question", "answer", "shares_words"), [
    ("Where does my daughter go to school?", "我女儿在北京第四中学读高二。", "The school bus was late again today."),
    ("我平时喝什么咖啡？", "I always order a flat white with oat milk.", "咖啡机的说明书找不到了。"),
    ("What instrument do I play?", "I've been taking cello lessons since I was eight.",
     "The play at the theatre was sold out."),
])
def test_an_answer_outranks_a_sentence_that_shares_the_questions_words(reranker: Reranker, question: str, answer: str,
                                                                      shares_words: str) -> None:
    margin_answer, margin_words = reranker.margins([question], [answer, shares_words])
    assert margin_answer > 0 and margin_answer > margin_words


def test_unrelated_text_stands_at_or_below_the_floor(reranker: Reranker) -> None:
    [unrelated] = reranker.margins(["What instrument do I play?"], ["The invoice was paid on Tuesday."])
    assert unrelated <= 0.0  # one of the floor's own sentences
    assert reranker.margins(["What instrument do I play?"], []) == []


def looked_at(reranker: Reranker, query: str, about: str | None, weight: float) -> list[str]:
    """What `second_look_for` makes of a first pass that put a sentence sharing the question's words first, with the
    second look weighing `weight` in the query's profile (a request's or a dialogue's)."""
    from dataclasses import replace

    from memflow.pipeline.models import QueryPlan, Route
    from memflow.pipeline.ranking import RankingProfiles
    from memflow.pipeline.search import second_look_for
    from tests.test_pipeline_score import memory

    fused = [(memory("words", content="The play at the theatre was sold out."), 2.0),
             (memory("answer", content="I've been taking cello lessons since I was eight."), 1.0)]
    plan = QueryPlan(intent="general_chat", routes=[Route(text=query)], about=about)
    profile = replace(RankingProfiles().of(query), second_look_weight=weight)
    return [m.id for m, _ in second_look_for(reranker, profile, query, plan)(fused)]


def test_a_request_about_the_user_is_judged_again_and_one_about_nobody_of_theirs_is_not(reranker: Reranker) -> None:
    assert looked_at(reranker, "What instrument do I play?", "self", 0.7) == ["answer", "words"]
    # "What did Caroline play?" names nobody of the user's: its answer is the one with her name and its words
    assert looked_at(reranker, "What instrument did Caroline play?", None, 0.7) == ["words", "answer"]
    assert looked_at(reranker, "What instrument do I play?", "self", 0.0) == ["words", "answer"]


def test_a_dialogue_is_judged_by_its_last_turns(reranker: Reranker) -> None:
    dialogue = ("user: the theatre downtown is lovely\nassistant: it is, with a good season\n"
                "user: anyway, I have my lesson tonight\nassistant: which instrument was it again?")
    assert looked_at(reranker, dialogue, None, 0.55) == ["answer", "words"]
    assert looked_at(reranker, dialogue, None, 0.0) == ["words", "answer"]
