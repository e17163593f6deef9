"""Whom a statement is about, and whom a question asks about (docs/ranking.md#holders).

"I'm vegetarian" and "My wife is on a keto diet" share a topic and not a holder: the second must
never replace, contest or duplicate the first, and "What diet do I follow?" must not be answered
with the wife's. Every statement gets a holder — `SELF` (the user, or the speaker in a
conversation of several), or a person by relation ("wife", "wife.sister", "mother"), named when
the wording names them ("friend:小李") — read by these rules in Chinese and English, or given by
an LLM extractor.

A relation is one canonical English word whatever the language ("我老公" and "my husband" are
both "husband"), so a Chinese statement answers an English question about the same person. The
holder is read from the head of a sentence — its grammatical subject — not from every person it
mentions: "I drive my son to school" is the user's routine, "我儿子今年上小学" the son's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from memflow.pipeline.models import SEARCHABLE_STATUSES, Memory, MType

SELF = "self"

# Canonical relation → its wordings (Chinese first, then English). Longest wordings are tried first,
# so "sister-in-law" is never read as "sister", nor "女朋友" as "朋友".
_RELATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mother": (("妈妈", "母亲", "老妈", "妈", "娘"), ("mother", "mom", "mum", "mommy", "mama")),
    "father": (("爸爸", "父亲", "老爸", "爸", "爹"), ("father", "dad", "daddy", "papa")),
    "parents": (("父母", "爸妈", "爹妈", "双亲"), ("parents", "folks")),
    "brother": (("哥哥", "弟弟", "兄弟", "哥", "弟"), ("brother", "bro")),
    "sister": (("姐姐", "妹妹", "姐妹", "姐", "妹"), ("sister", "sis")),
    "sister_in_law": (("嫂子", "弟媳", "弟妹", "大姑子", "小姑子", "大姨子", "小姨子"),
                      ("sister-in-law", "sister in law")),
    "brother_in_law": (("姐夫", "妹夫", "大舅子", "小舅子", "小叔子", "大伯子"), ("brother-in-law", "brother in law")),
    "mother_in_law": (("婆婆", "岳母", "丈母娘"), ("mother-in-law", "mother in law")),
    "father_in_law": (("公公", "岳父", "老丈人"), ("father-in-law", "father in law")),
    "wife": (("老婆", "妻子", "太太", "媳妇"), ("wife",)),
    "husband": (("老公", "丈夫", "先生"), ("husband",)),
    "partner": (("对象", "伴侣", "另一半", "爱人"), ("partner", "spouse", "fiancé", "fiancée", "fiance", "fiancee")),
    "girlfriend": (("女朋友", "女友"), ("girlfriend", "gf")),
    "boyfriend": (("男朋友", "男友"), ("boyfriend", "bf")),
    "son": (("儿子", "大儿子", "小儿子"), ("son", "boy")),
    "daughter": (("女儿", "闺女", "大女儿", "小女儿"), ("daughter", "girl")),
    "child": (("孩子", "小孩", "娃", "宝宝", "孩子们"), ("kid", "kids", "child", "children", "baby", "toddler")),
    "grandmother": (("奶奶", "外婆", "姥姥", "祖母"), ("grandmother", "grandma", "granny", "nana")),
    "grandfather": (("爷爷", "外公", "姥爷", "祖父"), ("grandfather", "grandpa", "granddad")),
    "grandchild": (("孙子", "孙女", "外孙", "外孙女"), ("grandson", "granddaughter", "grandchild", "grandkids")),
    "uncle": (("叔叔", "舅舅", "伯伯", "姑父", "姨父", "叔", "舅"), ("uncle",)),
    "aunt": (("阿姨", "姑姑", "舅妈", "婶婶", "姨妈", "姑妈", "小姨"), ("aunt", "auntie")),
    "cousin": (("表哥", "表姐", "表弟", "表妹", "堂哥", "堂姐", "堂弟", "堂妹"), ("cousin",)),
    "nephew": (("侄子", "外甥"), ("nephew",)),
    "niece": (("侄女", "外甥女"), ("niece",)),
    "friend": (("朋友", "好友", "闺蜜", "哥们", "发小", "好朋友"), ("friend", "best friend", "buddy", "pal", "bestie")),
    "colleague": (("同事",), ("colleague", "coworker", "co-worker", "teammate")),
    "boss": (("老板", "领导", "上司", "主管"), ("boss", "manager", "supervisor")),
    "roommate": (("室友", "舍友"), ("roommate", "flatmate", "housemate")),
    "neighbour": (("邻居",), ("neighbour", "neighbor", "neighbours", "neighbors")),
    "classmate": (("同学",), ("classmate",)),
    "teacher": (("老师",), ("teacher",)),
}

# A relation that takes in narrower ones: "my kids" asks about a son's school, and "My kids love Lego" answers
# what the son likes; "my parents" and the mother's city likewise. Siblings never: a question about the son is
# not answered by a daughter's fact.
_WIDER: dict[str, frozenset[str]] = {
    "child": frozenset({"son", "daughter"}),
    "parents": frozenset({"mother", "father"}),
    "partner": frozenset({"wife", "husband", "girlfriend", "boyfriend"}),
}

_ZH_WORDS = {word: rel for rel, (zh, _) in _RELATIONS.items() for word in zh}
_EN_WORDS = {word: rel for rel, (_, en) in _RELATIONS.items() for word in en}
_ZH_REL = "|".join(sorted(map(re.escape, _ZH_WORDS), key=len, reverse=True))
_EN_REL = "|".join(sorted((re.escape(w).replace(r"\ ", r"\s+") for w in _EN_WORDS), key=len, reverse=True))

# Words a sentence may open with before its subject: fillers, time phrases, connectives.
_EN_LEAD = r"(?:(?:oh|well|so|and|but|also|actually|btw|by the way|anyway|yeah|yes|no|lately|recently|now|today"\
           r"|yesterday|these days|last \w+|this \w+|every \w+)[\s,]+)*"
_ZH_LEAD = r"(?:(?:其实|对了|另外|还有|而且|但是|不过|最近|现在|今天|昨天|去年|今年|明年|上个?月|下个?月|这几天"\
           r"|平时|周末|我们)[，,\s]*)*"
# A name after the relation ("my brother Tom"): capitalised, whatever the flags of the pattern around it.
_EN_NAME = r"(?:\s+(?P<name>(?-i:[A-Z][a-z]+)))?"

# "My wife's sister Anna", "our kids": possessive chains of relations at the head of a sentence.
# Parents and grandparents are named without "my" too ("Mom loves gardening", "What does Dad drink?").
_EN_BARE = r"(?:mom|mum|dad|mama|papa|grandma|grandpa)"
_EN_POSSESSED = rf"(?:(?:my|our)\s+|(?={_EN_BARE}\b))(?P<chain>(?:{_EN_REL})(?:'s\s+(?:{_EN_REL}))*)\b{_EN_NAME}"
_EN_CHAIN = re.compile(rf"^{_EN_LEAD}{_EN_POSSESSED}", re.I)
# "我老婆的妹妹", "我家孩子", "我朋友小李", "妈妈说": the same in Chinese (我 may be left out before a relation).
_ZH_POSSESSED = rf"(?:的|家)?(?P<chain>(?:{_ZH_REL})(?:(?:家的|家|的)?(?:{_ZH_REL}))*)"
_ZH_CHAIN = re.compile(rf"^{_ZH_LEAD}(?:我|我们)?{_ZH_POSSESSED}")
_ZH_SPLIT = re.compile(rf"{_ZH_REL}")
# Relations anywhere in a question, after "my" / "我": whom it asks about.
_EN_ASKED = re.compile(rf"\b{_EN_POSSESSED}", re.I)
_ZH_ASKED = re.compile(rf"我(?:们)?{_ZH_POSSESSED}")
_FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself|i'm|i've|i'd|i'll)\b|我", re.I)
# A word that reads as a relation but is not one there: "先生" as a title, "girl"/"boy" as exclamations.
_NOT_A_PERSON = re.compile(r"^(?:boy|girl|baby)\b", re.I)


@dataclass(frozen=True)
class Person:
    """A holder as read from wording: a relation chain ("wife.sister") and/or a name."""

    relation: str | None = None
    name: str | None = None

    @property
    def holder(self) -> str:
        if self.relation and self.name:
            return f"{self.relation}:{self.name}"
        return self.relation or (f":{self.name}" if self.name else SELF)

    @classmethod
    def of(cls, holder: str) -> Person:
        """A stored holder read back ("friend:小李" → friend named 小李; SELF → neither)."""
        relation, _, name = ("", "", "") if holder == SELF else holder.partition(":")
        return cls(relation or None, name or None)


def holder_of(statement: str) -> str:
    """Whom a statement is about: a relation chain (and name) when its subject is someone in the user's life,
    else `SELF`. Only the subject counts: "I drive my son to school" is the user's."""
    person = _head_person(statement.strip())
    return person.holder if person else SELF


def asked_holder(question: str) -> str | None:
    """Whom a question asks about: the relation after "my"/"我" ("Where does my husband work?",
    "我老公什么时候过生日？"), else `SELF` when it speaks in the first person ("What am I allergic to?"),
    else None (it names nobody of the user's: "What did Caroline research?")."""
    en = _EN_ASKED.search(question)
    if en and not _NOT_A_PERSON.match(en.group("chain")):
        return _en_person(en).holder
    zh = _ZH_ASKED.search(question)
    if zh:
        return Person(_zh_chain(zh.group("chain"))).holder
    return SELF if _FIRST_PERSON.search(question) else None


# The second person: a question that speaks to the assistant ("What did you suggest?", "你说周五提醒我什么？").
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|you'd|you'll|you've|you're)\b|你|您", re.I)


def asks_the_assistant(question: str) -> bool:
    """Whether a question speaks to the assistant, and so may be answered by what the assistant said: "When will
    you remind me?" is answered by "I'll remind you on Friday", "Where do I live?" never by an assistant's turn."""
    return bool(_SECOND_PERSON.search(question))


def people(memories: Iterable[Memory]) -> dict[str, list[Memory]]:
    """The people a subject has talked about, each with what is known of them now (searchable memories, oldest
    first; a verbatim record only when nothing was distilled from it), most talked about first."""
    known: dict[str, list[Memory]] = defaultdict(list)
    for m in sorted(memories, key=lambda m: (m.created_at, m.id)):
        if m.about != SELF and m.status in SEARCHABLE_STATUSES:
            known[m.about].append(m)
    told = {e for group in known.values() for m in group if m.mtype is not MType.episode for e in m.source_event_ids}
    kept = {who: [m for m in group if m.mtype is not MType.episode or not told.issuperset(m.source_event_ids)]
            for who, group in known.items()}
    return dict(sorted(kept.items(), key=lambda item: (-len(item[1]), item[0])))


_SELF_WORDS = frozenset({"self", "user", "the user", "me", "i", "myself", "我", "用户", "自己"})


def holder_named(given: str) -> str:
    """A holder as an extractor (an LLM) names it, in the form the rules give: "the user" → SELF, "Mom" → "mother",
    "wife's sister" / "老婆的妹妹" → "wife.sister", "friend:Li" → "friend:li", anything else a name."""
    text = " ".join(given.split()).lower()
    if text in _SELF_WORDS:
        return SELF
    relation, _, name = text.partition(":")
    relation = re.sub(r"^(?:my|our|the user's)\s+|^我(?:们)?的?", "", relation)
    parts = [p for p in re.split(r"\.|'s\s+|的", relation) if p]
    if " of " in relation:  # "sister of my wife": the wife's sister
        parts = [re.sub(r"^(?:my|our)\s+", "", p) for p in reversed(relation.split(" of "))]
    canonical = [_EN_WORDS.get(p) or _ZH_WORDS.get(p) or (p if p in _RELATIONS else None) for p in parts]
    if parts and all(canonical):
        return Person(".".join(c for c in canonical if c), name or None).holder
    return Person(None, name or relation).holder


def matches(asked: str, held: str) -> bool:
    """Whether a memory held by `held` answers a question about `asked`: the same person, or one of them a
    relation that takes in the other ("child" and "son"). A name matches the same name in any relation."""
    if asked == held:
        return True
    a, h = Person.of(asked), Person.of(held)
    if a.name and h.name:
        return a.name.lower() == h.name.lower()
    if not a.relation or not h.relation:
        return False
    return a.relation == h.relation or _takes_in(a.relation, h.relation)


def _takes_in(asked: str, held: str) -> bool:
    *a_path, a_last = asked.split(".")
    *h_path, h_last = held.split(".")
    return a_path == h_path and (h_last in _WIDER.get(a_last, ()) or a_last in _WIDER.get(h_last, ()))


def held_key(key: str, holder: str) -> str:
    """The key of a statement about `holder` on topic `key`: the user's own facts keep their key; another
    person's get one of their own, so that the wife's diet and the user's are two memories, never rivals."""
    if holder == SELF:
        return key
    prefix = re.sub(r"[^a-z0-9._\u3400-\u4dbf\u4e00-\u9fff-]+", "-", holder.lower()).strip("-")
    return f"of.{prefix}.{key}"


def _head_person(sentence: str) -> Person | None:
    en = _EN_CHAIN.match(sentence)
    if en and not _NOT_A_PERSON.match(en.group("chain")):
        return None if _EN_NAMES_WHO.match(sentence, en.end()) else _en_person(en)
    zh = _ZH_CHAIN.match(sentence)
    if zh and not _starts_another_word(sentence, zh):
        return None if _ZH_NAMES_WHO.match(sentence, zh.end()) else Person(_zh_chain(zh.group("chain")),
                                                                           _zh_name(sentence[zh.end():]))
    return None


# "My manager is Tom Berger", "我老板是王总", "我女朋友叫小雨": who the user's manager or girlfriend is, a fact of the
# user's own life (person.manager), not something about that person: a new manager replaces the old one.
_EN_NAMES_WHO = re.compile(
    r"\s+(?:is|was|'s)\s+(?:not\s+|no longer\s+)?(?:now\s+|still\s+|called\s+|named\s+)?"
    r"(?-i:[A-Z][a-z]+)(?:\s|[,.;!]|$)", re.I)
_ZH_NAMES_WHO = re.compile(
    r"(?:现在)?(?:是|叫|换成了?)(?:[小老阿][\u4e00-\u9fff]|[\u4e00-\u9fff]{1,3}(?:总|老师|经理))[，,。.！!]?$"
    r"|(?:现在)?叫[\u4e00-\u9fff]{1,3}[，,。.！!]?$")


# Relation words of one character (or a title) that also start other words: "哥伦比亚", "先生活".
_SHORT_WORDS = frozenset({"哥", "弟", "姐", "妹", "叔", "舅", "妈", "爸", "娘", "爹", "娃", "先生"})
# What may follow such a word when it does name a person: a verb, a particle, an adverb.
_AFTER_PERSON = frozenset("说在是的住喜爱每最和也今明去昨一对很刚已还要想会从把给经总常平上下")


def _starts_another_word(sentence: str, m: re.Match[str]) -> bool:
    """A short relation word that is only the start of another word: "哥伦比亚咖啡" is about nobody."""
    following = sentence[m.end():m.end() + 1]
    return m.group("chain") in _SHORT_WORDS and following != "" and following not in _AFTER_PERSON


def _en_person(m: re.Match[str]) -> Person:
    words = re.split(r"'s\s+", m.group("chain").lower())
    chain = ".".join(_EN_WORDS[re.sub(r"\s+", " ", w)] for w in words)
    name = m.group("name")
    return Person(chain, name.lower() if name and name.lower() not in _NAME_STOP else None)


# Capitalised words after a relation that are no name ("My wife Is…" never happens; "My son Monday" does not).
_NAME_STOP = frozenset({"is", "was", "and", "has", "had", "will", "would", "said", "says", "lives", "works",
                        "likes", "loves", "i", "who", "just", "also"})


def _zh_chain(chain: str) -> str:
    return ".".join(_ZH_WORDS[w] for w in _ZH_SPLIT.findall(chain))


def _zh_name(rest: str) -> str | None:
    """A name right after the relation ("我朋友小李住在…", "我同事王芳说…"): 小/老/阿 + one character, or a common
    surname and one or two more, before what the sentence says of them."""
    m = _ZH_GIVEN_NAME.match(rest)
    return m.group(0) if m else None


_SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘蒋蔡余杜叶程苏魏吕丁任沈姚卢"\
            "姜崔钟谭陆汪范金石廖贾夏韦方白邹孟熊秦邱江尹薛段雷侯龙史陶黎贺顾毛郝龚邵万钱严武戴莫孔向汤"
# What follows a name: what the sentence goes on to say of them.
_AFTER_NAME = "说|住|在|是|喜欢|爱|的|也|和|，|,|每|最|今|明|去|昨|刚|已|要|想|会|下|上|还|很|对|给|从|把|被"
_ZH_GIVEN_NAME = re.compile(rf"(?:[小老阿][\u4e00-\u9fff]|[{_SURNAMES}][\u4e00-\u9fff]{{1,2}}?)(?={_AFTER_NAME})")
