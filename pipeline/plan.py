"""Query planning: which kind of memory a query looks for, and where to look (docs/ranking.md#routes).

`plan()` is the heuristic fast path: cue tables score the 11 intents, the best one names
the directories, and the query becomes a few weighted routes (semantic first, bm25 and
exact_match for Chinese text and named things). It never fails and never does I/O, so
it is also what an LLM planner falls back on. `is_ambiguous()` tells that LLM planner
when a query is worth refining (pronouns without a name, two intents tied).

Cue wording for statements (preferences, rules, corrections, decisions) comes from
`cues.py`, shared with the write path, so that a query and the memory it looks for are
read by the same rules. Chinese cues are substrings, English ones carry `\\b`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from memflow.pipeline import cues
from memflow.pipeline.holders import SELF, asked_holder, held_key
from memflow.pipeline.models import Dir, MType, QueryPlan, Route
from memflow.pipeline.statements import CJK, is_question
from memflow.pipeline.topics import TEMPORARY, asked_topic_key

Intent = Literal[
    "preference_update",
    "preference_query",
    "entity_recall",
    "event_recall",
    "decision_trace",
    "rule_statement",
    "skill_request",
    "correction",
    "new_task",
    "conflict_resolution",
    "general_chat",
]

_D = Dir
# Where each intent looks (docs/ranking.md#intents), matched to how `tagging.py` files memories.
# An empty tuple searches the whole subject.
INTENT_DIRS: dict[Intent, tuple[Dir, ...]] = {
    "preference_update": (_D.preferences,),
    "preference_query": (_D.preferences,),
    # Facts with no entity keyword ("我的血型是…") are tagged `general`, so it is searched too.
    "entity_recall": (_D.entities, _D.events, _D.general),
    "event_recall": (_D.events, _D.entities),
    # Decisions are filed under `events` with their reasons (tagging.CATEGORY_DIR).
    "decision_trace": (_D.events, _D.patterns, _D.entities),
    # Only `system`: with `general` beside it an ordinary fact outranked the rule asked for
    # (a rule the tagger missed is still found by the whole-subject route).
    "rule_statement": (_D.system,),
    "skill_request": (_D.skills, _D.tools),
    "correction": (_D.preferences, _D.system, _D.entities),
    # A new task needs how the user wants things done and what must not be done, not history.
    "new_task": (_D.preferences, _D.system, _D.general),
    # "到底哪个对" can be about a preference, a rule, a fact or what happened.
    "conflict_resolution": (_D.preferences, _D.system, _D.events, _D.entities),
    # Small talk: no prior about where a relevant memory would be.
    "general_chat": (),
}

# Tie-break order, most specific first: a correction or a "why did we" question carries
# more signal than the "帮我" or "上次" it often also contains.
PRIORITY: tuple[Intent, ...] = (
    "correction",
    "conflict_resolution",
    "decision_trace",
    "rule_statement",
    "preference_update",
    "preference_query",
    "skill_request",
    "entity_recall",
    "event_recall",
    "new_task",
    "general_chat",
)

When = Literal["any", "question", "statement"]


@dataclass(frozen=True)
class Cue:
    """Wording that votes `weight` for `intent`, in questions, statements or both."""

    intent: Intent
    pattern: re.Pattern[str]
    weight: float
    when: When = "any"


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE)


# Preference topics of the write path (reply length, format, channel, tools…): a question
# about one asks for a preference, a statement about one sets it.
_STYLE_TOPIC = _rx(*(t.pattern.pattern for t in cues.TOPICS if t.mtype is MType.preference))

_PAST_HOW = _rx(r"(?:是|最后|当时|之前)怎么.{1,6}的", r"\bhow did (?:we|i|you)\b")

# Weights: 3 = says the intent on its own, 2 = strong hint, 1 = nudge. A query's intent is
# the one with the highest sum; nothing at all is general_chat. A negative weight takes back a
# vote that other wording gave by mistake.
CUES: tuple[Cue, ...] = (
    # Statements the write path also acts on.
    Cue("correction", cues.CORRECTION, 3, "statement"),
    Cue("correction", _rx(r"^\s*(?:no|nope)\b,?\s*(?:wait|sorry|actually|it'?s|it is|my|i|we)\b"), 3, "statement"),
    Cue("rule_statement", cues.STRONG_RULE, 3),
    # "别写那么长" is a preference (style topic, 2 below wins over 1.5), "不要提交密钥" a rule.
    Cue("rule_statement", cues.WEAK_RULE, 1.5, "statement"),
    Cue("preference_update", cues.PREFERENCE, 3, "statement"),
    Cue("preference_update", cues.REMEMBER, 1, "statement"),
    Cue("preference_update", _STYLE_TOPIC, 2, "statement"),
    Cue("decision_trace", cues.DECISION, 2),
    # Questions.
    Cue(
        "conflict_resolution",
        _rx(
            r"到底(?:哪|是|该)|哪个(?:说法|版本)?(?:才)?(?:对|准|是对的)|哪种说法|矛盾|冲突|前后不一致|说法不一",
            r"\bwhich (?:one )?is (?:right|correct|true)\b|\bcontradict|\bconflict|\binconsistent\b"
            r"|\bwhich (?:is it|should i (?:believe|trust))\b|\bmake up your mind\b",
        ),
        3,
    ),
    Cue(
        "preference_query",
        _rx(
            r"喜欢|讨厌|偏好|偏爱|习惯|风格|口味|爱用|希望|想要",
            r"\bprefer(?:s|red|ence|ences)?\b|\blikes?\b|\bdislikes?\b|\bfavou?rites?\b|\bstyle\b|\btaste\b"
            r"|\bwant\b|\bshould you use\b|\bhow do i like\b",
        ),
        3,
        "question",
    ),
    Cue("preference_query", _STYLE_TOPIC, 1.5, "question"),
    # How the assistant should answer is a preference ("回答用什么语言", "How long should your answers be?").
    Cue(
        "preference_query",
        _rx(
            r"(?:回答|回复|答复)(?:的时候)?(?:要|该|应该)?用|用什么语言|你(?:应该|该|要)(?:怎么|用)|对你的要求",
            r"\bshould you\b|\byour (?:answers?|replies|responses)\b",
            r"\b(?:reply|respond|answer) in\b|\bmy preferences\b",
        ),
        3,
        "question",
    ),
    Cue(
        "rule_statement",
        _rx(
            r"规则|规矩|禁忌|红线|底线|注意事项|要注意|注意什么|不允许|忌讳",
            r"\brules?\b|\bpolic(?:y|ies)\b|\bforbidden\b|\bnot allowed\b|\bmustn'?t\b|\bmust never\b"
            r"|\bnever (?:do|ever)\b|\bavoid\b|\bconstraints?\b|\bguidelines?\b|\bwatch out\b",
        ),
        2,
    ),
    # Asking permission: "Can I commit API keys to git?" asks whether a rule forbids it.
    Cue(
        "rule_statement",
        _rx(
            r"(?:可以|能|可不可以|能不能)把|允许",
            r"^\s*(?:can|may|should) (?:i|we)\b|\b(?:is it ok(?:ay)?|am i allowed) to\b",
        ),
        2.5,
        "question",
    ),
    Cue(
        "decision_trace",
        _rx(
            r"(?:为什么|为啥|为何|怎么)(?:当时|最后|最终|我们|要|会)?(?:选|决定|定了|采用|改用|换成|用了|放弃|不用)",
            r"选型|理由|依据|原因|怎么定的|决策|取舍|最[后终](?:定|选|用)",
            r"\b(?:land|landed|settle|settled) on\b",
            r"\bwhy (?:did|do|does|were|was|are) (?:we|you|i|they)\b|\bwhat did (?:we|you|i) (?:decide|choose|pick)\b"
            r"|\bdecid|\bdecision\b|\brationale\b|\breason(?:s|ing)? (?:for|why|behind)\b|\bthe reason\b"
            r"|\bchose\b|\bchoose\b|\bpick(?:ed|ing)\b|\bwent with\b|\btrade-?offs?\b",
        ),
        3,
    ),
    # A bare "why" leans to a decision, but "为什么启动不了" is troubleshooting.
    Cue("decision_trace", _rx(r"为什么|为啥|为何", r"\bwhy\b"), 1),
    Cue(
        "skill_request",
        _rx(
            r"怎么(?!样|回事)|如何|怎样(?!了)|咋|什么命令|哪个命令|步骤|教程|用法",
            r"\bhow (?:do|can|should|to|would) (?:i|we|you)?\b|\bhow to\b|\bwhat(?:'s| is) the command\b"
            r"|\bsteps? (?:to|for)\b|\binstructions?\b",
        ),
        3,
    ),
    # How something went, not how to do it: "那个 bug 最后是怎么解决的", "How did we fix…".
    Cue("event_recall", _PAST_HOW, 2, "question"),
    Cue("skill_request", _PAST_HOW, -2, "question"),
    # A procedure asked for by name: "部署流程是什么" outweighs its "是什么".
    Cue("skill_request", _rx(r"流程|过程|做法|用法", r"\bprocess\b|\bprocedure\b|\bworkflow\b|\bchecklist\b"), 2),
    Cue(
        "skill_request",
        _rx(
            r"启动|起服务|部署|安装|配置|运行|命令|脚本|依赖|环境|报错",
            r"\bset ?up\b|\binstall\b|\bconfigure\b|\bdeploy\b|\brun\b|\bstart\b|\bbring up\b|\bspin up\b"
            r"|\bcommand\b|\bscript\b|\bdependenc(?:y|ies)\b|\bdeps\b|\berror\b",
        ),
        1,
    ),
    Cue(
        "entity_recall",
        _rx(
            r"叫什么|叫啥|什么名字|名字|是谁|谁是|哪个(?:项目|公司|城市|团队|人|同事)|哪家|哪里|哪儿|在哪|地址"
            r"|邮箱|电话|手机号|号码|密码|账号|是多少|是什么",
            r"\bwhat(?:'s| is| was) (?:the name|my|our|his|her|their)\b|\bname of\b|\bcalled\b|\bwho(?:'s| is| was)\b"
            r"|\bwhere (?:do|does|did|is|am)\b|\bwhich (?:project|company|city|team|person|colleague)\b"
            r"|\baddress\b|\bemail\b|\bphone\b|\bpassword\b|\bnumber\b|\bwhat (?:are|were) my\b|\bdo i have\b",
        ),
        2,
        "question",
    ),
    # What a project or the user uses: "我们的数据库用的什么", "What database does Atlas use?". Ties with a
    # preference topic ("我平时用什么编辑器") go to preference_query.
    Cue(
        "entity_recall",
        _rx(
            r"用(?:的)?(?:是)?什么|用哪",
            r"\bwhat \w+(?: \w+)? (?:do|does|did) [\w ]{1,30}\buse\b|\bwhich \w+ (?:do|does|did)\b",
        ),
        1.5,
        "question",
    ),
    Cue("entity_recall", _rx(*(t.pattern.pattern for t in cues.TOPICS if t.mtype is MType.fact)), 1, "question"),
    Cue(
        "entity_recall",
        _rx(
            r"项目|公司|团队|同事|经理|领导|老板|城市|住|血型|生日|忌口|过敏|爱好|兴趣|宠物",
            r"\bprojects?\b|\bcompany\b|\bteam\b|\bcolleague\b|\bmanager\b|\bboss\b|\bcity\b|\blive\b"
            r"|\bbirthday\b|\bblood type\b|\ballerg|\bdiet|\bhobb(?:y|ies)\b|\bpets?\b",
        ),
        1,
        "question",
    ),
    Cue(
        "event_recall",
        _rx(
            r"那天|上次|那次|之前|以前|当时|昨天|前天|上周|上个月|去年|刚才|什么时候|几点|哪天|说过|聊过|讨论过|提过"
            r"|讲过|发生|经历|会议|开会|再讲一遍|再说一遍",
            r"\blast (?:time|week|month|year)\b|\bthe other day\b|\byesterday\b|\bearlier\b|\bbefore\b"
            r"|\bwhen (?:did|was|were|is|are|do)\b|\bwhat happened\b"
            r"|\b(?:did|have) (?:we|i|you) (?:talk|discuss|say|mention)|\btalked about\b|\bdiscussed\b|\bmentioned\b"
            r"|\bmeeting\b|\bagain\b|\bremind me\b",
        ),
        2,
    ),
    # Asking when: "下次开会是什么时候" is about an event even though it asks "是什么".
    Cue(
        "event_recall", _rx(r"什么时候|几点|哪天|几号|多久", r"\bwhen\b|\bwhat time\b|\bhow long ago\b"), 1, "question"
    ),
    Cue(
        "new_task",
        _rx(
            r"帮我|帮忙|给我(?:写|做|推荐|生成|整理|列|找|出|设计|画)|写(?:一)?[个份篇段]|做(?:一)?个|推荐"
            r"|生成|总结一下|翻译|起草|设计(?:一)?[个套]|实现(?:一)?个",
            r"\bhelp me\b|\b(?:can|could|would) you (?:please )?(?:write|make|create|draft|build|help|give|find|plan)\b"
            r"|\b(?:write|create|draft|generate|build|make|give|plan) (?:me )?(?:a|an|some|the)\b|\bsummari[sz]e\b"
            r"|\btranslate\b|\bimplement\b|\brecommend\b|\bsuggest\b|\bi need (?:a|an|you to)\b",
        ),
        2.5,
    ),
    # Something to produce: "Please write a script" is a task, not a "please write…" preference.
    Cue(
        "new_task",
        _rx(r"写(?:一)?[个份篇段]|做(?:一)?个|生成", r"\b(?:write|create|draft|generate|build|make) (?:me )?an?\b"),
        1,
    ),
)

# Deictic wording: refers to something said before without naming it.
DEICTIC = _rx(
    r"那个|这个|那件|那次|那天|上次|当时|之前那|它|他们|她们|那些|这些|那边",
    # English "that/this" mostly introduce clauses; only "that project / that one…" point back.
    r"\b(?:that|this|those|the same) (?:project|thing|one|guy|person|place|meeting|idea|plan|tool|issue|bug|decision"
    r"|option|approach|time|day|trip|book|restaurant|article|talk)s?\b|\blast time\b|\bthe other day\b",
)
# Two intents whose scores are this close are a guess between them.
AMBIGUITY_MARGIN = 1.0

# Route weights. The primary route is semantic; bm25 catches the exact words an embedding
# blurs (names: docs/architecture.md#what-the-vectors-cannot-tell); exact_match pins a named thing.
PRIMARY_WEIGHT = 1.0
BM25_WEIGHT = 0.5
# bm25 weighs most for decision_trace (docs/ranking.md#routes): the option's name is the key.
BM25_WEIGHT_BY_INTENT: dict[Intent, float] = {"decision_trace": 0.8}
EXACT_WEIGHT = 0.7
MAX_EXACT_ROUTES = 3
# A query about a single-valued topic ("Who do I report to?") also searches that topic's key:
# the current value wins even when it shares no word with the question.
TOPIC_WEIGHT = 0.5
# A low-weight whole-subject route: a misclassified query must never end in a silent
# "I don't remember" (docs/ranking.md#routes: better one directory too many). 0 drops it.
WHOLE_SUBJECT_WEIGHT = 0.3

# Interrogatives the write path leaves out (bare 什么/谁 also occur in statements, but a query
# that holds them almost always asks).
_ASKS = _rx(
    r"什么|啥|谁|哪|多少|几[个点号时天]|[吗呢]$|告诉我",
    r"^\s*(?:what|which|who|whom|whose|when|where|why|how)\b",
    r"\btell me (?:my|what|about|who|where|when)\b|\bremind me\b",
)
# Quoted names: 「青鸟」, “Atlas”, 《手册》, `redis`, "Atlas" (not ', which is an apostrophe).
_QUOTED = re.compile(r"[「『“《`\"]([^」』”》`\"]{1,40})[」』”》`\"]")
# A two-character Chinese name before a kind of thing: 青鸟项目, 北辰系统.
_ZH_NAME = re.compile(r"([\u4e00-\u9fff]{2})(?=项目|系统|平台|公司|团队|模式|方案|计划)")
# Characters no name of this shape holds: particles, pronouns, deictics, verbs of saying.
_ZH_NOT_NAME = frozenset("的了说个么这那哪我你他她们是在有和与把被选用当之前次本新旧整什一")
# Latin words in a Chinese query name tools and projects (pnpm, Postgres, docker).
_LATIN_WORD = re.compile(r"[A-Za-z][\w.+#-]*[\w+#]|[A-Za-z]")
# Capitalised words inside an English sentence (not its first word) are names.
_EN_CAPITALISED = re.compile(r"(?<=[\w,;:] )[A-Z][\w.+#-]*[\w+#]|(?<=[\w,;:] )[A-Z]{2,}")
_EN_NOT_NAME = frozenset(
    "I I'm I'd I've I'll OK Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April"
    " May June July August September October November December".split()
)


def plan(query: str) -> QueryPlan:
    """The heuristic plan of `query`: its intent and the routes that search for it.

    A transcript (`is_transcript`) is searched as it stands, over the whole subject: its lines
    cue every intent at once, and the intent of a conversation is not its last request's. With
    the scoped routes and exact matches on its capitalised words ("Do", "Really"), MADial zh
    lost 5.6 points of R@5 that the confidence gate could not win back (bench/RESULTS.md).
    """
    if is_transcript(query):
        return QueryPlan(intent="general_chat", routes=[Route(text=query)], source="heuristic")
    intent = classify(query)
    about = asked_holder(query)
    return QueryPlan(intent=intent, routes=routes_for(query, intent, about), source="heuristic", about=about)


def classify(query: str) -> Intent:
    """The intent with the highest cue score; ties go to the more specific intent (`PRIORITY`)."""
    intent, score = _ranked(query)[0]
    return intent if score > 0 else "general_chat"


def is_ambiguous(query: str) -> bool:
    """Whether an LLM planner could do better: a reference with no name, or two intents nearly tied."""
    if is_transcript(query):
        return False
    unnamed_reference = bool(DEICTIC.search(query)) and not named_entities(query)
    (_, best), (_, second) = _ranked(query)[:2]
    return unnamed_reference or (best > 0 and best - second < AMBIGUITY_MARGIN)


def scores(query: str) -> dict[Intent, float]:
    """Every intent's cue score for `query` (general_chat scores 0: it is what is left)."""
    mode: When = "question" if asks(query) else "statement"
    total: dict[Intent, float] = dict.fromkeys(PRIORITY, 0.0)
    for cue in CUES:
        if cue.when in ("any", mode) and cue.pattern.search(query):
            total[cue.intent] += cue.weight
    return total


def asks(query: str) -> bool:
    """Whether `query` asks: the write path's test, or an interrogative ("我喜欢什么代码风格" has no "？")."""
    return is_question(query) or bool(_ASKS.search(query))


def _ranked(query: str) -> list[tuple[Intent, float]]:
    total = scores(query)
    return sorted(total.items(), key=lambda item: (-item[1], PRIORITY.index(item[0])))


def named_entities(query: str) -> list[str]:
    """Names in `query`: quoted text, Chinese names before 项目/系统…, Latin or capitalised words."""
    found = [m.group(1).strip() for m in _QUOTED.finditer(query)]
    found += [m.group(1) for m in _ZH_NAME.finditer(query) if not _ZH_NOT_NAME.intersection(m.group(1))]
    found += _latin_names(query)
    return list(dict.fromkeys(name for name in found if name))


def _latin_names(query: str) -> list[str]:
    if CJK.search(query):
        return _LATIN_WORD.findall(query)
    return [word for word in _EN_CAPITALISED.findall(query) if word not in _EN_NOT_NAME]


def routes_for(query: str, intent: Intent, about: str | None = None) -> list[Route]:
    """Semantic over the intent's dirs, then bm25, exact matches on names, the topic's key (of the person asked
    about: "Where does my wife live?" reads her city's key, not the user's), and the whole-subject net."""
    dirs = list(INTENT_DIRS[intent])
    names = named_entities(query)[:MAX_EXACT_ROUTES]
    routes = [Route(text=query, dirs=dirs, strategy="semantic", weight=PRIMARY_WEIGHT)]
    if CJK.search(query) or names:
        weight = BM25_WEIGHT_BY_INTENT.get(intent, BM25_WEIGHT)
        routes.append(Route(text=query, dirs=dirs, strategy="bm25", weight=weight))
    routes += [Route(text=name, dirs=dirs, strategy="exact_match", weight=EXACT_WEIGHT) for name in names]
    topic = asked_topic_key(query)
    if topic is not None:
        topic = held_key(topic, about or SELF)
        routes.append(Route(text=query, keys=[topic, topic + TEMPORARY], weight=TOPIC_WEIGHT))
    if dirs and WHOLE_SUBJECT_WEIGHT > 0:
        routes.append(Route(text=query, dirs=[], strategy="semantic", weight=WHOLE_SUBJECT_WEIGHT))
    return routes


# Three lines or more: a conversation handed over as the query, not one request.
TRANSCRIPT_LINES = 3


def is_transcript(query: str) -> bool:
    return sum(1 for line in query.splitlines() if line.strip()) >= TRANSCRIPT_LINES


# "Bart: …", "Assistant：…": a speaker's name before a turn says who, not what.
_SPEAKER = re.compile(r"^[^\s:：]{1,20}[:：]\s*")


def recent_turns(query: str, turns: int) -> str | None:
    """The last `turns` lines of a query of more lines (a dialogue so far), without speaker names;
    None for a shorter query. An agent that asks with its conversation is asking, above all, about
    what was just said: the whole text's vector averages it with everything before it."""
    lines = [line.strip() for line in query.splitlines() if line.strip()]
    if turns <= 0 or len(lines) <= turns:
        return None
    return "\n".join(_SPEAKER.sub("", line) for line in lines[-turns:])
