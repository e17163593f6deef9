"""The heuristic query planner: intents, directories and routes (docs/ranking.md#routes)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from memflow.pipeline.models import Dir, QueryPlan, Route, Strategy
from memflow.pipeline.plan import INTENT_DIRS, Intent, is_ambiguous, is_transcript, named_entities, plan, recent_turns

DEV_SCENARIOS = Path("/work/shared/eval/dev-scenarios.jsonl")
STRATEGIES = set(typing.get_args(Strategy))


def _dev_queries() -> list[tuple[str, dict[str, typing.Any]]]:
    if not DEV_SCENARIOS.exists():
        return []
    found = []
    for line in DEV_SCENARIOS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            for step in json.loads(line)["steps"]:
                if "query" in step and "intent" in step.get("expect", {}):
                    found.append((step["query"]["text"], step["expect"]))
    return found


def _searched_dirs(p: QueryPlan) -> set[str]:
    """The dirs of the primary route: where the intent says to look."""
    return {d.value for d in p.routes[0].dirs}


@pytest.mark.skipif(not DEV_SCENARIOS.exists(), reason="the dev set lives outside the repo")
@pytest.mark.parametrize(("query", "expect"), _dev_queries() or [("", {})])
def test_dev_set_intents_and_dirs(query: str, expect: dict[str, typing.Any]) -> None:
    p = plan(query)
    assert p.intent == expect["intent"]
    assert set(expect.get("dirs_include", [])) <= _searched_dirs(p)


# Hand-made cases, Chinese and English, for each of the 11 intents.
CASES: list[tuple[str, Intent]] = [
    ("以后都用 pnpm", "preference_update"),
    ("我不喜欢冗长的解释，回答请尽量简短。", "preference_update"),
    ("From now on, reply in English.", "preference_update"),
    ("Please keep answers short.", "preference_update"),
    ("别写那么长了", "preference_update"),
    ("我喜欢什么代码风格", "preference_query"),
    ("我现在希望通过什么渠道接收消息？", "preference_query"),
    ("What kind of code style do I prefer?", "preference_query"),
    ("What's my favorite editor?", "preference_query"),
    ("Which package manager should you use for me?", "preference_query"),
    ("上次那个项目叫什么", "entity_recall"),
    ("我家住在哪里？", "entity_recall"),
    ("我住在哪", "entity_recall"),
    ("青鸟项目用的是什么数据库？", "entity_recall"),
    ("what's the name of my manager", "entity_recall"),
    ("Who is my manager?", "entity_recall"),
    ("Where do I live?", "entity_recall"),
    ("那天说的方案再讲一遍", "event_recall"),
    ("下次开会是什么时候？", "event_recall"),
    ("我之前说过什么？", "event_recall"),
    ("What did we talk about in the meeting yesterday?", "event_recall"),
    ("When did I go to Tokyo?", "event_recall"),
    ("当时为什么选了这个方案", "decision_trace"),
    ("为什么用 Redis 而不用 Kafka？", "decision_trace"),
    ("what did we decide about the database?", "decision_trace"),
    ("Why did we choose Postgres for Atlas?", "decision_trace"),
    ("What was the reasoning behind picking RabbitMQ?", "decision_trace"),
    ("不能把密钥提交到 git", "rule_statement"),
    ("有什么事情是绝对不能做的？", "rule_statement"),
    ("有哪些规矩要遵守？", "rule_statement"),
    ("Never commit secrets to the repo.", "rule_statement"),
    ("What are the rules I gave you?", "rule_statement"),
    ("docker 依赖怎么起", "skill_request"),
    ("怎么启动本地服务？", "skill_request"),
    ("how do I bring up the local deps again?", "skill_request"),
    ("How do I deploy the staging server?", "skill_request"),
    ("What's the command to run the tests?", "skill_request"),
    ("不是北京，是上海", "correction"),
    ("更正一下，我已经搬到上海了", "correction"),
    ("Actually, my manager is Priya, not Tom.", "correction"),
    ("That's wrong, I live in Berlin now.", "correction"),
    ("帮我写个脚本", "new_task"),
    ("给我推荐一个度假的地方，考虑一下我的情况", "new_task"),
    ("Write me a script that renames files.", "new_task"),
    ("Please write a script to rename files.", "new_task"),
    ("Can you draft an email to the team?", "new_task"),
    ("到底哪个说法对？", "conflict_resolution"),
    ("你之前说用微信，现在又说钉钉，哪个是对的？", "conflict_resolution"),
    ("Which one is correct, Postgres or MySQL? You said both.", "conflict_resolution"),
    ("今天天气不错", "general_chat"),
    ("哈哈，谢谢", "general_chat"),
    ("nice weather today, isn't it", "general_chat"),
    ("thanks, that was helpful", "general_chat"),
    # Harder wording, found while probing.
    ("What language should you reply in?", "preference_query"),
    ("回答的时候用什么语言？", "preference_query"),
    ("我有什么忌口吗？", "entity_recall"),
    ("What database does Atlas use?", "entity_recall"),
    ("部署流程是什么？", "skill_request"),
    ("我能把密码写在代码里吗？", "rule_statement"),
    ("Can I commit API keys to git?", "rule_statement"),
    ("What's the reason we moved off MongoDB?", "decision_trace"),
    ("Where did we land on the auth approach?", "decision_trace"),
    ("那个 bug 最后是怎么解决的？", "event_recall"),
    ("How did we fix the login bug last week?", "event_recall"),
    ("No wait, my birthday is in June not July.", "correction"),
    ("Tell me my preferences.", "preference_query"),
    ("推荐一本书给我", "new_task"),
]


@pytest.mark.parametrize(("query", "intent"), CASES)
def test_intent(query: str, intent: Intent) -> None:
    assert plan(query).intent == intent


def test_every_intent_has_zh_and_en_cases() -> None:
    def has_cjk(text: str) -> bool:
        return any("\u4e00" <= ch <= "\u9fff" for ch in text)

    for intent in INTENT_DIRS:
        queries = [q for q, i in CASES if i == intent]
        assert any(has_cjk(q) for q in queries), intent
        assert any(not has_cjk(q) for q in queries), intent


@pytest.mark.parametrize(
    ("query", "dirs"),
    [
        ("我喜欢什么样的回答风格？", {"preferences"}),
        ("有什么事情是绝对不能做的？", {"system"}),
        ("上次那个项目叫什么", {"entities", "events"}),
        ("what's the name of my manager", {"entities", "events"}),
        ("what did we decide about the database?", {"events"}),
        ("为什么选了哨兵模式", {"events"}),
        ("how do I start the dev server?", {"skills", "tools"}),
        ("怎么启动本地服务？", {"skills", "tools"}),
    ],
)
def test_dirs(query: str, dirs: set[str]) -> None:
    assert dirs <= _searched_dirs(plan(query))


@pytest.mark.parametrize("query", ["今天天气不错", "nice weather today, isn't it"])
def test_general_chat_searches_the_whole_subject(query: str) -> None:
    p = plan(query)
    assert p.routes[0].dirs == []
    assert all(r.dirs == [] for r in p.routes)


def test_primary_route_is_semantic_at_full_weight() -> None:
    first = plan("What is my blood type?").routes[0]
    assert (first.strategy, first.weight, first.text) == ("semantic", 1.0, "What is my blood type?")


def test_chinese_queries_get_a_bm25_route_on_the_same_dirs() -> None:
    routes = plan("上次那个项目叫什么来着？").routes
    bm25 = [r for r in routes if r.strategy == "bm25"]
    assert len(bm25) == 1 and bm25[0].dirs == routes[0].dirs and bm25[0].weight < 1.0


def test_plain_english_without_names_has_no_bm25_route() -> None:
    assert all(r.strategy != "bm25" for r in plan("Who is my manager?").routes)


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("Why did we choose Postgres for Atlas?", {"Postgres", "Atlas"}),
        ("青鸟项目用的是什么数据库？", {"青鸟"}),
        ("docker 依赖怎么起", {"docker"}),
        ("what is “Nimbus” about?", {"Nimbus"}),
        ("「北极星」的负责人是谁？", {"北极星"}),
    ],
)
def test_named_entities_get_bm25_and_exact_match_routes(query: str, names: set[str]) -> None:
    routes = plan(query).routes
    assert names <= {r.text for r in routes if r.strategy == "exact_match"}
    assert any(r.strategy == "bm25" for r in routes)


@pytest.mark.parametrize(
    "query",
    [
        "上次那个项目叫什么",
        "那天说的方案再讲一遍",
        "Who is my manager?",
        "What's my favorite editor?",
        "I am from Berlin",
    ],
)
def test_deictic_words_and_sentence_starts_are_not_names(query: str) -> None:
    assert not {"那个", "说的", "那天", "Who", "What's", "I"} & set(named_entities(query))


def test_scoped_plans_keep_a_low_weight_whole_subject_route() -> None:
    routes = plan("有什么事情是绝对不能做的？").routes
    net = [r for r in routes if r.dirs == []]
    assert len(net) == 1 and net[0].strategy == "semantic" and net[0].weight < 0.5


@pytest.mark.parametrize("query", [q for q, _ in CASES] + ["", "   ", "？", "a" * 5000])
def test_routes_are_valid_and_serialisable(query: str) -> None:
    p = plan(query)
    assert p.source == "heuristic" and p.intent in INTENT_DIRS and p.routes
    assert all(r.strategy in STRATEGIES and all(isinstance(d, Dir) for d in r.dirs) for r in p.routes)
    assert QueryPlan.model_validate(p.model_dump(mode="json")) == p
    assert QueryPlan.model_validate_json(p.model_dump_json()) == p


def test_plan_is_deterministic() -> None:
    assert plan("当时为什么选了哨兵模式？") == plan("当时为什么选了哨兵模式？")


@pytest.mark.parametrize(
    ("query", "ambiguous"),
    [
        ("上次那个项目叫什么", True),
        ("当时为什么选了这个方案", True),
        ("What was that project called?", True),
        ("青鸟项目用的是什么数据库？", False),
        ("Who is my manager?", False),
        ("Why did we choose Postgres for Atlas?", False),
        ("Write me a script that renames files.", False),
        ("帮我写文档的时候要注意什么？", True),  # a task and a rules question, nearly tied
    ],
)
def test_is_ambiguous(query: str, ambiguous: bool) -> None:
    assert is_ambiguous(query) is ambiguous


@pytest.mark.parametrize("bad", [{"strategy": "regex"}, {"strategy": "SEMANTIC"}, {"dirs": ["secrets"]},
                                 {"weight": -1.0}])
def test_a_route_outside_the_closed_set_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Route.model_validate({"text": "q", **bad})


@pytest.mark.parametrize(
    ("query", "key"),
    [("Who do I report to?", "person.manager"), ("我现在用什么型号的手机？", "device.phone"),
     ("我现在住在哪个城市？", "location.city"), ("What's the weather like today?", None)],
)
def test_a_question_about_a_known_topic_also_searches_its_key(query: str, key: str | None) -> None:
    keyed = [r for r in plan(query).routes if r.keys]
    assert [r.keys for r in keyed] == ([[key, key + ".now"]] if key else [])
    assert all(r.dirs == [] and r.strategy == "semantic" for r in keyed)


DIALOGUE = ("Bart: Do you think my outfit looks good today?\n"
            "Assistant: Wow, it looks really great on you!\n"
            "Bart: Really? My mom picked it out, and I really like this color!\n"
            "Assistant：你妈妈选得太好了\n"
            "Bart: I also think the little flowers above are very pretty!")


def test_a_transcript_is_searched_as_it_stands_over_the_whole_subject() -> None:
    """Its lines cue every intent, and its capitalised words ("Do", "Really") are no names."""
    assert is_transcript(DIALOGUE) and not is_transcript("What do I like?\nAnd why?")
    planned = plan(DIALOGUE)
    assert [(r.text, r.dirs, r.strategy, r.keys) for r in planned.routes] == [(DIALOGUE, [], "semantic", [])]
    assert not is_ambiguous(DIALOGUE)
    # Two lines are still one request: planned as before.
    assert plan("I prefer tabs.\nWhat indentation do I like?").routes[0].dirs


def test_the_recent_turns_of_a_dialogue_are_its_last_lines_without_speakers() -> None:
    assert recent_turns(DIALOGUE, 2) == "你妈妈选得太好了\nI also think the little flowers above are very pretty!"
    assert recent_turns(DIALOGUE, 1) == "I also think the little flowers above are very pretty!"
    assert recent_turns("What do I like?\nAnd why?", 2) is None
    assert recent_turns(DIALOGUE, 0) is None
    # A colon inside a sentence is not a speaker: a speaker's name has no spaces.
    assert recent_turns("a\nb\nNote the time: 5pm", 1) == "Note the time: 5pm"
