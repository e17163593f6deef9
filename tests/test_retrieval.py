"""The read path end to end: lifecycle scoring, negation and scope, traces of every factor.

Real redis-server, real Edge shard, the real model; time is the events' and the searches' `now`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import orjson

from memflow.shared.redisdb.keys import FIELD
from tests.conftest import System
from tests.test_system import end, memories, say

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)


def test_negation_and_scope_keep_near_duplicates_apart(system: System) -> None:
    """"不喜欢代码示例" (no code at all) and "不喜欢长代码" (no *long* code) embed 0.9+ alike, but are
    different wishes (docs/architecture.md#what-the-vectors-cannot-tell): both are kept, and each question finds its own first."""
    say(system, "neg", "n1", "我不喜欢代码示例。", at=T0)
    say(system, "neg", "n2", "我不喜欢长代码。", at=T0 + timedelta(minutes=1))
    say(system, "neg", "n3", "I don't like code examples.", at=T0 + timedelta(minutes=2))
    say(system, "neg", "n4", "I don't like long code blocks.", at=T0 + timedelta(minutes=3))
    end(system, "neg", at=T0 + timedelta(minutes=10))
    assert system.client.wait_idle(timeout_s=60)
    prefs = [m for m in memories(system, "neg") if m.mtype == "preference"]
    assert len(prefs) == 4 and all(m.status == "active" for m in prefs)

    now = T0 + timedelta(days=1)
    for query, wanted in [("用户对代码示例有什么偏好？", "代码示例"), ("用户对长代码有什么偏好？", "长代码"),
                          ("Does the user want code examples?", "code examples"),
                          ("Does the user mind long code blocks?", "long code blocks")]:
        hits = system.client.search("neg", query, k=3, now=now).hits
        assert wanted in hits[0].content, (query, [h.content for h in hits])
    packed = system.client.pack("neg", "写一个排序函数，用户对代码有什么偏好？", budget_tokens=400, now=now)
    assert any("代码示例" in line for line in packed.preferences) and any("长代码" in line for line in packed.preferences)


def test_chatter_that_parrots_the_question_does_not_crowd_out_a_used_preference(system: System) -> None:
    say(system, "life", "l1", "我一直偏好结构化、要点式的方案文档，不要长段落。", at=T0)
    end(system, "life", "s1", at=T0 + timedelta(minutes=5))
    chatter = ["写方案文档要注意什么，今天又想了一遍。", "写方案文档要注意的事，昨天讨论了。", "写方案文档要注意格式，这周要交三份。"]
    later = T0 + timedelta(days=40)
    for i, text in enumerate(chatter):
        say(system, "life", f"c{i}", text, session="s2", at=later + timedelta(minutes=i))
    end(system, "life", "s2", at=later + timedelta(minutes=10))
    assert system.client.wait_idle(timeout_s=60)
    [pref] = [m for m in memories(system, "life") if m.mtype == "preference"]
    system.client.feedback("life", [pref.id], at=later - timedelta(days=1))

    result = system.client.search("life", "帮我写方案文档要注意什么？", k=3, now=later + timedelta(hours=1))
    hit = next((h for h in result.hits if h.id == pref.id), None)
    assert hit is not None, [h.content for h in result.hits]  # a place is kept for it among the chatter
    top = hit.scores
    assert top["hotness"] > 1.0 and top["tier"] > 1.0 and 0 < top["strength"] <= 1.0
    assert abs(top["final"] - top["relevance"] * top["lifecycle"]) < 1e-9
    [(_, fields)] = system.ctx.transient.xrevrange(system.ctx.keys.traces, count=1)
    trace = orjson.loads(fields[FIELD.encode()])
    chosen = next(c for c in trace["candidates"] if c["id"] == pref.id)
    assert {"relevance", "strength", "hotness", "tier", "lifecycle", "final"} <= chosen.keys()


def test_a_question_about_a_topic_finds_its_current_value_in_other_words(system: System) -> None:
    say(system, "boss", "b1", "My manager is Tom Becker, he runs the platform group.", at=T0)
    say(system, "boss", "b2", "I have a one-on-one every Monday.", at=T0 + timedelta(minutes=1))
    end(system, "boss", "s1", at=T0 + timedelta(minutes=5))
    later = T0 + timedelta(days=20)
    say(system, "boss", "b3", "Correction: my manager is now Aisha Khan, Tom moved to another team.", session="s2",
        at=later)
    end(system, "boss", "s2", at=later + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    result = system.client.search("boss", "Who do I report to?", k=3, now=later + timedelta(days=1))
    assert "Aisha" in result.hits[0].content, [h.content for h in result.hits]
    assert all("Tom Becker" not in h.content for h in result.hits)


def test_chinese_is_found_by_meaning_and_a_dialogue_by_what_was_just_said(paired_system: System) -> None:
    """The default paired vector reads Chinese (e5) where MiniLM saw [UNK]s; a conversation handed
    over as the query is searched over the whole subject, with its last turns weighing most."""
    system = paired_system
    diary = ["Bart在生日派对上收到一束花，非常开心。", "Bart和同学们去动物园看了熊猫。",
             "Bart的爸爸教他骑自行车，摔了好几次。", "Bart在学校的数学考试得了满分。",
             "Bart went fishing with his grandfather at the lake.", "Bart在公园里弄丢了他最喜欢的红色风筝。"]
    for i, text in enumerate(diary):
        system.client.write("bart", text, ts=T0 + timedelta(days=i))
    assert system.client.wait_idle(timeout_s=60)
    now = T0 + timedelta(days=30)
    # No word in common with the memory: only the meaning matches.
    hits = system.client.search("bart", "他学会骑车了吗？", k=3, now=now).hits
    assert "自行车" in hits[0].content, [h.content for h in hits]
    dialogue = ("Bart: 上次去动物园看熊猫真好玩！\n"
                "Assistant: 是啊，熊猫吃竹子的样子很可爱。\n"
                "Bart: 今天天气真好，风也很大。\n"
                "Assistant: 很适合出去玩，你想做什么？\n"
                "Bart: 我想再放一次风筝，就像以前那个红色的。")
    result = system.client.search("bart", dialogue, k=3, now=now)
    assert result.plan is not None and result.plan.intent == "general_chat"
    assert [r.dirs for r in result.plan.routes] == [[]]
    assert "风筝" in result.hits[0].content, [(h.content, h.scores) for h in result.hits]


def test_a_dialogue_leans_on_meaning_and_a_request_on_its_words() -> None:
    from memflow.pipeline.ranking import RankingProfiles

    profiles = RankingProfiles().tuned({"request.dense_weight": 0.4, "dialogue.dense_weight": 1.6})
    assert profiles.of("Who do I report to?").dense_weight == 0.4
    assert profiles.of("I prefer tabs.\nWhat do I like?").dense_weight == 0.4
    assert profiles.of("A: hi\nB: hello\nA: I lost my kite").dense_weight == 1.6
    assert (RankingProfiles().of("Who?").dense_weight, RankingProfiles().of("a\nb\nc").dense_weight) == (0.5, 1.5)


def test_a_question_that_names_a_period_finds_what_was_said_in_it(system: System) -> None:
    """Two trips to the same lake, in March and in May: "in March" decides which one, by when it was said.
    Without the period the newer one ranks first (fresher, same words)."""
    march, may = datetime(2026, 3, 14, 10, tzinfo=UTC), datetime(2026, 5, 9, 10, tzinfo=UTC)
    say(system, "trips", "t1", "We went kayaking on Lake Tahoe with my brother, it was cold.", at=march)
    end(system, "trips", "s1", at=march + timedelta(minutes=5))
    say(system, "trips", "t2", "We went kayaking on Lake Tahoe with my sister, the water was calm.", session="s2",
        at=may)
    end(system, "trips", "s2", at=may + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    now = datetime(2026, 6, 1, tzinfo=UTC)

    asked = system.client.search("trips", "Who went kayaking with me in March?", k=2, now=now)
    assert "brother" in asked.hits[0].content, [h.content for h in asked.hits]
    assert asked.plan is not None and asked.plan.period is not None and asked.plan.period.label == "2026-03"
    [(_, fields)] = system.ctx.transient.xrevrange(system.ctx.keys.traces, count=1)
    assert orjson.loads(fields[FIELD.encode()])["period"] == "2026-03"  # the trace says why it ranked so
    plain = system.client.search("trips", "Who went kayaking with me?", k=2, now=now)
    assert "sister" in plain.hits[0].content and plain.plan is not None and plain.plan.period is None
    # A period still to come names nothing said yet: no boost, the same order as without one.
    ahead = system.client.search("trips", "Who goes kayaking with me next week?", k=2, now=now)
    assert ahead.plan is not None and ahead.plan.period is None


def test_a_request_names_a_period_and_a_dialogue_does_not() -> None:
    from memflow.pipeline.ranking import REQUEST, RankingProfiles
    from memflow.pipeline.score import flat_plan
    from memflow.pipeline.search import dated

    now = datetime(2026, 6, 1, tzinfo=UTC)
    request = "What did I find last summer, in 2025?"
    dialogue = "A: 你好\nB: 你好呀\nA: 其实我去年夏天发现了一个白色的乒乓球！"
    profiles = RankingProfiles()
    period = dated(profiles.of(request), flat_plan(request), request, now).period
    assert period is not None and period.label == "2025"
    assert dated(profiles.of(dialogue), flat_plan(dialogue), dialogue, now).period is None
    assert dated(replace(REQUEST, period_boost=0), flat_plan(request), request, now).period is None
