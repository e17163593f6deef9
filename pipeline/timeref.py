"""Time references: "下个月", "next Tuesday", "昨天" resolved against the turn's own timestamp.

A statement with a time reference is an event, not a standing fact (docs/write-path.md#time-references: "下个月
去日本出差" must not become "often goes to Japan"); a future one expires when its period
ends. Everything is computed from the event's `ts` and in its timezone; weeks start on
Monday. Nothing here reads the clock.

Expiry keeps day granularity: an appointment "明天下午三点" / "tomorrow at 3pm" still
matters that evening, so it lapses when its day ends; the hour only goes into the label.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
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
_EN_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
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
# "周天" is Sunday, but "下周天气" is next week's weather.
_ZH_WD = "([一二三四五六日]|天(?!气))"
_MON = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_ORD = r"(\d{1,2})(?:st|nd|rd|th)?\b"
_ZH_NUM = "([0-9]+|[一二两三四五六七八九十]+)"
# "去年年底", "下个月底": the end of a period named is in that period.
_MONTH_END = "(?:月?[底末])?"
_YEAR_END = "(?:年?[底末])?"
_EN_NUM = r"(\d+|a couple of|couple of|a few|few|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
# Temporary preferences with no calendar word ("最近", "lately") last two weeks (τ of
# temp_preference is 14 d, docs/ranking.md#lifecycle-scoring); "这次/for now" lasts the day.
_RECENTLY = re.compile(r"最近|这几天|这段时间|\blately\b|\brecently\b|\bthese days\b", re.I)
_RECENT_SPAN = timedelta(days=14)
_RECURRING = re.compile(r"每(?:天|日|周|星期|个?月|年)|\bevery\b|\bweekly\b|\bdaily\b|\bmonthly\b", re.I)
_HALF_YEAR = timedelta(days=183)

# A time of day, only ever a detail of a day named elsewhere ("明天下午三点", "tomorrow at
# 3pm"), and only when the text says which half of the day: "明天三点" and "at 9:30" may be
# either, and bare "一点" is "a little" ("详细一点"). Midnight, "晚上十二点", belongs to the
# next day: no clock either. Minutes as one numeral need "分": "三点一起去" is no 03:01.
_ZH_CLOCK = re.compile(
    r"(早上|早晨|上午|中午|下午|傍晚|晚上|夜里|凌晨)?\s*([0-9]{1,2}|[一二两三四五六七八九十]+)\s*[点點]钟?"
    r"(?:\s*(半|一刻|三刻|[0-9]{1,2}分?|[一二三四五六七八九十]{2,3}分?|[一二三四五六七八九十]分))?"
)
# Hours below these, said with this part of the day, are after noon: 中午一点 is 13:00 but
# 中午十一点 11:00; 晚上十二点 would be 24:00, no time of the day named.
_ZH_PM_BELOW = {"中午": 11, "下午": 12, "傍晚": 12, "晚上": 13, "夜里": 13}
_ZH_QUARTERS = {"半": 30, "一刻": 15, "三刻": 45}
# "3pm", "3:30 p.m.", "12am", or hours and minutes without am/pm ("at 15:00").
_EN_CLOCK = re.compile(r"\b(?:at )?(\d{1,2})(?::([0-5]\d))?\s*(?:([ap])\.?m\b\.?|(?<=:\d\d))", re.I)
# The first hour that is unambiguous without am/pm.
_AFTERNOON_HOUR = 13
# Parts of a day: not what an event is about, so they leave its key with the time phrases.
_DAY_PART = re.compile(
    r"早上|早晨|上午|中午|下午|傍晚|晚上|夜里|凌晨|\b(?:in the )?(?:morning|afternoon|evening)\b", re.I
)


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
    ref = _first(_RULES, text, ts)
    return None if ref is None else _with_clock(ref, text)


def asked_period(text: str, now: datetime) -> TimeRef | None:
    """The period a question asks about, if it names one that has begun by `now`: "what did I do
    last week", "in June", "on 1 February, 2023", "2023年8月". A period still to come names no
    memory yet (what is planned for it was said before it), so it is not one."""
    if _RECURRING.search(text):
        return None
    named = [ref for ref in (_first(_RULES, text, now), _first(_PERIOD_RULES, text, now)) if ref is not None]
    ref = min(named, key=lambda r: r.end - r.start, default=None)  # the closer one: "去年三月" is March
    return ref if ref is not None and ref.start <= now else None


def _first(rules: tuple[tuple[re.Pattern[str], _Resolver], ...], text: str, ts: datetime) -> TimeRef | None:
    for pattern, resolve in rules:
        m = pattern.search(text)
        try:
            ref = resolve(m, ts) if m else None
        except (OverflowError, ValueError):  # "5000 years ago", "in 99999 days": past the calendar, no date
            ref = None
        if ref is not None:
            return ref
    return None


def strip_time(text: str) -> str:
    """`text` without its time phrases: what an event is about, whenever it happens."""
    for pattern in (*(p for p, _ in _RULES), _ZH_CLOCK, _EN_CLOCK, _DAY_PART):
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


def _with_clock(ref: TimeRef, text: str) -> TimeRef:
    """A one-day reference labelled with the time of day the text names, if any."""
    clock = _clock(text) if ref.end - ref.start == _DAY else None
    return replace(ref, label=f"{ref.label} {clock}") if clock else ref


def _clock(text: str) -> str | None:
    """The first time of day in `text` as "HH:MM", or None."""
    for m in _ZH_CLOCK.finditer(text):
        if clock := _zh_clock(m):
            return clock
    for m in _EN_CLOCK.finditer(text):
        if clock := _en_clock(m):
            return clock
    return None


def _zh_clock(m: re.Match[str]) -> str | None:
    part, hour = m[1], _zh_number(m[2])
    if not part and hour < _AFTERNOON_HOUR:
        return None  # "明天三点": 03:00 or 15:00
    if hour < _ZH_PM_BELOW.get(part or "", 0):
        hour += 12
    minutes = m[3].rstrip("分") if m[3] else "0"
    return _hhmm(hour, _ZH_QUARTERS.get(minutes) or _zh_number(minutes))


def _en_clock(m: re.Match[str]) -> str | None:
    hour, minute = int(m[1]), int(m[2] or 0)
    if m[3]:  # 3pm, 3:30 p.m., 12am
        return _hhmm(hour % 12 + (12 if m[3].lower() == "p" else 0), minute)
    return _hhmm(hour, minute) if hour >= _AFTERNOON_HOUR else None  # "at 15:00"; "at 9:30" may be either


def _hhmm(hour: int, minute: int) -> str | None:
    return f"{hour:02d}:{minute:02d}" if 0 <= hour < 24 and 0 <= minute < 60 else None


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


def _on_day_of_year(ts: datetime, month: int, day: int, year: str | None = None) -> TimeRef | None:
    """A date; without its year, the nearest one: "1月5日" said on 12-20 is next January."""
    if year:
        return _on_date(ts, int(year), month, day)
    ref = _on_date(ts, ts.year, month, day)
    if ref is None or abs(ref.start - _midnight(ts)) <= _HALF_YEAR:
        return ref
    return _on_date(ts, ts.year + (1 if ref.start < ts else -1), month, day)


def _en_month(word: str) -> int:
    return _EN_MONTHS.index(word[:3].lower()) + 1


def _named_month(ts: datetime, month: int, year: int | None = None) -> TimeRef:
    """A month by name; without its year, the last one begun by `ts` ("in June" asked in May is last June)."""
    if year is None:
        year = ts.year if month <= ts.month else ts.year - 1
    return _month(ts, (year - ts.year) * 12 + month - ts.month)


def _named_year(ts: datetime, year: int) -> TimeRef:
    return _year(ts, year - ts.year)


_Resolver = Callable[[re.Match[str], datetime], "TimeRef | None"]


def _rule(pattern: str, resolve: _Resolver) -> tuple[re.Pattern[str], _Resolver]:
    return re.compile(pattern, re.IGNORECASE), resolve


# Table order is priority: longer phrases before their parts ("大后天" before "后天",
# "下下周" before "下周", "day after tomorrow" before "tomorrow"), future before past. A
# phrase that is part of a past one is guarded by a look-behind ("上周五" is no "周五",
# "last Friday" no "Friday", "上个月底" no "月底"), as is "下周" inside "下下周".
_RULES: tuple[tuple[re.Pattern[str], _Resolver], ...] = (
    _rule(r"(\d{4})-(\d{2})-(\d{2})", lambda m, ts: _on_date(ts, int(m[1]), int(m[2]), int(m[3]))),
    _rule(
        rf"(?:(\d{{4}})年)?{_ZH_NUM}月{_ZH_NUM}[日号]",
        lambda m, ts: _on_day_of_year(ts, _zh_number(m[2]), _zh_number(m[3]), m[1]),
    ),
    _rule(rf"\b{_MON} {_ORD}(?:,? (\d{{4}})\b)?", lambda m, ts: _on_day_of_year(ts, _en_month(m[1]), int(m[2]), m[3])),
    _rule(
        rf"\b{_ORD} (?:of )?{_MON}(?:,? (\d{{4}})\b)?",
        lambda m, ts: _on_day_of_year(ts, _en_month(m[2]), int(m[1]), m[3]),
    ),
    _rule(r"大后天", lambda m, ts: _days(ts, 3)),
    _rule(r"后天|\bday after tomorrow\b", lambda m, ts: _days(ts, 2)),
    _rule(r"明天|明早|明晚|明日|\btomorrow\b", lambda m, ts: _days(ts, 1)),
    _rule(
        r"今天|今晚|今早|今日|\btoday\b|\btonight\b|\bthis (?:morning|afternoon|evening)\b", lambda m, ts: _days(ts, 0)
    ),
    _rule(rf"下下(?:个)?(?:周|星期|礼拜){_ZH_WD}", lambda m, ts: _week(ts, 2, _ZH_WEEKDAY[m[1]], 1)),
    _rule(rf"(?<!下)下(?:个)?(?:周|星期|礼拜){_ZH_WD}", lambda m, ts: _week(ts, 1, _ZH_WEEKDAY[m[1]], 1)),
    _rule(rf"\bnext {_WD}\b", lambda m, ts: _week(ts, 1, _EN_WEEKDAYS.index(m[1].lower()), 1)),
    _rule(r"(?<!下)下(?:个)?周末|\bnext weekend\b", lambda m, ts: _week(ts, 1, 5, 2)),
    _rule(r"(?<![上下])(?<!上个)周末|\bthis weekend\b|\bon the weekend\b", lambda m, ts: _week(ts, 0, 5, 2)),
    _rule(r"下下(?:个)?(?:周|星期|礼拜)|\bweek after next\b", lambda m, ts: _week(ts, 2)),
    _rule(r"(?<!下)下(?:个)?(?:周|星期|礼拜)|\bnext week\b", lambda m, ts: _week(ts, 1)),
    _rule(r"(?:这|本)(?:个)?(?:周|星期|礼拜)(?![一二三四五六日天])|\bthis week\b", lambda m, ts: _week(ts, 0)),
    _rule(rf"(?<![上下])(?<![上下]个)(?:周|星期|礼拜){_ZH_WD}", lambda m, ts: _upcoming(ts, _ZH_WEEKDAY[m[1]])),
    _rule(
        rf"(?<!last )(?<!past )\b(?:on |this (?:coming )?)?{_WD}\b",
        lambda m, ts: _upcoming(ts, _EN_WEEKDAYS.index(m[1].lower())),
    ),
    _rule(rf"下下个?月{_MONTH_END}|\bmonth after next\b", lambda m, ts: _month(ts, 2)),
    _rule(rf"(?<!下)下个?月{_MONTH_END}|\bnext month\b", lambda m, ts: _month(ts, 1)),
    _rule(
        rf"(?:这|本)个?月{_MONTH_END}|(?<![上下个这本月])月[底末]"
        r"|\bthis month\b|\b(?:the )?end of (?:the |this )?month\b",
        lambda m, ts: _month(ts, 0),
    ),
    _rule(rf"后年{_YEAR_END}|\byear after next\b", lambda m, ts: _year(ts, 2)),
    _rule(rf"明年{_YEAR_END}|\bnext year\b", lambda m, ts: _year(ts, 1)),
    _rule(
        rf"今年{_YEAR_END}|(?<![去今明前后年])年[底末]"
        r"|\bthis year\b|\b(?:the )?end of (?:the |this )?year\b",
        lambda m, ts: _year(ts, 0),
    ),
    _rule(
        rf"{_ZH_NUM}\s*个?(天|周|星期|礼拜|月|年)(?:后|之后|以后)",
        lambda m, ts: _in_units(_zh_number(m[1]), m[2], ts, 1),
    ),
    _rule(
        rf"\bin {_EN_NUM} (day|week|month|year)s?\b|\b{_EN_NUM} (day|week|month|year)s? from now\b",
        lambda m, ts: _in_units(_en_number(m[1] or m[3]), m[2] or m[4], ts, 1),
    ),
    _rule(r"过(?:两|几)天", lambda m, ts: _days(ts, 2)),
    _rule(r"大前天", lambda m, ts: _days(ts, -3)),
    _rule(r"前天|\bday before yesterday\b", lambda m, ts: _days(ts, -2)),
    _rule(r"昨天|昨晚|昨日|\byesterday\b|\blast night\b", lambda m, ts: _days(ts, -1)),
    _rule(rf"上上(?:个)?(?:周|星期|礼拜){_ZH_WD}", lambda m, ts: _week(ts, -2, _ZH_WEEKDAY[m[1]], 1)),
    _rule(rf"(?<!上)上(?:个)?(?:周|星期|礼拜){_ZH_WD}", lambda m, ts: _week(ts, -1, _ZH_WEEKDAY[m[1]], 1)),
    _rule(rf"\blast {_WD}\b", lambda m, ts: _week(ts, -1, _EN_WEEKDAYS.index(m[1].lower()), 1)),
    _rule(r"(?<!上)上(?:个)?周末|\blast weekend\b", lambda m, ts: _week(ts, -1, 5, 2)),
    _rule(r"上上(?:个)?(?:周|星期|礼拜)|\bweek before last\b", lambda m, ts: _week(ts, -2)),
    _rule(r"(?<!上)上(?:个)?(?:周|星期|礼拜)|\blast week\b", lambda m, ts: _week(ts, -1)),
    _rule(rf"上上个?月{_MONTH_END}|\bmonth before last\b", lambda m, ts: _month(ts, -2)),
    _rule(rf"(?<!上)上个?月{_MONTH_END}|\blast month\b", lambda m, ts: _month(ts, -1)),
    _rule(rf"前年{_YEAR_END}|\byear before last\b", lambda m, ts: _year(ts, -2)),
    _rule(rf"去年{_YEAR_END}|\blast year\b", lambda m, ts: _year(ts, -1)),
    _rule(rf"{_ZH_NUM}\s*个?(天|周|星期|礼拜|月|年)前", lambda m, ts: _in_units(_zh_number(m[1]), m[2], ts, -1)),
    _rule(rf"\b{_EN_NUM} (day|week|month|year)s? ago\b", lambda m, ts: _in_units(_en_number(m[1]), m[2], ts, -1)),
)

# Months and years as a question names them, beyond the days and relative periods above: "in
# June", "July 2023", "in 2022", "2023年8月", "去年三月". Only for questions (`asked_period`): in a
# statement, "in June" is no reason to make it an event that expires.
_YEAR_WORDS = {"今年": 0, "去年": -1, "前年": -2}
_PERIOD_RULES: tuple[tuple[re.Pattern[str], _Resolver], ...] = (
    _rule(rf"\b{_MON},? (\d{{4}})\b", lambda m, ts: _named_month(ts, _en_month(m[1]), int(m[2]))),
    _rule(
        rf"(?:(\d{{4}})年|(今年|去年|前年))?{_ZH_NUM}月(?![0-9一二三四五六七八九十]*[日号])",
        lambda m, ts: _named_month(ts, _zh_number(m[3]),
                                   int(m[1]) if m[1] else ts.year + _YEAR_WORDS[m[2]] if m[2] else None),
    ),
    _rule(r"(\d{4})年|\b(?:in|during|since|of|back in) (\d{4})\b", lambda m, ts: _named_year(ts, int(m[1] or m[2]))),
    _rule(rf"\b(?:in|during|since|early|late|mid|back in) {_MON}\b", lambda m, ts: _named_month(ts, _en_month(m[1]))),
)
