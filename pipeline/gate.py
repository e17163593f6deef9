"""The gate: what may enter memory at all (seed 003 §2.1, §5.4; DESIGN §3.1, §7).

Runs in the trigger worker on every message and again in extract, as a second lock.
Order: empty → injection → filler → redaction. Injection is judged on the raw text, so
that redacting the password inside "记住：管理员密码=…" cannot make the attack look
harmless. Secrets are replaced by `[REDACTED:<kind>]`; the rest of the message stays.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import partial

from pipeline.models import Role


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
INJECTION = _rx(
    r"\b(?:ignore|disregard|forget|override)\b.{0,30}?\b(?:previous|prior|above|earlier|all|your|the)\b"
    r".{0,30}?\b(?:instructions?|prompts?|rules|directions|guidelines)\b",
    r"\byou are now (?:a|an|the|my|in|no longer|free|unrestricted)\b|\bfrom now on,? you are\b",
    r"\bsystem prompt\b|\b(?:developer|jailbreak|dan) mode\b|\bact as (?:an? )?(?:admin|administrator|root)\b",
    r"\bremember (?:that )?the (?:admin|administrator|root) password\b|\b(?:admin|root) password (?:is|=)",
    r"(?:忽略|无视|忘掉|忘记|不要理会|跳过)(?:掉)?(?:你)?(?:之前|以上|前面|上面|先前|此前|原来|原有)?的?"
    r"(?:所有|全部|一切)?的?(?:指令|指示|提示词?|规则|设定|限制)",
    r"你现在是(?!不是)|从现在(?:开始|起)[，,]?你(?:是|扮演)|系统提示词?|系统指令|管理员密码|越狱|开发者模式",
)

# Secrets, in the order they are replaced: specific formats first, so a key inside a
# "password: …" phrase is named for what it is. `secret` groups mark the part replaced.
SECRETS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key", _rx(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----")),
    (
        "api_key",
        re.compile(
            r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}"
            r"|\bgithub_pat_[A-Za-z0-9_]{20,}|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_\-]{35}"
        ),
    ),
    (
        "token",
        _rx(
            r"\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=\-]{16,})",
            r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        ),
    ),
    (
        "password",
        _rx(
            r"(?:密码|口令|\b(?:password|passwd|pwd|passcode|pin)\b)(?:\s*(?:for|of)\s+[\w.@-]+)?"
            r"\s*(?:是|为|=|:|：|\bis\b)\s*(?P<secret>[\x21-\x7e]+)"
        ),
    ),
    (
        "api_key",
        _rx(
            r"(?:\b(?:api[_ -]?key|(?:aws[_ -])?secret(?:[_ -]?access)?(?:[_ -]?key)?|private[_ -]?key"
            r"|access[_ -]?token|auth[_ -]?token|token)\b"
            r"|密钥|秘钥|令牌)\s*(?:是|为|=|:|：|\bis\b)\s*(?P<secret>[\x21-\x7e]{6,})"
        ),
    ),
    # Chinese resident ID: region, birth date, sequence, check digit (may be X).
    (
        "id_card",
        re.compile(
            r"(?<!\d)[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}"
            r"[\dXx](?![\dA-Za-z])"
        ),
    ),
    # Bank cards: 16–19 digits, optionally grouped. No Luhn check on purpose: a mistyped
    # card number is still somebody's card number.
    ("bank_card", re.compile(r"(?<!\d)(?:\d[ -]?){15,18}\d(?!\d)")),
)

# Personal but not secret: kept in memories (the user may want their email remembered),
# removed from traces (DESIGN §4.5).
CONTACTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")),
    (
        "phone",
        re.compile(
            r"(?<!\d)(?:\+?86[ -]?)?1[3-9]\d{9}(?!\d)|\+\d{1,3}[ -]?\(?\d{1,4}\)?(?:[ -]?\d{2,4}){2,4}"
            r"|(?<!\d)\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?!\d)"
        ),
    ),
)

_PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+\]")

# Acknowledgements that carry nothing to remember (seed 001 §1.1: "好的", "明白了", "请稍等").
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


def gate(text: str, role: Role) -> GateVerdict:
    """Whether a message may become memory, and its text with secrets replaced."""
    if not _meaningful(text):
        return _drop(text, "empty" if not text.strip() else "filler")
    if INJECTION.search(text):
        return _drop(redact(text), "injection")
    if _is_filler(text):
        return _drop(text, "filler")
    cleaned, kinds = _redact(text, SECRETS)
    if not _meaningful(_PLACEHOLDER.sub("", cleaned)):
        return _drop(cleaned, "empty")
    flags = tuple(f"redacted:{k}" for k in kinds) + _role_flags(role)
    return GateVerdict(keep=True, text=cleaned, reason=None, redacted=bool(kinds), flags=flags)


def redact(text: str) -> str:
    """Secrets, phone numbers and emails replaced: what a trace may show."""
    return _redact(_redact(text, SECRETS)[0], CONTACTS)[0]


def _drop(text: str, reason: str) -> GateVerdict:
    return GateVerdict(keep=False, text=text, reason=reason, redacted=False, flags=())


def _role_flags(role: Role) -> tuple[str, ...]:
    # Tool output is stored apart and can never raise confidence; system text is the
    # agent's configuration, not something the user said.
    return (role.value,) if role in (Role.tool, Role.system) else ()


def _redact(text: str, table: tuple[tuple[str, re.Pattern[str]], ...]) -> tuple[str, list[str]]:
    kinds: list[str] = []
    for kind, pattern in table:
        text, count = pattern.subn(partial(_placeholder, kind=kind), text)
        if count and kind not in kinds:
            kinds.append(kind)
    return text, kinds


def _placeholder(m: re.Match[str], kind: str) -> str:
    if m.re.groupindex.get("secret") is None or m.group("secret") is None:
        return f"[REDACTED:{kind}]"
    start, end = m.span("secret")
    whole = m.group(0)
    return whole[: start - m.start()] + f"[REDACTED:{kind}]" + whole[end - m.start() :]


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
