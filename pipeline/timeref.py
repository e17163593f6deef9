"""Time references: "下个月", "next Tuesday", "昨天" resolved against the turn's own timestamp.

A statement with a time reference is an event, not a standing fact (seed 002 §4.3: "下个月
去日本出差" must not become "often goes to Japan"); a future one expires when its period
ends. Everything is computed from the event's `ts` and in its timezone; weeks start on
Monday. Nothing here reads the clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

_DAY = timedelta(days=1)
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_EN_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "a couple of": 2,
    "a few": 3,
    "couple of": 2,
    "few": 3,
}
_ZH_WEEKDAY = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_EN_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_UNIT_DAYS = {
    "天": 1,
    "日": 1,
    "周": 7,
    "星期": 7,
    "礼拜": 7,
    "月": 30,
    "年": 365,
    "day": 1,
    "week": 7,
    "month": 30,
    "year": 365,
}
_WD = "(monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_ZH_NUM = "([0-9]+|[一二两三四五六七八九十]+)"
_EN_NUM = r"(\d+|a couple of|couple of|a few|few|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
# Temporary preferences with no calendar word ("最近", "lately") last two weeks (τ of
# temp_preference is 14 d, seed 002 §2.1); "这次/for now" lasts the day.
_RECENTLY = re.compile(r"最近|这几天|这段时间|\blately\b|\brecently\b|\bthese days\b", re.I)
_RECENT_SPAN = timedelta(days=14)
_RECURRING = re.compile(r"每(?:天|日|周|星期|个?月|年)|\bevery\b|\bweekly\b|\bdaily\b|\bmonthly\b", re.I)


@dataclass(frozen=True)
class TimeRef:
    start: datetime  # first instant of the period meant
    end: datetime  # first instant after it: when a future event expires
    past: bool
    label: str  # the period in ISO form, appended to an event's content


def find_time(text: str, ts: datetime) -> TimeRef | None:
    """The first time reference in `text` (table order), resolved against `ts`.

    Recurring statements ("每周一开例会", "every Monday") name no single period: None.
    """
    if _RECURRING.search(text):
        return None
    for pattern, resolve in _RULES:
        m = pattern.search(text)
        if m:
            return resolve(m, ts)
    return None


def strip_time(text: str) -> str:
    """`text` without its time phrases: what an event is about, whenever it happens."""
    for pattern, _ in _RULES:
        text = pattern.sub(" ", text)
    return text


def temp_expiry(text: str, ts: datetime) -> datetime:
    """When a temporary preference stated at `ts` lapses."""
    ref = find_time(text, ts)
    if ref is not None and not ref.past:
        return ref.end
    if _RECENTLY.search(text):
        return ts + _RECENT_SPAN
    return _midnight(ts) + _DAY


def _midnight(ts: datetime) -> datetime:
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def _ref(ts: datetime, start: datetime, end: datetime, label: str) -> TimeRef:
    # Past when the whole period ended before the turn's day: "这周末" said on Sunday is not past.
    return TimeRef(start, end, end <= _midnight(ts), label)


def _days(ts: datetime, offset: int, length: int = 1) -> TimeRef:
    start = _midnight(ts) + offset * _DAY
    end = start + length * _DAY
    label = start.date().isoformat() if length == 1 else f"{start.date()}..{(end - _DAY).date()}"
    return _ref(ts, start, end, label)


def _week(ts: datetime, weeks: int, first_day: int = 0, length: int = 7) -> TimeRef:
    return _days(ts, 7 * weeks - ts.weekday() + first_day, length)


def _upcoming(ts: datetime, weekday: int) -> TimeRef:
    return _days(ts, (weekday - ts.weekday()) % 7)


def _month(ts: datetime, months: int) -> TimeRef:
    index = ts.year * 12 + ts.month - 1 + months
    start = _midnight(ts).replace(year=index // 12, month=index % 12 + 1, day=1)
    after = index + 1
    end = start.replace(year=after // 12, month=after % 12 + 1)
    return _ref(ts, start, end, f"{start.year:04d}-{start.month:02d}")


def _year(ts: datetime, years: int) -> TimeRef:
    start = _midnight(ts).replace(year=ts.year + years, month=1, day=1)
    return _ref(ts, start, start.replace(year=start.year + 1), f"{start.year:04d}")


def _zh_number(word: str) -> int:
    if word.isdigit():
        return int(word)
    if len(word) == 1:
        return _ZH_DIGITS.get(word, 1)
    tens, _, ones = word.partition("十")  # 十五, 二十, 二十五
    return _ZH_DIGITS.get(tens, 1) * 10 + _ZH_DIGITS.get(ones, 0)


def _en_number(word: str) -> int:
    return int(word) if word.isdigit() else _EN_NUMBERS.get(word.lower(), 1)


def _in_units(count: int, unit: str, ts: datetime, sign: int) -> TimeRef:
    return _days(ts, sign * count * _UNIT_DAYS[unit.lower()])


def _on_date(ts: datetime, year: int, month: int, day: int) -> TimeRef | None:
    try:
        start = _midnight(ts).replace(year=year, month=month, day=day)
    except ValueError:
        return None
    return _ref(ts, start, start + _DAY, start.date().isoformat())


_Resolver = Callable[[re.Match[str], datetime], "TimeRef | None"]


def _rule(pattern: str, resolve: _Resolver) -> tuple[re.Pattern[str], _Resolver]:
    return re.compile(pattern, re.IGNORECASE), resolve


# Table order is priority: longer phrases before their parts ("大后天" before "后天",
# "下周三" before "下周", "day after tomorrow" before "tomorrow"), future before past.
_RULES: tuple[tuple[re.Pattern[str], _Resolver], ...] = (
    _rule(r"(\d{4})-(\d{2})-(\d{2})", lambda m, ts: _on_date(ts, int(m[1]), int(m[2]), int(m[3]))),
    _rule(r"(\d{1,2})月(\d{1,2})[日号]", lambda m, ts: _on_date(ts, ts.year, int(m[1]), int(m[2]))),
    _rule(r"大后天", lambda m, ts: _days(ts, 3)),
    _rule(r"后天|\bday after tomorrow\b", lambda m, ts: _days(ts, 2)),
    _rule(r"明天|明早|明晚|明日|\btomorrow\b", lambda m, ts: _days(ts, 1)),
    _rule(
        r"今天|今晚|今早|今日|\btoday\b|\btonight\b|\bthis (?:morning|afternoon|evening)\b", lambda m, ts: _days(ts, 0)
    ),
    _rule(r"下(?:个)?(?:周|星期|礼拜)([一二三四五六日天])", lambda m, ts: _week(ts, 1, _ZH_WEEKDAY[m[1]], 1)),
    _rule(rf"\bnext {_WD}\b", lambda m, ts: _week(ts, 1, _EN_WEEKDAYS.index(m[1].lower()), 1)),
    _rule(r"下(?:个)?周末|\bnext weekend\b", lambda m, ts: _week(ts, 1, 5, 2)),
    _rule(r"周末|\bthis weekend\b|\bon the weekend\b", lambda m, ts: _week(ts, 0, 5, 2)),
    _rule(r"下(?:个)?(?:周|星期|礼拜)|\bnext week\b", lambda m, ts: _week(ts, 1)),
    _rule(r"(?:这|本)(?:个)?(?:周|星期|礼拜)(?![一二三四五六日天])|\bthis week\b", lambda m, ts: _week(ts, 0)),
    _rule(r"(?:周|星期|礼拜)([一二三四五六日天])", lambda m, ts: _upcoming(ts, _ZH_WEEKDAY[m[1]])),
    _rule(rf"\b(?:on |this )?{_WD}\b", lambda m, ts: _upcoming(ts, _EN_WEEKDAYS.index(m[1].lower()))),
    _rule(r"下(?:个)?月|\bnext month\b", lambda m, ts: _month(ts, 1)),
    _rule(r"(?:这|本)个?月|月底|月末|\bthis month\b|\bend of (?:the|this) month\b", lambda m, ts: _month(ts, 0)),
    _rule(r"明年|\bnext year\b", lambda m, ts: _year(ts, 1)),
    _rule(r"今年|年底|年末|\bthis year\b|\bend of (?:the|this) year\b", lambda m, ts: _year(ts, 0)),
    _rule(
        rf"{_ZH_NUM}\s*个?(天|周|星期|礼拜|月|年)(?:后|之后|以后)",
        lambda m, ts: _in_units(_zh_number(m[1]), m[2], ts, 1),
    ),
    _rule(rf"\bin {_EN_NUM} (day|week|month|year)s?\b", lambda m, ts: _in_units(_en_number(m[1]), m[2], ts, 1)),
    _rule(r"过(?:两|几)天", lambda m, ts: _days(ts, 2)),
    _rule(r"大前天", lambda m, ts: _days(ts, -3)),
    _rule(r"前天|\bday before yesterday\b", lambda m, ts: _days(ts, -2)),
    _rule(r"昨天|昨晚|昨日|\byesterday\b|\blast night\b", lambda m, ts: _days(ts, -1)),
    _rule(rf"\blast {_WD}\b", lambda m, ts: _week(ts, -1, _EN_WEEKDAYS.index(m[1].lower()), 1)),
    _rule(r"上(?:个)?(?:周|星期|礼拜)|\blast week\b", lambda m, ts: _week(ts, -1)),
    _rule(r"上(?:个)?月|\blast month\b", lambda m, ts: _month(ts, -1)),
    _rule(r"去年|\blast year\b", lambda m, ts: _year(ts, -1)),
    _rule(rf"{_ZH_NUM}\s*个?(天|周|星期|礼拜|月|年)前", lambda m, ts: _in_units(_zh_number(m[1]), m[2], ts, -1)),
    _rule(rf"\b{_EN_NUM} (day|week|month|year)s? ago\b", lambda m, ts: _in_units(_en_number(m[1]), m[2], ts, -1)),
)
