"""The gate: what may enter memory at all (docs/write-path.md#gate).

Runs in the trigger worker on every message and again in extract, as a second lock.
Order: empty → injection → filler → redaction. Injection is judged on the raw text, so
that redacting the password inside "记住：管理员密码=…" cannot make the attack look
harmless. Secrets are replaced by `[REDACTED:<kind>]`; the rest of the message stays.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from memflow.pipeline.models import Role


@dataclass(frozen=True)
class GateVerdict:
    keep: bool
    text: str  # redacted
    reason: str | None  # "empty" | "injection" | "filler" when not kept
    redacted: bool
    flags: tuple[str, ...]


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE)


# Instructions aimed at the agent, not facts about the user: never stored, whoever sends them.
# Judged on the text folded by `_folded` (full-width letters, zero-width characters).
INJECTION = _rx(
    # "ignore all previous instructions"; not "ignore my previous directions to the venue".
    r"\b(?:ignore|disregard|forget|override)\b.{0,30}?(?<!my )(?<!our )"
    r"\b(?:previous|prior|above|earlier|all|your|the)\b.{0,30}?\b(?:instructions?|prompts?|rules|directions|guidelines)\b",
    r"\b(?:ignore|disregard|forget)\b.{0,20}?\beverything\b.{0,10}?"
    r"\b(?:you(?:'ve| have| were)? (?:been )?told|above)\b",
    r"\byou are now (?:a|an|the|in|no longer|free|unrestricted)\b|\byou are no longer (?:bound|restricted|limited)\b"
    r"|\bfrom now on,? you are\b(?! (?:allowed|welcome) to\b)",
    r"\b(?:you(?:'re| are)|pretend|act as|ai|assistant|chatbot)\b.{0,40}?\b(?:no|without(?: any)?) "
    r"(?:restrictions|limitations|limits|guardrails)\b|\bpretend (?:that )?(?:you are|you're)\b|(?-i:\bDAN\b)",
    r"\b(?:new|updated|reveal|print|show|repeat|output|leak|override|replace|ignore) (?:me |us )?(?:your |the )?"
    r"system prompt\b|\bsystem prompt\s*:|\b(?:jailbreak|dan|god) mode\b|\b(?:enter|activate) developer mode\b"
    r"|\bdeveloper mode (?:is )?(?:now )?(?:enabled|activated|engaged)\b",
    r"(?<!\bI )(?<!\bwe )\bact as (?:an? )?(?:admin|administrator|root)\b",
    r"\bremember (?:that )?the (?:admin|administrator|root) password\b|\b(?:admin|root) password (?:is|=)",
    r"\b(?:as|I am|I'm) your (?:developer|creator|owner|master|admin|administrator|operator)\b",
    r"\bask (?:the )?users? for (?:their |his |her )?(?:\w+ ){0,2}?(?:password|passcode|pin|cvv|credentials|card num)",
    # Chat-template and markup smuggling: a "system" turn or a note to the model inside the text.
    r"<\s*/?\s*(?:system|sys|instructions?)\s*>|<<\s*/?\s*SYS\s*>>|\[/?INST\]|<\|im_start\|>"
    r"|\[\s*system\b[^\]]{0,20}\]|\bnote (?:to|for) (?:the )?(?:ai|assistant|model|llm|bot)\b"
    r"|<!--.{0,40}?(?:\b(?:assistant|ai|model|system|llm|bot)\b|系统|助手|模型)",
    r"(?:忽略|无视|忘掉|忘记|不要理会|别理会|不要管|别管|跳过|抛开)[^，。！？,.!?\n]{0,8}?"
    r"(?:之前|以上|前面|上面|先前|此前|原来|原有|所有|全部|一切|你的)[^，。！？,.!?\n]{0,8}?"
    r"(?:指令|指示|提示词?|规则|设定|限制|要求|约束)",
    # "以上指令全部作废", "把之前的规则都忘了"; not "公司之前的规则都作废了吗".
    r"(?:之前|以上|前面|上面|先前|此前|原来|原有)的?(?:所有|全部|一切)?的?(?:指令|指示|提示词?|设定|限制)"
    r"[^，。！？\n]{0,4}?(?:作废|无效|失效|忘了|忘掉|不算数?|不再适用)"
    r"|把(?:之前|以上|前面|上面|先前|此前|原来|原有)的?(?:所有|全部|一切)?的?规则[^，。！？\n]{0,3}?(?:忘|作废|清空)",
    r"你现在是(?!不是|否|在|几|什么|哪|谁|怎么|多少|用|从)|从现在(?:开始|起)[，,]?你(?:是|扮演)|你的新(?:规则|身份|设定|指令|任务)",
    r"(?:你是|你现在|你将|扮演|假装|成为)[^，,。！？\n]{0,12}?(?:没有|不受|无视|摆脱)(?:任何)?的?(?:道德|伦理|安全)?(?:限制|约束|规则|底线|审查)",
    r"假装你是|(?:作为|我是)你的(?:开发者|开发人员|创造者|主人|管理员)",
    r"(?:【|\[|<|「)\s*系统(?:提示词?|指令|消息|通知|设定)?\s*(?:】|\]|>|」)|系统(?:提示词?|指令|消息)\s*[:：]"
    r"|(?:以下是|这是|新的?)系统(?:提示词?|指令|消息)|(?:输出|打印|显示|泄露|重复)(?:你的)?系统提示词?",
    r"越狱(?:模式|版本?|指令)|开发者模式已?(?:开启|启动|激活|启用)了?[。！!.]|(?:进入|切换到)开发者模式",
    r"(?:记住|记下|牢记|保存|存下)[^，。！？\n]{0,6}管理员密码|管理员密码\s*(?:是|为|=|:|：)",
    r"向用户(?:索要|索取|询问|要)[^，。！？\n]{0,6}(?:密码|验证码|银行卡|卡号|身份证|口令)",
)

# Standing orders about someone other than the user being served (docs/write-path.md#gate): the assistant in the
# third person or its replies to everybody, other users and subjects, or the memory system itself. A user's own
# wish ("always answer me in French", "call me Sam") names none of these. Such text may be kept as something the
# user said, never as a rule or a preference: `untrusted_directive` says which, and `pack` quotes it.
_ORDER_EN = (r"(?:must|should|shall|has to|have to|needs? to|ought to"
             r"|is (?:required|supposed|expected|allowed|permitted|to)\b"
             r"|will (?:always|never)|may now|can now|always|never|from now on|is no longer)")
_ORDER_ZH = (r"(?:必须|应该|应当|务必|一律|总是|永远|始终|每次|都要|都得|要求|不得|不能|禁止|只能|一定要"
             r"|要把|要在|要给)")
_DISCLOSE_EN = (r"(?:include|send|share|show|give|reveal|tell|forward|copy|paste|print|dump|export|leak|disclose|expose"
                r"|list|read out|display|attach|append|quote|repeat|hand|email|recommend)")
_DISCLOSE_ZH = (r"(?:附上|附带|发给|发送|转发|告诉|透露|泄露|展示|显示|给出|给|输出|打印|导出|复制|贴出|分享"
                r"|推荐|列出|念出)")
UNTRUSTED = {
    "assistant": _rx(
        rf"\b(?:the|this|our|your|every|each|all|any) (?:assistants?|ai|a\.i\.|models?|llms?|bots?|chatbots?|agents?"
        rf"|copilots?|system)\b[^.;!?\n]{{0,40}}?\b{_ORDER_EN}",
        rf"\b(?:every|each|all|any) (?:replies|reply|answers?|responses?|outputs?|messages?)\b[^.;!?\n]{{0,30}}?"
        rf"\b{_ORDER_EN}",
        rf"(?:助手|助理|人工智能|AI|大模型|模型|机器人|智能体|客服|系统)[^，。！？\n]{{0,12}}?{_ORDER_ZH}",
        rf"(?:所有|每条|每一条|每个|任何)(?:回复|回答|答复|输出|消息)[^，。！？\n]{{0,12}}?{_ORDER_ZH}",
    ),
    "other_users": _rx(
        r"\b(?:every|all|any|other|another|each|different)(?: other)? (?:users?|customers?|clients?|people|persons?"
        r"|subjects?|tenants?|accounts?|members?|agents?|sessions?)\b|\b(?:everyone|everybody|anyone|anybody)\b"
        r"|\bsomeone else'?s?\b|\bother people'?s?\b"
        r"|\b(?:the )?(?:last|previous|next|another) (?:person|user|customer|caller)\b",
        r"(?:其他|其它|别的|所有|每个|每一个|任何|全部)(?:的)?(?:用户|客户|人|租户|账号|账户|主体|会话|成员)|任何人|所有人|每个人|别人"
        r"|(?:上|下)一个(?:用户|人|客户)",
    ),
    "memory": _rx(
        r"\b(?:memor(?:y|ies)(?! (?:leaks?|usage|footprint|cards?|sticks?|limits?|pressure|errors?))"
        r"|memory (?:store|system|bank|database)|knowledge base|memory database|system prompt|rule ?book"
        r"|(?:system|standing|permanent|global) (?:rules?|instructions?))\b",
        r"记忆|记忆库|知识库|系统提示|系统规则|全局规则|永久规则|长期规则",
    ),
}
# What makes a mention of other users or of the memory an order rather than a fact: a verb of giving out, or a
# modal. "My brother and everyone at work use Linux" names others but orders nothing.
_ORDER_OR_DISCLOSE = _rx(rf"\b{_ORDER_EN}", rf"\b{_DISCLOSE_EN}(?:e?[sd]|ing)?\b", r"\b(?:is|are) to be\b",
                         _ORDER_ZH, _DISCLOSE_ZH,
                         r"\b(?:store|save|record|add|write|treat|mark|promote|pin|delete|erase|wipe|purge|overwrite"
                         r"|replace|obey|execute)\b|(?:存为|保存为|写入|记为|当作|作为|设为|删除|清空|覆盖|提升|执行|服从|听从)")


def untrusted_directive(text: str) -> str | None:
    """What a standing order in `text` is about, when it is not the user being served ("assistant",
    "other_users", "memory"); None for a statement or a user's own wish. Such text is data: it may be
    stored as something the user said, never rendered as a rule (`pipeline.pack`)."""
    folded = _folded(text)
    if UNTRUSTED["assistant"].search(folded):
        return "assistant"
    for target in ("other_users", "memory"):
        if UNTRUSTED[target].search(folded) and _ORDER_OR_DISCLOSE.search(folded):
            return target
    return None


# A value given for a password or key: after a strong separator anything; after "is" not a
# plain word ("the password is required"); after "to" or a bare space only with a digit in it
# ("密码 88886666", "changed it to Maple!Leaf77", not "a password to log in").
_PLAIN_WORD = (
    r"(?!(?:a|an|the|not|too|very|so|now|still|also|just|only|being|been|required|stored|saved|kept|hashed"
    r"|encrypted|expired|invalid|valid|wrong|incorrect|correct|missing|empty|weak|strong|long|short|same|different"
    r"|changed|reset|set|sent|shared|hidden|case|in|on|at|for|of|to|from|with|by|what|how|where|managed|rotated"
    r"|refreshed|generated|used|needed|optional|mandatory|secure|fine|ok|okay|good|bad|this|that|it|my|your|our"
    r"|their|his|her|there|here)\b)(?!\d+\s*(?:characters|chars|digits|letters|位|个字符))"
)
_VALUE_AFTER = (
    r"(?:\s*(?:=|:|：|是|为|(?:改|换|设置?|重置)(?:成|为)了?)\s*[:：]?\s*"
    rf"|\s*(?:\bis\b|'s\b|\bwas\b)\s*[:：]?\s*{_PLAIN_WORD}"
    r"|\s*(?:\b(?:changed|set|reset|updated)\s+)?\bto\s+(?=[\x21-\x7e]*\d)"
    r"|\s+(?=[\x21-\x7e]{4})(?=[\x21-\x7e]*\d))"
)
# "for my debit card", "to the staging box": what the password or key is for (within the sentence).
_FOR_WHAT = r"(?:\s+(?:for|of|to)\s+(?:(?:my|the|our|your)\s+)?[\w@-]+(?:\.[\w@-]+)*(?:\s+[\w@-]+(?:\.[\w@-]+)*)?)?"

# Secrets, in the order they are replaced: specific formats first, so a key inside a
# "password: …" phrase is named for what it is. `secret` groups mark the part replaced.
SECRETS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # A key pasted whole, or cut off before its END line (then its base64 lines go).
    ("private_key", _rx(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
                        r"|(?:\s*[A-Za-z0-9+/=]{16,})*)")),
    (
        "api_key",
        re.compile(
            r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}|\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|\bAKIA[0-9A-Z]{16}\b"
            r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bglpat-[A-Za-z0-9_\-]{20,}"
            r"|\bhf_[A-Za-z0-9]{30,}|\bnpm_[A-Za-z0-9]{36}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_\-]{35}"
            r"|\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}|\bLTAI[0-9A-Za-z]{12,30}\b|\bAKID[0-9A-Za-z]{13,40}\b"
        ),
    ),
    (
        "token",
        _rx(
            r"\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=\-]{16,})",
            r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        ),
    ),
    # Credentials inside a connection URL: postgres://user:PASSWORD@host.
    ("password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:(?P<secret>[^\s@/]+)@")),
    (
        "password",
        _rx(
            rf"(?:密码|口令|\b(?:password|passwd|pwd|passcode)\b){_FOR_WHAT}{_VALUE_AFTER}"
            r"(?P<secret>[\x21-\x7e]+)"
        ),
    ),
    # A PIN is digits: "a pin on your purse. Is Spider-Man…" is no PIN.
    ("password", _rx(rf"\bpin(?: code| number)?\b{_FOR_WHAT}{_VALUE_AFTER}(?P<secret>\d{{4,8}})(?!\d)")),
    (
        "api_key",
        _rx(
            r"(?:\b(?:api[_ -]?key|(?:aws[_ -])?secret(?:[_ -]?access)?(?:[_ -]?key)?|private[_ -]?key"
            r"|(?:client|app)[_ -]?secret|secret[_ -]?id|access[_ -]?token|auth[_ -]?token|token)\b"
            rf"|密钥|秘钥|令牌){_FOR_WHAT}{_VALUE_AFTER}"
            # A key has a digit in it or is long: "the secret is patience" is advice.
            r"(?P<secret>(?=[\x21-\x7e]*\d)[\x21-\x7e]{6,}|[\x21-\x7e]{20,})"
        ),
    ),
    (
        "otp",
        _rx(
            r"(?:验证码|校验码|动态码|\b(?:verification|security|one[- ]time|2fa|otp|sms) (?:pass)?code|\botp\b)"
            r"(?:\s+(?:is|was))?\s*(?:是|为|:|：)?\s*(?P<secret>\d{4,8})(?!\d)"
        ),
    ),
    # Chinese resident ID: region, birth date, sequence, check digit (may be X); may be grouped 6-8-4.
    (
        "id_card",
        re.compile(
            r"(?<!\d)[1-9]\d{5}([ -]?)(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\1\d{3}"
            r"[\dXx](?![\dA-Za-z])"
        ),
    ),
    # US social security number, and passport or licence numbers named as such.
    ("ssn", re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])")),
    (
        "passport",
        _rx(
            r"(?:\b(?:passport|driver'?s? licen[cs]e)\b(?:\s*(?:number|no\.?|#))?|护照|驾驶证)(?:号码?)?"
            r"\s*(?:是|为|=|:|：|\bis\b)?\s*(?P<secret>[A-Za-z]{0,2}\d{6,12})(?![\dA-Za-z])"
        ),
    ),
    # Bank cards: 15–19 digits, whole or grouped as printed (4-4-4-4[-3], Amex 4-6-5). No Luhn
    # check on purpose: a mistyped card number is still somebody's card number. Order, tracking
    # and invoice numbers are named as such and left alone (see `_REFERENCE`).
    (
        "bank_card",
        re.compile(
            r"(?<!\d)(?<!\d[ -])(?:\d{15,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1\d{1,3})?|\d{4}([ -])\d{6}\2\d{5})"
            r"(?![ -]?\d)"
        ),
    ),
    ("card_code", _rx(r"(?:\b(?:cvv2?|cvc2?)\b|安全码)\s*(?:is|是|为|:|：)?\s*(?P<secret>\d{3,4})(?!\d)")),
)
# What a text must hold for a pattern to have a chance: checked first, because scanning 32 KB of ordinary words
# with the widest patterns takes tens of milliseconds, and every publish redacts (docs/write-path.md#gate).
# Each test is implied by its pattern (a card has 15 digits at least, an SSN 9, an ID number 17).
_DIGITS = re.compile(r"\d")
_KEY_WORDS = ("api", "secret", "private", "token", "密钥", "秘钥", "令牌")


def _has_digits(n: int) -> Callable[[str], bool]:
    return lambda text: len(_DIGITS.findall(text)) >= n


_NEEDS: dict[int, Callable[[str], bool]] = {id(pattern): need for (_, pattern), need in zip(SECRETS, (
    None, None, None, None, None, None,
    lambda text: any(word in text.lower() for word in _KEY_WORDS),
    None, _has_digits(17), _has_digits(9), None, _has_digits(15), None), strict=True) if need is not None}

# The words that make a long number an order, tracking or invoice number, right before it.
_REFERENCE = _rx(
    r"(?:订单|单号|流水|工单|运单|快递|发票|学号|工号|编号|order|tracking|invoice|ticket|transaction|reference|ref"
    r"|booking|confirmation)"
    r"\s*(?:号码?|编号|no\.?|number|num|id|#)?(?:\s+is)?\s*[:：#]?\s*$"
)
_UNLESS_AFTER = {"bank_card": _REFERENCE}

# Personal but not secret: kept in memories (the user may want their email remembered),
# removed from traces (docs/ranking.md#traces).
CONTACTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")),
    (
        "phone",
        re.compile(
            r"(?<!\d)(?:\+?86[ -]?)?1[3-9]\d(?:\d{8}|([ -])\d{4}\1\d{4})(?!\d)"
            r"|\+\d{1,3}[ -]?\(?\d{1,4}\)?(?:[ -]?\d{2,4}){2,4}"
            r"|(?<!\d)\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?!\d)"
        ),
    ),
)

_PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+\]")

# Acknowledgements that carry nothing to remember (docs/write-path.md#gate: "好的", "明白了", "请稍等").
# A message is filler when every piece of it is one of these.
FILLER_ZH = tuple(
    "好的 好滴 好嘞 好吧 好了 好 行吧 行 可以 没问题 嗯 哦 噢 喔 哈 呵呵 嘿嘿 明白了 明白 懂了 知道了 了解了 了解"
    " 收到了 收到 谢谢你 谢谢 谢了 谢 多谢 感谢 辛苦了 对的 对 是的 没错 请稍等 稍等 okay ok"
    # Particles that only colour the words above ("好的呀", "嗯嗯").
    " 呀 啦 啊 呢 吧 嘛 了 的".split()
)
FILLER_EN = frozenset(
    "ok okay k kk thanks thank you thx ty got it sure cool great nice noted alright right yes yeah yep yup"
    " fine perfect awesome understood roger lol haha hmm hm uh um mhm np welcome good sounds".split()
)
_PIECE_BREAK = re.compile(r"[\s\W_]+")


def injected(text: str) -> bool:
    """Whether `gate` would drop `text` as an injected instruction (its first test alone, without the redaction a
    verdict costs: an import checks every string of every record with it)."""
    return _meaningful(text) and INJECTION.search(_folded(text)) is not None


def gate(text: str, role: Role) -> GateVerdict:
    """Whether a message may become memory, and its text with secrets replaced."""
    if not _meaningful(text):
        return _drop(text, "empty" if not text.strip() else "filler")
    if INJECTION.search(_folded(text)):
        return _drop(redact(text), "injection")
    if _is_filler(text):
        return _drop(text, "filler")
    cleaned, kinds = _redact(text, SECRETS)
    if not _meaningful(_PLACEHOLDER.sub("", cleaned)):
        return _drop(cleaned, "empty")
    flags = tuple(f"redacted:{k}" for k in kinds) + _role_flags(role) + _untrusted_flags(cleaned)
    return GateVerdict(keep=True, text=cleaned, reason=None, redacted=bool(kinds), flags=flags)


def redact_secrets(text: str) -> tuple[str, list[str]]:
    """The text with its secrets replaced (contacts kept), and the kinds found: what a publish stores in the
    `events` stream, so that no copy of a secret reaches Redis, its AOF or its replicas (docs/write-path.md#gate)."""
    return _redact(text, SECRETS)


def redact(text: str) -> str:
    """Secrets, phone numbers and emails replaced: what a trace may show."""
    return _redact(_redact(text, SECRETS)[0], CONTACTS)[0]


def _drop(text: str, reason: str) -> GateVerdict:
    return GateVerdict(keep=False, text=text, reason=reason, redacted=False, flags=())


def _untrusted_flags(text: str) -> tuple[str, ...]:
    # Kept, but as data: extraction stores it as a statement of the user, never a rule (`untrusted_directive`).
    target = untrusted_directive(text)
    return () if target is None else (f"untrusted:{target}",)


def _role_flags(role: Role) -> tuple[str, ...]:
    # Tool output is stored apart and can never raise confidence; system text is the
    # agent's configuration, not something the user said.
    return (role.value,) if role in (Role.tool, Role.system) else ()


def _redact(text: str, table: tuple[tuple[str, re.Pattern[str]], ...]) -> tuple[str, list[str]]:
    kinds: list[str] = []
    for kind, pattern in table:
        need = _NEEDS.get(id(pattern))
        if need is not None and not need(text):
            continue
        text = pattern.sub(partial(_placeholder, kind=kind, found=kinds), text)
    return text, kinds


def _placeholder(m: re.Match[str], kind: str, found: list[str]) -> str:
    unless = _UNLESS_AFTER.get(kind)
    if unless is not None and unless.search(m.string, max(0, m.start() - 24), m.start()):
        return m.group(0)
    if kind not in found:
        found.append(kind)
    if m.re.groupindex.get("secret") is None or m.group("secret") is None:
        return f"[REDACTED:{kind}]"
    start, end = m.span("secret")
    whole = m.group(0)
    return whole[: start - m.start()] + f"[REDACTED:{kind}]" + whole[end - m.start() :]


def _folded(text: str) -> str:
    """Full-width letters made plain ("ｉｇｎｏｒｅ") and zero-width characters taken out of words."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")


def _meaningful(text: str) -> bool:
    """Anything left once whitespace, punctuation and emoji are taken away."""
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)


def _is_filler(text: str) -> bool:
    pieces = [p for p in _PIECE_BREAK.split(text.lower()) if p]
    return bool(pieces) and all(p in FILLER_EN or _is_zh_filler(p) for p in pieces)


def _is_zh_filler(piece: str) -> bool:
    while piece:
        head = next((f for f in FILLER_ZH if piece.startswith(f)), None)
        if head is None:
            return False
        piece = piece[len(head) :]
    return True
