"""What a natural chat leaves behind, searched with no LLM (docs/ranking.md#the-assistants-turns and
#across-languages): the assistant's small talk never above the user's facts, a question in one language finds the
answer said in the other, and a question about the user is not answered with a relative's fact. The chats are
worded for these tests, apart from the eval sets'."""

from __future__ import annotations

import orjson
import pytest

from memflow.bench.scenarios import evaluate, parse_lines
from memflow.pipeline.models import Memory, MType, Source
from memflow.pipeline.score import across_languages, by_speaker, judged_across
from tests.test_pipeline_score import memory


def said(at: str, session: str, role: str, text: str) -> dict[str, object]:
    return {"at": at, "say": {"session": session, "role": role, "text": text}}


def asked(at: str, text: str, **expect: object) -> dict[str, object]:
    return {"at": at, "query": {"text": text, "k": 5}, "expect": expect}


CHATS = [
    {"id": "small-talk-en", "subject": "ct-small-talk-en", "steps": [
        said("2026-04-01T08:00:00Z", "s1", "user", "Hey, Tom here. I'm a bus driver in Glasgow and I rent a flat near the river."),
        said("2026-04-01T08:00:30Z", "s1", "assistant", "Lovely to meet you, Tom! What would you like to do today?"),
        {"at": "2026-04-01T08:30:00Z", "end_session": "s1"},
        asked("2026-04-03T10:00:00Z", "What is my profession?", top1="bus driver"),
        asked("2026-04-03T10:01:00Z", "Where is my home?", top1="Glasgow"),
    ]},
    {"id": "small-talk-zh", "subject": "ct-small-talk-zh", "steps": [
        said("2026-04-01T08:00:00Z", "s1", "user", "我叫阿杰，在成都一家医院做牙医，住在高新区。"),
        said("2026-04-01T08:00:30Z", "s1", "assistant", "Great to hear from you! What can I help with?"),
        said("2026-04-01T08:01:00Z", "s1", "user", "对了，下周五我要去看眼科。"),
        said("2026-04-01T08:01:30Z", "s1", "assistant", "I'll remind you about the eye doctor on Thursday evening."),
        {"at": "2026-04-01T08:30:00Z", "end_session": "s1"},
        asked("2026-04-03T10:00:00Z", "我从事什么职业？", top1="牙医"),
        asked("2026-04-03T10:01:00Z", "我住在哪个区？", top1="高新区"),
        # spoken to the assistant: what it committed to is found
        asked("2026-04-03T10:02:00Z", "When will you remind me about the eye doctor?", hit=["Thursday evening"]),
    ]},
    {"id": "across-languages", "subject": "ct-across", "steps": [
        said("2026-04-01T08:00:00Z", "s1", "user", "我家的狗叫豆豆，是一只两岁的柯基。"),
        said("2026-04-01T08:00:30Z", "s1", "assistant", "What a nice name! Anything else on your mind?"),
        said("2026-04-01T08:01:00Z", "s1", "user", "I play badminton with my colleagues every Tuesday evening."),
        said("2026-04-01T08:01:30Z", "s1", "assistant", "Noted, thanks."),
        said("2026-04-01T08:02:00Z", "s1", "user", "The weather has been awful all week."),
        said("2026-04-01T08:02:30Z", "s1", "user", "楼下的面包店换了新招牌。"),
        {"at": "2026-04-01T08:30:00Z", "end_session": "s1"},
        asked("2026-04-03T10:00:00Z", "What is my dog called?", top1="豆豆"),
        asked("2026-04-03T10:01:00Z", "我周二晚上一般做什么？", top1="badminton"),
    ]},
    {"id": "whom-en-answer", "subject": "ct-whom-en", "steps": [
        said("2026-04-01T08:00:00Z", "s1", "user", "I test video games for a small studio, that's my job."),
        said("2026-04-01T08:00:30Z", "s1", "user", "我表哥在律师事务所工作，是一名律师。"),
        said("2026-04-01T08:01:00Z", "s1", "user", "小区门口新开了一家奶茶店。"),
        {"at": "2026-04-01T08:30:00Z", "end_session": "s1"},
        asked("2026-04-03T10:00:00Z", "我是做什么工作的？", top1="video games"),
    ]},
]


# Not reached yet: the user's job fact is extracted now ("我在…医院当护士", work.role) and the question reads that
# key ("What do I do for work?" names work.role), but neither the first pass nor the judge reads the Chinese
# sentence as an answer (the judge's margin 0.007, the cousin's 0.16): the key route alone gives it 0.57, and the
# cousin's English turn, ranked down to 0.2 of its relevance, still scores 0.60.
GAPS = [
    {"id": "whom-zh-answer", "subject": "ct-whom-zh", "steps": [
        said("2026-04-01T08:00:00Z", "s1", "user", "我在市中心的一家医院当护士。"),
        said("2026-04-01T08:00:30Z", "s1", "user", "My cousin works as a lawyer for a firm in Boston."),
        said("2026-04-01T08:01:00Z", "s1", "user", "The bus to the station was late again."),
        {"at": "2026-04-01T08:30:00Z", "end_session": "s1"},
        asked("2026-04-03T10:00:00Z", "What do I do for work?", top1="护士"),
    ]},
]


def failed_in(settings, paired, chats: list[dict[str, object]]) -> list[tuple[object, ...]]:
    quiet = settings.replace(reclaim_idle_ms=60_000)  # as for the probe scenarios (issue 7)
    report = evaluate(parse_lines([orjson.dumps(c).decode() for c in chats]), quiet, paired, file="chats")
    assert report.not_runnable == 0 and report.counts["errors"] == 0
    return [(s.id, c.query, c.kind, c.expected, c.got) for s in report.scenarios for c in s.expectations
            if c.passed is not True]


@pytest.mark.timeout(300)  # a system per chat
def test_a_chats_facts_are_found_first_in_either_language(settings, paired) -> None:
    assert failed_in(settings, paired, CHATS) == []


@pytest.mark.xfail(reason="a job said in the other language, which no reader ranks as an answer", strict=False)
@pytest.mark.timeout(300)
def test_a_job_said_in_the_other_language_with_no_fact_extracted_outranks_a_cousins(settings, paired) -> None:
    assert failed_in(settings, paired, GAPS) == []


def turn(mid: str, content: str, source: Source = Source.explicit) -> Memory:
    return memory(mid, content=content, mtype=MType.episode, source=source)


def test_an_assistants_turn_ranks_below_the_users_words_for_a_question_about_someone() -> None:
    fused = [(turn("hello", "Nice to see you again! What can I do for you?", Source.derived), 2.0),
             (turn("fact", "I moved to Lyon last spring."), 0.8)]
    assert [m.id for m, _ in by_speaker(fused, "self", False, 0.2)] == ["fact", "hello"]
    assert [m.id for m, _ in by_speaker(fused, "mother", False, 0.2)] == ["fact", "hello"]
    # Switched off, or asked of the assistant, or about nobody: as the first pass ranked them
    assert [m.id for m, _ in by_speaker(fused, "self", False, 1.0)] == ["hello", "fact"]
    assert [m.id for m, _ in by_speaker(fused, "self", True, 0.2)] == ["hello", "fact"]
    assert [m.id for m, _ in by_speaker(fused, None, False, 0.2)] == ["hello", "fact"]


def test_a_tasks_record_is_no_assistants_turn() -> None:
    fused = [(turn("task", "task success: the backup script now runs nightly", Source.derived), 2.0),
             (turn("fact", "I moved to Lyon last spring."), 0.8)]
    assert [m.id for m, _ in by_speaker(fused, "self", False, 0.2)] == ["task", "fact"]


def test_the_other_languages_candidates_are_lifted_by_the_judge_and_the_questions_own_are_not() -> None:
    fused = [(memory("chat", content="The weather has been awful all week."), 1.0),
             (memory("near", content="My neighbour's dog barks at night."), 0.6),
             (memory("answer", content="我家的狗叫豆豆。"), 0.0)]
    judged = judged_across(fused, "en", depth=2)
    assert judged == [0, 1, 2]  # the head, then the other language after it
    margins = [0.05, 0.3, 0.4]
    lifted = across_languages(fused, judged, margins, "en", 0.7)
    # lifted to 0.7 of the head's best: above the question's language's weaker match, never past its best alone
    assert [m.id for m, _ in lifted] == ["chat", "answer", "near"]
    assert dict((m.id, s) for m, s in lifted)["near"] == 0.6  # the question's language keeps its relevance
    assert [m.id for m, _ in across_languages(fused, judged, margins, "en", 0.0)] == ["chat", "near", "answer"]


def test_a_subject_in_one_language_never_calls_the_judge() -> None:
    fused = [(memory("a", content="I like tea."), 1.0), (memory("b", content="I run on Sundays."), 0.5)]
    assert judged_across(fused, "en", depth=20) == []

