"""Topic keys: same topic → same key, so an update or a correction can supersede (docs/write-path.md#topic-keys).

"别写太长" / "说重点" / "I prefer short answers" must all land on `reply.length`, or
the store fills with near-synonyms that crowd each other out and are never resolved
against each other. A key comes from the topic table when a topic matches, and
otherwise from the memory type plus the statement's salient words, deterministically
(never a hash, which would hide what a key means and merge nothing).
"""

from __future__ import annotations

import re
from typing import Literal

from memflow.pipeline.cues import TOPICS, Topic
from memflow.pipeline.models import MType

MAX_KEY_CHARS = 200
# Enough words (numbers and ids included) that two different statements rarely share a
# fallback key: a shared key makes the newer one supersede or contest the older.
_SALIENT_WORDS = 6
_P, _F = MType.preference, MType.fact
_MAX_WORD_CHARS = 8


# Project names: quoted ("叫“青鸟”的项目"), before 项目 ("青鸟项目"), or after "project".
_PROJECT_QUOTED = re.compile(r"[“\"「『]([^”\"」』]{1,20})[”\"」』]\s*的?\s*项目")
_PROJECT_ZH = re.compile(r"([\u4e00-\u9fffA-Za-z0-9_-]{1,12})项目")
_PROJECT_EN = re.compile(r"\b[Pp]roject\s+(?:called\s+|named\s+)?([A-Z][\w-]{1,30})|\b([A-Z][\w-]{1,30})\s+project\b")
# What stands before 项目 but is no name: "这个项目", "我们的项目", "This project".
_NOT_A_NAME = re.compile(
    r"^(?:.*[的个这那该本新老])?$|^(?:this|that|the|our|my|your|his|her|their|its|a|an|new|same|each|every|which"
    r"|what|any|some|one|next|last|big|side|school|group|class|art|research|passion|personal)$",
    re.I,
)
_NAME_EDGE = re.compile(r"^.*[的个叫在做是了和与]")

# Words that carry no topic: pronouns, copulas, cue verbs, adverbs (removed before
# choosing the salient words of a fallback key).
_EN_STOP = frozenset(
    "a an the i me my mine we us our you your he she it its they them their is are was were be been am do does"
    " did to of in on at for from by with and or but so that this these those there here as if then than too"
    " very really just also please always never now like likes prefer love enjoy hate dislike want need would"
    " should could can will shall must not no don't dont let's lets go going use using remember correction"
    " actually anymore instead i'm im i'd i've have has had get got make some any all more most much many"
    " about into over after before again only same other such what which who when where why how because since"
    " while think thought know guess maybe yeah yes oh wow haha ok okay so well um hey s t".split()
)
_ZH_STOP_WORDS = re.compile(
    r"不喜欢|喜欢|讨厌|偏好|希望|习惯|以后|今后|往后|每次|下次|请尽量|尽量|记住|记一下|帮我|永远|不要|必须|禁止"
    r"|不能|决定了|决定|就用|定了|正在|平时|一直|总是|通常|经常|比较|非常|已经|现在|我们|你们|他们|她们|一个|这个|那个"
    r"|什么|因为|所以|但是|而且|然后|还是|或者|可以|需要|应该|其实|更正|一下|的话|时候|特别|真的"
)
_ZH_STOP_CHARS = (
    "我你他她它的了着过是在把被和与及或都也很就要会能可去来给对从向到这那个些"
    "吗呢吧啊呀哦嗯么还又再更最太让用将为以于其请别不没有"
)
_ZH_SPLIT = re.compile(f"[{_ZH_STOP_CHARS}\\s]+")
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+|[a-z0-9][a-z0-9+#'.-]*[a-z0-9+#]|[a-z0-9]", re.I)
_KEY_BAD = re.compile(r"[^a-z0-9._\-\u3400-\u4dbf\u4e00-\u9fff]+")
_PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+\]")
# "X 是 Y" / "X is Y": a fact's key comes from X, so that a new Y updates it.
_COPULA = re.compile(r"(?<![不还就但可])是|\b(?:is|are|was|were)\b", re.I)
_REASON = re.compile(r"因为|由于|\bbecause\b|\bsince\b", re.I)
# A reason clause explains; it states no value of a topic: "Bart因为搬家到一个新城市感到孤独" is about
# loneliness, not where Bart lives, and a later city must not replace it.
_REASON_CLAUSE = re.compile(r"(?:因为|由于)[^，,。；;！!？?]*|\b(?:because|since)\b[^,.;!?]*", re.I)
# "我的车不是特斯拉，是比亚迪汉": the attribute is what stands before the denied old value.
_DENIED = re.compile(r"(?<![还就但可])不是")

# Key prefix per memory type when no topic matches; preference and temp_preference
# share one, so that a temporary wish names the same topic as the standing one.
_PREFIX = {MType.temp_preference: "preference", MType.session_context: "context"}
# ...under a key of its own: "today, keep it short" must not replace (or be contested by) the
# standing "I like detail", and one key never holds two active memories. The wish supersedes
# the previous wish, lapses when it expires, and the standing preference was never touched.
TEMPORARY = ".now"
# Types whose key is the bare topic ("location.city"); the others say what they are
# ("rule.…", "decision.tech.db"), so a decision never supersedes the fact it is about.
_BARE_TOPIC = frozenset({MType.preference, MType.temp_preference, MType.fact})
_TOPICAL = _BARE_TOPIC | {MType.rule, MType.decision}
# The kind of topic a statement of each type is keyed by, when its words name topics of both kinds.
_KIND = {MType.fact: _F, MType.preference: _P, MType.temp_preference: _P}


def topic_of(text: str, prefer: MType | None = None) -> Topic | None:
    """The first topic of the table the text names; with `prefer`, the first of that kind if it names one: a fact
    is about where one lives, not about reply length, in "we moved to Geneva, the commute is much shorter"."""
    found = [t for t in TOPICS if t.pattern.search(text)]
    return next((t for t in found if t.mtype is prefer), found[0] if found else None)


def project_of(text: str) -> str | None:
    """The project a statement names, lowercased, or None."""
    m = _PROJECT_QUOTED.search(text) or _PROJECT_EN.search(text)
    name = next(g for g in m.groups() if g) if m else _project_before_xiangmu(text)
    return None if name is None or _NOT_A_NAME.match(name) else name.lower()


def _project_before_xiangmu(text: str) -> str | None:
    m = _PROJECT_ZH.search(text)
    return _NAME_EDGE.sub("", m.group(1)) if m else None


def key_for(mtype: MType, text: str) -> str:
    """The topic key of a statement of type `mtype` (not for episodes: they are keyed by event).

    Events and skills are many per topic and never superseded by key: their key is only
    their salient words (callers strip time phrases from events first).
    """
    scope = _REASON.split(text, maxsplit=1)[0] if mtype is MType.decision else text
    key = _topic_key(mtype, _main_clause(scope)) if mtype in _TOPICAL else None
    if key is None:
        words = salient_words(_subject_part(mtype, scope))
        key = normalize_key(f"{_PREFIX.get(mtype, mtype.value)}.{'.'.join(words) or _compact(scope)}")
    return key + TEMPORARY if mtype is MType.temp_preference else key


def key_basis(mtype: MType, text: str) -> Literal["topic", "attribute", "words"]:
    """What `key_for` names a statement by: a single-valued topic of the table, the attribute of an
    "X is <short value>" statement, or (failing both) its first salient words. Only the first two
    name one thing that a newer value replaces; two statements that share their first words are
    two statements (docs/write-path.md#same-key-is-not-same-topic)."""
    scope = _REASON.split(text, maxsplit=1)[0] if mtype is MType.decision else text
    if mtype in _TOPICAL and _topic_key(mtype, _main_clause(scope)) is not None:
        return "topic"
    return "attribute" if _subject_part(mtype, scope) != scope else "words"


def _main_clause(text: str) -> str:
    return _REASON_CLAUSE.sub(" ", text)


def habit_key(text: str) -> str:
    """The key of a routine ("我一般晚上写代码"): its salient words, never a topic's key."""
    return normalize_key(f"preference.habit.{'.'.join(salient_words(text)) or _compact(text)}")


def topic_base(key: str) -> str:
    """The topic a key names, a temporary wish's included ("reply.length.now" → "reply.length")."""
    return key.removesuffix(TEMPORARY)


def asked_topic_key(query: str) -> str | None:
    """The key a statement on the topic a query asks about is stored under ("Who do I report to?" →
    person.manager), or None when it names no known topic: single-valued topics are answered by key."""
    topic = topic_of(query)
    return _topic_key(topic.mtype, query) if topic is not None else None


def _topic_key(mtype: MType, scope: str) -> str | None:
    topic, project = topic_of(scope, _KIND.get(mtype)), project_of(scope)
    if topic and topic.per_project and project:
        base = f"project.{project}.{topic.key.split('.')[-1]}"
    elif topic:
        base = topic.key
    elif project and mtype is MType.fact:
        base = f"project.{project}"
    else:
        return None
    return normalize_key(base if mtype in _BARE_TOPIC else f"{_PREFIX.get(mtype, mtype.value)}.{base}")


def _compact(text: str) -> str:
    # No salient word at all ("我喜欢它"): the whole statement, squeezed, still names
    # it; a shared placeholder would merge unrelated statements.
    return _KEY_BAD.sub("", text.lower())[:40] or "misc"


def _subject_part(mtype: MType, text: str) -> str:
    """For "X is <short value>" (or "X不是A，是B") the key is X, so that a new value supersedes the old one.

    Only short attribute–value statements ("My blood type is AB negative"): "My kids are
    so excited about summer break" is no attribute, and keying it by "kids" would let
    the next sentence about the kids supersede it.
    """
    if mtype not in _BARE_TOPIC:
        return text
    head, *tail = _COPULA.split(text, maxsplit=1)
    head = _DENIED.split(head, maxsplit=1)[0]
    value = tail[0].strip() if tail else ""
    attribute = 1 <= len(salient_words(head)) <= 3 and 0 < len(value) <= 24 and len(_TOKEN.findall(value)) <= 4
    return head if attribute else text


def salient_words(text: str) -> list[str]:
    """Up to four content words of `text`, in order: what a fallback key is made of."""
    words: list[str] = []
    for token in _TOKEN.findall(_PLACEHOLDER.sub(" ", text).lower()):
        words += _cjk_words(token) if "\u3400" <= token[0] else _latin_word(token)
    unique = list(dict.fromkeys(words))
    return unique[:_SALIENT_WORDS]


def _cjk_words(run: str) -> list[str]:
    spaced = _ZH_STOP_WORDS.sub(" ", run)
    chunks = _ZH_SPLIT.split(spaced)
    return [c[:_MAX_WORD_CHARS] for c in chunks if c]


def _latin_word(token: str) -> list[str]:
    word = token.strip("'-").removesuffix("'s")
    return [] if word in _EN_STOP or not word else [word]


def normalize_key(raw: str) -> str:
    """Lowercase, only `[a-z0-9._-]` and CJK, no empty segments, at most 200 characters."""
    key = _KEY_BAD.sub("-", raw.lower())
    key = re.sub(r"\.{2,}", ".", key).strip(".-")
    return key[:MAX_KEY_CHARS].rstrip(".-") or "misc"
