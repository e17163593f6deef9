"""Cue phrases: the Chinese and English wording that says what kind of statement a sentence is.

Tables only: `triggers.py` reads the statement cues, `topics.py` the topic table.
Chinese has no word boundaries, so Chinese cues are plain substrings, guarded by
look-behinds where a cue is also part of a common word; English cues carry `\\b` and
everything matches case-insensitively.
What each cue fires, and when: docs/write-path.md#triggers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memflow.pipeline.models import MType


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE)


# English imperatives are only recognised before a verb an agent can be told to do:
# "Never commit secrets" is a rule, "Never had a chance to visit" and "Always fun to
# dig in" are chat (measured on LoCoMo: without this list most "rules" were small talk).
_DO = (
    r"(?:use|run|write|reply|answer|respond|ask|check|include|add|keep|put|call|commit|push|merge|deploy|test"
    r"|format|explain|show|send|share|store|save|log|print|delete|remove|drop|touch|change|modify|edit|expose"
    r"|leak|mention|cite|make|follow|skip|start|end|open|close|install|update|upgrade|rename|hardcode"
    r"|hard-code|paste|post|email|contact|book|schedule|assume|guess|suggest|recommend|say|tell|translate)\b"
)
_IMPERATIVE_START = r"(?:^|[,;:]\s*|\bplease\s+|\byou\s+(?:should|must)\s+)"

# Asking to be remembered. Bare "记得" is left out ("我记得上次…" recalls, it does not
# ask), and so are "I remember …" and "remember when we…", which reminisce, and
# "remember to enjoy the journey", which is advice.
_ABOUT = rf"(?:\s*[:：]|\s+(?:that|this|my|our|i\b|i'm|we\b|to {_DO}))"
REMEMBER = _rx(
    r"记住|记一下|记下|帮我记|别忘了|不要忘|请记得|要记得",
    rf"(?<!\bi )(?<!\bwe )\bremember{_ABOUT}|^(?:please )?remember\b",
    rf"\b(?:don'?t|do not) forget{_ABOUT}|\bkeep in mind\b|\bmake a note\b|\bplease note\b",
)

# Saying an earlier statement was wrong (docs/write-path.md#triggers).
CORRECTION = _rx(
    r"更正|纠正|改成|改为|搞错了|弄错了|说错了|记错了|写错了|不对|其实是",
    r"不是[^，,。]{1,20}[，,]\s*(?:而)?是",
    r"\bcorrection\b|\bactually\b|\bi meant\b|\bi misspoke\b|\blet me correct\b",
    r"\b(?:i|we)(?:'m|'re| am| are)? no longer\b|\b(?:is|are) no longer\b",
    r"\byou(?:'ve| have)? got (?:it|that) wrong\b|\byou'?re wrong\b",
    r"\bthat(?:'s| is) (?:not right|wrong|incorrect)\b|\bnot [^,.]{1,30} anymore\b",
)

# A value said to have changed, in passing (docs/write-path.md#corrections-said-in-passing): "we moved to…",
# "I've switched to…", "现在改成…". It replaces only what it names: the same single-valued topic, or what
# `ENDED` says is over. Bare "now"/"现在" count only beside such a topic ("I live in Munich now").
CHANGE = _rx(
    r"搬到|搬去|搬家到|搬回|换成|换了|改成|改为|改用|不再|已经不|戒了|戒掉|辞职|离职|跳槽|现在|如今",
    r"\bmoved (?:to|back to|into)\b|\brelocated\b|\bswitched (?:to|from|over)\b|\bchanged (?:to|my)\b"
    r"|\b(?:got|have|bought) (?:a|an|my) new\b|\breplaced\b|\bupgraded (?:to|my)\b|\bno longer\b|\banymore\b"
    r"|\bany more\b|\bthese days\b|\bnowadays\b|\bquit\b|\bstopped\b|\bgave up\b|\bnow\b",
)

# What a statement says is over: the words of the habit, fact or thing it ends ("I don't drink oolong anymore"
# → "drink oolong"; "我已经戒可乐了" → "可乐"). `what` names it; a memory that holds those words is replaced.
_ENDS_EN = r"[^,.;!?]{1,40}?"
_ENDS_ZH = r"[^，,。；;！!？?了]{1,12}"
ENDED = _rx(
    rf"\b(?:don'?t|doesn'?t|do not|does not|am not|'m not|is not|isn'?t|not) (?:really )?(?P<en1>{_ENDS_EN}) "
    r"(?:anymore|any more)\b",
    rf"\bno longer (?P<en2>{_ENDS_EN})(?=[,.;!?]|$| now\b| since\b| because\b)",
    rf"\b(?:quit|stopped|gave up(?: on)?) (?P<en3>{_ENDS_EN})(?=[,.;!?]|$| (?:last|this|a|two|three|few|since|because"
    r"|when|after)\b)",
    rf"\bswitched (?:over )?from (?P<en4>{_ENDS_EN}) to\b",
    rf"(?:不再|已经不|再也不)(?P<zh1>{_ENDS_ZH})",
    rf"戒(?:掉|了)(?P<zh2>{_ENDS_ZH})|把(?P<zh3>{_ENDS_ZH})戒(?:掉|了)|戒(?P<zh4>{_ENDS_ZH})了",
    rf"从(?P<zh5>{_ENDS_ZH}?)(?:辞职|离职)",
)

# Hard rules. "我必须…/I must…" describe the speaker, not a rule for the agent, hence
# the look-behinds; "never" counts only as an imperative ("I never drink coffee" is a
# habit, a preference); "must be / must've" guess rather than oblige.
STRONG_RULE = _rx(
    r"(?<!我)(?:禁止|严禁|必须|务必|不能|不可以|不准|不许|不得|一律|绝不|绝对不|千万不要|千万别|"
    r"永远不要|永远别|永远不能|一定不要|一定要)",
    rf"{_IMPERATIVE_START}never (?:ever )?{_DO}|\b(?:do not|don'?t) ever {_DO}",
    r"(?:^|\byou |\bwe |\balways )must(?:n't| not)? (?:always |never )?" + _DO + r"|\bmust(?:n't| not| never) be\b",
    r"\bunder no circumstances\b|\bnot allowed to\b|\b(?:is|are) (?:not allowed|forbidden|prohibited)\b",
)

# Soft imperatives: a rule unless they are about a preference topic ("别写那么长了" is
# about reply length; "不要把密钥提交到 git" is a rule). "别" is only a cue at a clause
# start or after an adverb: it is also inside 特别/区别/别人.
WEAK_RULE = _rx(
    r"(?<!我)不要|避免",
    r"(?:^|[，,：:\s]|请|你|也|都|就|可|先)别(?![人的])",
    rf"{_IMPERATIVE_START}(?:always|don'?t|do not|avoid) {_DO}",
)

# Explicit preference statements (docs/write-path.md#triggers).
_STATED = (
    r"我.{0,4}?(?:喜欢|讨厌|偏好|偏爱|爱用|倾向|希望)|偏好|更喜欢|希望你",
    r"以后|今后|往后|从现在起|从今往后|下次|每次|请尽量|尽量",
    r"\bi(?: really| also| generally| usually)? (?:prefer|like|love|enjoy|hate|dislike|adore)\b",
    r"\bi (?:don'?t|do not) (?:like|want|enjoy|love)\b|\bi can'?t stand\b",
    r"\bi'?d (?:rather|prefer|like you to)\b|\bfrom now on\b|\bgoing forward\b|\bin (?:the )?future\b",
    r"\bmy favou?rite\b",
    r"\bplease (?:keep|make|use|reply|answer|write|respond|be)\b",
)
# Habits: durable wording makes a standing preference even without 喜欢/like (docs/write-path.md#time-references:
# "我习惯/我总是" are preferences, "下个月去日本出差" an event). The speaker's own
# only: "我觉得你总是…" is about someone else, "我们每周一开例会" a team's routine;
# "我觉得一般" and "I think every day…" are opinions.
_PERIOD = r"(?:morning|day|evening|night|weekend|week|month|year|(?:mon|tues|wednes|thurs|fri|satur|sun)day)"
_HABITUAL = (
    r"我[^，,。你他她]{0,4}?(?:习惯|平时|平常|通常|总是|老是|向来|一向|往往|经常|常常)",
    r"我[^，,。你他她]{0,4}?(?<!觉得)(?<!感觉)一般(?![般的吧啊呀，,。！!？?]|$)",
    r"我(?!们)[^，,。你他她]{0,4}?每(?:天|日|晚|周|星期|礼拜|个?月|年)",
    r"\bi(?:'m| am)? (?:always|usually|normally|generally|typically|often|never|mostly)\b|\bi tend to\b",
    rf"\bevery (?:single )?{_PERIOD}s?\b,? i\b",
    rf"\bi (?!think\b|believe\b|feel\b|guess\b|hope\b|wish\b)[^.;!?]{{0,40}}?\bevery (?:single )?{_PERIOD}\b",
    # "I smoke about ten cigarettes a day", "I run twice a week": a rate is a routine.
    r"\bi (?!think\b|believe\b|feel\b|guess\b|hope\b|wish\b)[^.;!?]{0,40}?\b(?:once|twice|\d+(?: \w+)?"
    r"|(?:one|two|three|four|five|six|seven|eight|nine|ten|a few|several) \w+) (?:a|per) (?:day|week|month|year)\b",
)
STATED_PREFERENCE = _rx(*_STATED)
HABIT = _rx(*_HABITUAL)
PREFERENCE = _rx(*_STATED, *_HABITUAL)

# Wording that states a preference only when the topic is one ("我需要深入的技术细节"
# is; "我需要一个脚本" is a task): a need, what will do ("回复简短一点就行"), a request to
# send somewhere ("Please send my notifications to Slack").
GATED_PREFERENCE = _rx(
    r"需要|越.{1,4}越好|就行|就好|就可以了",
    r"\bi (?:need|want)\b|\bkeep it\b|\bmake it\b|(?:^|\bplease )(?:send|forward|deliver)\b",
)

# A confirmed choice (docs/write-path.md#triggers: record decisions when confirmed, not while discussed).
DECISION = _rx(
    r"决定|定了|就用|就这么定|敲定|选定|确定用|最终选|拍板",
    r"\blet'?s (?:go with|use)\b|\blet us go with\b|\bwe(?:'ve| have)? decided\b|\bdecided to\b",
    r"\bwe(?:'ll| will) (?:go with|use)\b|\b(?:we'?re|we are|i'?m|i am) going with\b|\bwe chose\b",
    r"\bfinal decision\b",
)

# Still being discussed: no decision yet ("还没决定", "犹豫", "not sure").
UNDECIDED = _rx(
    r"还没(?:有)?(?:决定|定)|没(?:有)?决定|未决定|尚未决定|犹豫",
    r"\b(?:haven'?t|have not|hasn'?t|not yet|never) decided\b|\b(?:didn'?t|did not) decide\b|\bundecided\b",
    r"\bnot sure\b",
)

# A preference meant for now only: it becomes temp_preference (τ 14 d, docs/ranking.md#lifecycle-scoring).
TEMPORARY = _rx(
    r"这次|本次|这一次|这回|今天|今晚|暂时|目前先|最近|这几天|这段时间|这周|本周",
    r"\bthis time\b|\bfor now\b|\btoday\b|\btonight\b|\btemporarily\b|\bthese days\b|\blately\b",
    r"\bthis week\b|\bfor this (?:session|chat|conversation)\b",
)

# Said to hold forever: a rule worded like this is pinned and never decays.
FOREVER = _rx(
    r"永远|永久|始终|任何时候|无论如何",
    r"\balways\b|\bnever\b|\bforever\b|\bat all times\b|\bunder no circumstances\b",
)

# What the speaker is doing right now: session context (τ 48 h), unless it says more.
CONTEXT = _rx(
    r"正在|此刻|眼下|刚刚|刚才",
    r"\bright now\b|\bat the moment\b|\bi'?m (?:currently )?(?:working on|writing|doing|looking at|trying to)\b",
)

# First-person statements of fact ("我的血型是…", "My blood type is…", "I work at…").
# `(?<!不)是`: "我不是很确定" is not a fact; nor is the 是 of 总是/老是 ("always") a copula.
FIRST_PERSON_FACT = _rx(
    r"我(?:们)?(?:的|家)?[^，,。]{0,12}?(?<![不还就但可总老])是|我叫(?![了过])|我们用|我用的是",
    r"我(?:们)?(?:住|有|养|在[^，,。]{1,12}(?:工作|上班|读书|上学))|我对[^，,。]{1,10}过敏",
    r"\bmy [\w' -]{1,30}? (?:is|are|was|were)\b|\bour [\w' -]{1,30}? (?:is|are|uses?)\b",
    # A standing trait said as "I'm …": what the user is, eats or cannot have (diet and health), not a mood.
    r"\bi(?:'m| am) (?:a|an|from|based|married|allergic|vegetarian|vegan|pescatarian|diabetic"
    r"|lactose[- ]intolerant|gluten[- ]free)\b|\bi (?:live|work|own|study)\b",
    # What the user does for a living, said as what they are doing: "I'm still doing accounting at a law firm".
    r"\bi(?:'m| am) (?:still |now |currently )?(?:working (?:as|at|for|in)|doing \w+ (?:at|for))\b",
    r"\bi have (?!to\b)|\bi'?ve got\b|\bwe(?:'re| are)? (?:use|using|run|host)\b",
)

# The date of what comes back every year ("我的生日是五月三号", "My birthday is on May 3rd"): a fact of whoever it
# is about, not a one-off event over once its day has passed.
RECURRING_DATE = _rx(
    r"(?:生日|纪念日)(?:是|在)",
    r"\b(?:birthday|anniversary) (?:is|falls)\b",
)

# Asserting something about a topic or a project ("数据库是…", "CI 用的是…").
ASSERTION = _rx(
    r"(?<![不还就但可总老])是|用的|用了|使用|采用|叫|住|搬|在做|做|当|负责|跳槽|入职|加入|上班|工作|任职",
    r"\b(?:is|are|was|were|uses?|using|used|called|named|lives?|moved|works?|runs?|built)\b",
)

# Follow-ups that, repeated, show a wish for more detail or for less (docs/write-path.md#triggers):
# the only inferred preferences the rules make (confidence 0.4–0.6: docs/write-path.md#confidence-by-source).
MORE_DETAIL = _rx(
    r"详细(?:一点|一些|点|说说|讲讲)|展开(?:讲|说)|具体(?:一点|一些|点|说说|讲讲)|再详细|多讲",
    r"\bmore detail|\belaborate\b|\bgo deeper\b|\bexpand on\b|\bin more depth\b|\bexplain more\b",
)
LESS_DETAIL = _rx(
    r"太长了|简短点|短一点|说重点|简单点|看不过来",
    r"\btoo long\b|\btl;?dr\b|\bshorter\b|\bget to the point\b",
)


# ---------------------------------------------------------------------------------------
# Topics: what a statement is about, for its key (see `topics.py`).


@dataclass(frozen=True)
class Topic:
    key: str
    # What a statement on this topic is when nothing else says: a preference or a fact.
    mtype: MType
    pattern: re.Pattern[str]
    # "青鸟项目的数据库" is another key than "the database" (docs/write-path.md#topic-keys).
    per_project: bool = False


def _topic(key: str, mtype: MType, zh: str, en: str, per_project: bool = False) -> Topic:
    return Topic(key, mtype, re.compile(f"{zh}|{en}", re.IGNORECASE), per_project)


_P, _F = MType.preference, MType.fact
_ZH_ROLES = r"(?:工程师|开发|程序员|设计师|经理|分析师|老师|教师|医生|护士|会计|律师|学生|研究员|架构师|厨师|司机|销售)"

# Only single-valued topics: a new value replaces the old one (allergies, pets, hobbies
# accumulate, so they get keys of their own words).
# Order is priority: the first topic that matches names the key. Specific before
# general (code style's "格式化" before reply format's "格式"; contact's "微信号"
# before the notification channel's "微信"; tech stack before employer, so that
# "我们公司的数据库是 MySQL" is about the database).
TOPICS: tuple[Topic, ...] = (
    _topic(
        "code.style",
        _P,
        r"代码风格|缩进|命名规范|格式化|代码格式",
        r"\bcode style\b|\bindent(?:ation)?\b|\btabs\b|\bformatter\b|\bprettier\b|\bnaming convention",
    ),
    _topic(
        "reply.language",
        _P,
        r"用中文|用英文|中文回答|英文回答|说中文|说英文",
        r"\b(?:in|reply in|answer in|respond in) (?:english|chinese|mandarin|japanese|french|german|spanish)\b",
    ),
    _topic(
        "reply.format",
        _P,
        r"结构化|要点|列表|表格|段落|格式|分点|markdown",
        r"\bbullets?\b|\bbullet points?\b|\bmarkdown\b|\btables?\b|\bformat(?:ting)?\b|\bstructured\b"
        r"|\bparagraphs?\b",
    ),
    _topic(
        "reply.length",
        _P,
        r"简短|简洁|简练|精简|冗长|啰嗦|太长|那么长|很长|长篇|篇幅|详细|细节|深入|说重点|言简意赅|简单点|短一点|长一点",
        r"\bshort(?:er)?\b|\bconcise\b|\bbrief\b|\bverbose\b|\blengthy\b|\blong-winded\b|\bwordy\b"
        r"|\bdetailed\b|\bdetails?\b|\bin-depth\b|\bsuccinct\b|\bterse\b|\blong (?:answers?|replies)\b",
    ),
    _topic("reply.tone", _P, r"语气|口语化|正式一点|表情", r"\btone\b|\bformal\b|\bcasual\b|\bemojis?\b"),
    _topic("contact.email", _F, r"邮箱|邮件地址", r"\bemail address\b|\bmy e-?mail\b"),
    _topic("contact.phone", _F, r"手机号|电话号码|联系电话", r"\bphone number\b|\bmy number\b"),
    _topic("device.phone", _F, r"手机(?!号)", r"\bmy (?:phone|smartphone|mobile)\b(?! number)"),
    _topic("contact.wechat", _F, r"微信号", r"\bwechat id\b"),
    _topic(
        "notify.channel",
        _P,
        r"推送|推消息|推到|推给我|通知|提醒我|微信|钉钉|飞书|短信",
        r"\bnotif(?:y|ications?)\b|\bping me\b|\btext me\b|\bemail me\b|\bslack\b|\bwechat\b"
        r"|\bdingtalk\b|\btelegram\b|\bsms\b",
    ),
    _topic("tool.package_manager", _P, r"包管理|依赖管理", r"\bpnpm\b|\bnpm\b|\byarn\b|\bpoetry\b|\bpackage manager\b"),
    _topic("tool.editor", _P, r"编辑器", r"\bvim\b|\bneovim\b|\bemacs\b|\bvs ?code\b|\bide\b|\bpycharm\b|\beditor\b"),
    _topic("location.address", _F, r"地址|住址|门牌", r"\baddress\b"),
    # The manager before places: "my manager is now Aisha, Tom moved to another team" is no city.
    _topic(
        "person.manager",
        _F,
        r"我的?(?:直属)?(?:领导|上司|老板|主管|经理)",
        r"\bmy (?:manager|boss|supervisor|team lead|lead)\b|\breports? to\b",
    ),
    _topic(
        "location.city",
        _F,
        r"住在|住到|搬到|搬去|搬家|定居|居住|所在城市|住哪",
        r"\blive in\b|\bliving in\b|\blives in\b|\bmoved to\b|\bmoving to\b|\brelocat(?:ed|ing) to\b"
        r"|\bbased in\b|\bwhere (?:do|does|did) (?:i|we|\w+) live\b",
    ),
    _topic("person.name", _F, r"我叫(?![了过])|我的名字", r"\bmy name\b|\bcall me\b|\bi'?m called\b"),
    _topic(
        "work.role",
        _F,
        rf"(?:我是(?:一[名个位]|个)?[^，,。]{{0,8}}?|(?:做|当)(?:一[名个位])?[^，,。]{{0,4}}?){_ZH_ROLES}"
        r"|我的(?:职位|岗位|职业)|做什么工作|干什么工作|是做什么的",
        r"\bi(?:'m| am) an? [\w -]{0,30}?(?:engineer|developer|designer|manager|analyst|teacher|doctor"
        r"|student|researcher|scientist|nurse|lawyer|consultant|architect)\b|\bmy (?:job|role|title)\b"
        r"|\bi work as\b|\bwhat do (?:i|we) do for (?:work|a living)\b|\bwhat(?:'s| is) my job\b",
    ),
    _topic("health.diet", _F, r"素食|吃素|忌口|清真", r"\bvegetarian\b|\bvegan\b|\bkosher\b|\bhalal\b"),
    # Saying where one works comes before the tech stack: "I work at Stripe as a backend engineer".
    _topic(
        "work.employer",
        _F,
        r"在[^，,。]{1,15}?(?:工作|上班|任职|实习)|入职|就职|跳槽到|跳槽去|辞职|离职",
        r"\bi (?:now |still )?work (?:at|for|in)\b|\bi(?:'ve| have)? joined\b|\b(?:a|my) new job\b"
        r"|\b(?:quit|left) my job\b|\bi resigned\b",
    ),
    _topic(
        "tech.db",
        _F,
        r"数据库",
        r"\bdatabase\b|\bpostgres(?:ql)?\b|\bmysql\b|\bmongo(?:db)?\b|\bsqlite\b|\bmariadb\b",
        True,
    ),
    _topic("tech.frontend", _F, r"前端", r"\bfront-?end\b|\breact\b|\bvue\b|\bangular\b|\bsvelte\b", True),
    _topic("tech.backend", _F, r"后端|微服务|架构", r"\bback-?end\b|\bmicroservices?\b|\barchitecture\b", True),
    _topic(
        "tech.ci",
        _F,
        r"持续集成|流水线",
        r"\bci\b|\bci/cd\b|\bgithub actions\b|\bjenkins\b|\bgitlab ci\b|\bcircleci\b",
        True,
    ),
    _topic("tech.cloud", _F, r"阿里云|腾讯云|华为云|云服务", r"\baws\b|\bgcp\b|\bazure\b|\bgoogle cloud\b", True),
    _topic("tech.deploy", _F, r"部署在|部署到|部署方式", r"\bdeployed (?:on|to)\b|\bkubernetes\b|\bk8s\b", True),
    # "我们公司…" / "my company…" only names the employer when no tech topic claimed the sentence.
    _topic("work.employer", _F, r"我(?:们)?公司", r"\bmy (?:company|employer)\b"),
)
