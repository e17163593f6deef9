"""Time references and habits, through `extract` (issue 5; docs/write-path.md#time-references).

A statement with a time reference is an event: a future one expires when its period
ends, a past one carries the date it happened in its content and never expires. Durable
wording ("我习惯", "I usually", "every morning I") is a standing preference, never an
event. Every date is resolved against the turn's own ts, in the turn's own timezone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from memflow.pipeline.models import Candidate, Dir, MType, TriggerReason
from memflow.pipeline.timeref import asked_period
from tests.test_pipeline_extract import run, statements, turn

TS = datetime(2026, 3, 4, 9, 0, tzinfo=UTC)  # a Wednesday
CST = timezone(timedelta(hours=8))
EST = timezone(timedelta(hours=-5))
# Thursday 07:30 in Shanghai is still Wednesday in UTC: "明天" is Friday 03-06 there.
CST_MORNING = datetime(2026, 3, 5, 7, 30, tzinfo=CST)
# Wednesday 21:00 in New York is already Thursday in UTC: "tonight" is still 03-04 there.
EST_EVENING = datetime(2026, 3, 4, 21, 0, tzinfo=EST)
# 07:00 on April 1st in Shanghai is March 31st in UTC: "月底" is the end of April there.
CST_FIRST_OF_APRIL = datetime(2026, 4, 1, 7, 0, tzinfo=CST)
YEAR_END = datetime(2026, 12, 20, 9, 0, tzinfo=UTC)


def day(month: int, dom: int, tz: timezone = UTC, year: int = 2026) -> datetime:
    return datetime(year, month, dom, tzinfo=tz)


def statement(text: str, ts: datetime) -> Candidate:
    (only,) = statements(run(TriggerReason.session_end, turn(text, ts=ts)))
    return only


def dated(c: Candidate, label: str) -> bool:
    """The content ends with the resolved period, as the extractor appends it."""
    return c.content.endswith((f"（{label}）", f" ({label})"))


# (text, the turn's time, expires_at, the period appended to the content)
FUTURE = [
    ("我下个月要去日本出差。", TS, day(5, 1), "2026-04"),
    ("我下周三要去医院复查。", TS, day(3, 12), "2026-03-11"),
    ("我明天下午三点要和客户开会。", TS, day(3, 6), "2026-03-05 15:00"),
    ("我明天上午十点半要去银行。", TS, day(3, 6), "2026-03-05 10:30"),
    ("我明天三点要开会。", TS, day(3, 6), "2026-03-05"),  # 03:00 or 15:00: no time of day
    ("我后天要去杭州。", TS, day(3, 7), "2026-03-06"),
    ("我大后天要交季度报告。", TS, day(3, 8), "2026-03-07"),
    ("我这周五要去面试。", TS, day(3, 7), "2026-03-06"),
    ("今晚要和朋友吃饭。", TS, day(3, 5), "2026-03-04"),
    ("这周末要去爬山。", TS, day(3, 9), "2026-03-07..2026-03-08"),
    ("我下下周要去上海开会。", TS, day(3, 23), "2026-03-16..2026-03-22"),
    ("我下下周三要去上海开会。", TS, day(3, 19), "2026-03-18"),
    ("我两周后要去北京。", TS, day(3, 19), "2026-03-18"),
    ("我月底要交房租。", TS, day(4, 1), "2026-03"),
    ("下个月底要交论文。", TS, day(5, 1), "2026-04"),
    ("我年底要换工作。", TS, day(1, 1, year=2027), "2026"),
    ("我3月15日要去体检。", TS, day(3, 16), "2026-03-15"),
    ("我1月5日回老家。", YEAR_END, day(1, 6, year=2027), "2027-01-05"),  # the nearest January 5th
    ("I have a dentist appointment next Tuesday.", TS, day(3, 11), "2026-03-10"),
    ("My sister is visiting in two weeks.", TS, day(3, 19), "2026-03-18"),
    ("I have a meeting with the client tomorrow at 3pm.", TS, day(3, 6), "2026-03-05 15:00"),
    ("The standup moved to tomorrow at 9:30.", TS, day(3, 6), "2026-03-05"),  # 9:30 am or pm: no time of day
    ("The release review is the day after tomorrow.", TS, day(3, 7), "2026-03-06"),
    ("I have a job interview this Friday.", TS, day(3, 7), "2026-03-06"),
    ("We are having dinner with friends tonight.", TS, day(3, 5), "2026-03-04"),
    ("I'm going hiking this weekend.", TS, day(3, 9), "2026-03-07..2026-03-08"),
    ("I am moving to Berlin next month.", TS, day(5, 1), "2026-04"),
    ("I'm flying to Tokyo on March 20th.", TS, day(3, 21), "2026-03-20"),
    ("The report is due at the end of the month.", TS, day(4, 1), "2026-03"),
    ("My lease ends next year.", TS, day(1, 1, year=2028), "2027"),
    ("我明天要交季度报告。", CST_MORNING, day(3, 7, CST), "2026-03-06"),
    ("I have a meeting with the client tomorrow at 3pm.", CST_MORNING, day(3, 7, CST), "2026-03-06 15:00"),
    ("我月底要交房租。", CST_FIRST_OF_APRIL, day(5, 1, CST), "2026-04"),
    ("We are having dinner with friends tonight.", EST_EVENING, day(3, 5, EST), "2026-03-04"),
]

# (text, the turn's time, the period it happened in)
PAST = [
    ("我去年去了日本。", TS, "2025"),
    ("去年年底我换了工作。", TS, "2025"),
    ("上个月月底交了房租。", TS, "2026-02"),
    ("我两天前开始跑步。", TS, "2026-03-02"),
    ("我昨天去了医院。", TS, "2026-03-03"),
    ("前天讨论了缓存方案的细节。", TS, "2026-03-02"),
    ("上周五我们评审了方案。", TS, "2026-02-27"),
    ("上周末去爬山了。", TS, "2026-02-28..2026-03-01"),
    ("11月3日去了北京。", YEAR_END, "2026-11-03"),
    ("I went to Japan last year.", TS, "2025"),
    ("I started the new diet two days ago.", TS, "2026-03-02"),
    ("I visited the museum yesterday.", TS, "2026-03-03"),
    ("I saw the doctor last Friday.", TS, "2026-02-27"),
    ("We went camping last weekend.", TS, "2026-02-28..2026-03-01"),
    ("My dentist appointment was on March 3rd.", TS, "2026-03-03"),
    ("我昨天去了医院。", CST_MORNING, "2026-03-04"),
]


@pytest.mark.parametrize(("text", "ts", "expires", "label"), FUTURE)
def test_a_future_reference_is_an_event_that_expires_when_its_day_or_period_ends(
    text: str, ts: datetime, expires: datetime, label: str
) -> None:
    c = statement(text, ts)
    assert (c.mtype, c.dir, c.ts) == (MType.event, Dir.events, ts)
    assert c.expires_at == expires and c.expires_at.utcoffset() == ts.utcoffset()  # midnight of the turn's own zone
    assert dated(c, label), c.content


@pytest.mark.parametrize(("text", "ts", "label"), PAST)
def test_a_past_reference_is_an_event_dated_when_it_happened(text: str, ts: datetime, label: str) -> None:
    c = statement(text, ts)
    assert (c.mtype, c.dir, c.expires_at) == (MType.event, Dir.events, None)
    assert dated(c, label), c.content


@pytest.mark.parametrize(
    "text",
    [
        "我习惯早上喝咖啡。",
        "我一般晚上写代码。",
        "我总是用 vim 写代码。",
        "我平时坐地铁上班。",
        "我每天早上跑步。",
        "我经常去日本出差。",  # docs/write-path.md#time-references: the standing version of "下个月去日本出差"
        "我习惯周末去爬山。",  # a habit, though it names a weekend
        "I always drink tea in the morning.",
        "I usually go to the gym after work.",
        "I tend to write long emails.",
        "I normally take the bus to work.",
        "Every morning I go for a run.",
        "I go for a run every morning.",
        "I usually go hiking on Saturday.",
    ],
)
def test_durable_wording_is_a_standing_preference(text: str) -> None:
    c = statement(text, TS)
    assert (c.mtype, c.dir, c.expires_at) == (MType.preference, Dir.preferences, None)


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("我平时用手机看新闻比较多。", "device.phone"),
        ("我一般吃素。", "health.diet"),
        ("I usually live in Berlin.", "location.city"),
    ],
)
def test_a_habit_is_keyed_by_its_own_words_never_by_a_topic_it_mentions(text: str, topic: str) -> None:
    """A routine must not become (or replace) the value of a single-valued topic: "我平时用手机看新闻"
    says nothing about which phone the user has (bench/probe-scenarios.jsonl p-zh-corr-phone)."""
    c = statement(text, TS)
    assert c.mtype is MType.preference and c.expires_at is None
    assert c.key.startswith("preference.habit.") and c.key != topic


@pytest.mark.parametrize(
    "text",
    ["我们每周一开例会。", "我觉得一般。", "我觉得你总是说错。", "I think every day is a gift."],
)
def test_routines_of_others_and_opinions_are_neither_events_nor_preferences(text: str) -> None:
    kinds = {c.mtype for c in statements(run(TriggerReason.session_end, turn(text, ts=TS)))}
    assert not kinds & {MType.event, MType.preference, MType.fact}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("我明天下午三点要和客户开会。", "我下周三上午十点要和客户开会。"),
        ("I have a meeting with the client tomorrow at 3pm.", "I have a meeting with the client next Tuesday."),
        ("去年年底我换了工作。", "上个月月底我换了工作。"),
    ],
)
def test_an_events_key_is_what_happens_not_when(first: str, second: str) -> None:
    assert statement(first, TS).key == statement(second, TS).key


@pytest.mark.parametrize(("question", "label"), [
    ("When did Melanie go camping in June?", "2025-06"),  # a month without its year: the last one begun
    ("What did I paint in January?", "2026-01"),
    ("What did we paint in July 2025?", "2025-07"),
    ("How often did I go to the beach in 2025?", "2025"),
    ("What did Gina find on 1 December, 2025?", "2025-12-01"),
    ("What did I do last week?", "2026-01-05..2026-01-11"),
    ("2025年8月我做了什么？", "2025-08"),
    ("去年三月我去了哪里？", "2025-03"),  # the closer of "去年" and "三月"
    ("我上个月读了什么书？", "2025-12"),
])
def test_a_question_names_the_period_it_asks_about(question: str, label: str) -> None:
    now = datetime(2026, 1, 14, 12, tzinfo=UTC)
    ref = asked_period(question, now)
    assert ref is not None and ref.label == label and ref.start <= now


@pytest.mark.parametrize("question", ["What is on next week?", "下个月有什么安排？", "What do I do every June?",
                                      "What is my favourite colour?", "What happened in 2031?"])
def test_a_question_about_no_period_or_one_still_to_come_names_none(question: str) -> None:
    assert asked_period(question, datetime(2026, 1, 14, 12, tzinfo=UTC)) is None
