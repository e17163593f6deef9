"""Directory tagging: which directory of `mem://{subject}/{dir}/…` a memory lives in (docs/write-path.md#directories).

Three steps, first hit wins: the memory's category, then keywords in its content, then
`general`. Keyword order is priority and `system` comes first, or "不能把密码提交到 git"
would land in `tools` for its "git". Keywords are substrings (Chinese has no word
boundaries), so they are a coarse filter; `tag_version` lets a later rule set re-tag
(backfill) what this one placed.
"""

from __future__ import annotations

import re

from memflow.pipeline.holders import SELF, held_key, holder_of
from memflow.pipeline.ids import is_keyed
from memflow.pipeline.models import Dir, Memory, MType, Source

# 2: whom a memory is about (`held`).
TAG_VERSION = 2

# Category → directory. Decisions go to `events` with how they were reached (docs/write-path.md#directories:
# events hold what happened, when, and how it was decided), which is where decision_trace looks.
CATEGORY_DIR: dict[MType, Dir] = {
    MType.rule: Dir.system,
    MType.preference: Dir.preferences,
    MType.temp_preference: Dir.preferences,
    MType.event: Dir.events,
    MType.episode: Dir.events,
    MType.decision: Dir.events,
    MType.skill: Dir.skills,
    MType.pattern: Dir.patterns,
}


def _kw(zh: str, en: str) -> re.Pattern[str]:
    return re.compile(f"{zh}|{en}", re.IGNORECASE)


# Keywords for the rest (facts, insights, session context …), in priority order.
DIR_KEYWORDS: tuple[tuple[Dir, re.Pattern[str]], ...] = (
    (
        Dir.system,
        _kw(
            r"规则|铁律|禁止|严禁|必须|永远不要|不允许|不准|不许",
            r"\brules?\b|\bpolicy\b|\bnever\b|\bmust\b|\bforbidden\b|\bprohibited\b|\bnot allowed\b",
        ),
    ),
    (Dir.preferences, _kw(r"偏好|喜欢|讨厌|风格|习惯", r"\bprefers?\b|\blikes?\b|\bstyle\b|\bhabit\b")),
    # People, places, projects, systems: what entity_recall searches.
    (
        Dir.entities,
        _kw(
            r"项目|公司|团队|同事|经理|领导|老板|住在|搬到|地址|城市|名字|数据库|服务|架构|邮箱|手机号",
            r"\bprojects?\b|\bcompany\b|\bteam\b|\bcolleague\b|\bmanager\b|\bboss\b|\bdatabase\b"
            r"|\blive in\b|\bmoved to\b|\baddress\b|\bname\b|\bemail\b|\barchitecture\b",
        ),
    ),
    (
        Dir.events,
        _kw(
            r"那天|上次|之前|发生|经历|会议|评审|出差|昨天|明天|下周|下个月",
            r"\bmeeting\b|\btrip\b|\byesterday\b|\btomorrow\b|\bnext week\b|\blast week\b",
        ),
    ),
    (Dir.patterns, _kw(r"方法|流程|经验|教训|规律", r"\bpattern\b|\blessons?\b|\bworkflow\b|\bprocess\b")),
    (
        Dir.tools,
        _kw(
            r"插件|配置|安装|部署|工具|命令|脚本|依赖|前端|后端|框架|持续集成",
            r"\bapi\b|\bplugin\b|\bconfig\b|\binstall\b|\bdeploy\b|\bci\b|\bcommand\b|\bscript\b|\bcli\b"
            r"|\bdocker\b|\bgit\b|\bnpm\b|\bpnpm\b|\beditor\b|\bide\b|\bframework\b|\bfrontend\b",
        ),
    ),
    (Dir.skills, _kw(r"技能|怎么做|如何|步骤", r"\bskill\b|\bhow to\b|\bsteps?\b")),
)


def tag_dir(mtype: MType, text: str) -> Dir:
    """The directory for a memory of type `mtype` saying `text`."""
    by_category = CATEGORY_DIR.get(mtype)
    if by_category is not None:
        return by_category
    return next((d for d, pattern in DIR_KEYWORDS if pattern.search(text)), Dir.general)


def place(mtype: MType, source: Source, text: str) -> Dir:
    """Where a memory belongs under the current rules. Tool output always sits in `tools`."""
    return Dir.tools if source is Source.tool else tag_dir(mtype, text)


def retag(memory: Memory, version: int = TAG_VERSION) -> dict[str, object] | None:
    """The fields that bring a memory placed by older rules up to `version`; None when it is current.

    The fields may keep its dir (the rules moved other memories) — the version is still raised, so a
    re-run of the backfill finds nothing left to do.
    """
    if memory.tag_version >= version:
        return None
    where = place(memory.mtype, memory.source, memory.content)
    holder = held(memory)
    key = holder.get("key", memory.key)
    return {"dir": where.value, "uri": f"mem://{memory.subject}/{where.value}/{key}", "tag_version": version, **holder}


def held(memory: Memory) -> dict[str, object]:
    """Whom a memory written before holders were read is about (tag_version 2, pipeline/holders.py), and for a fact
    about someone else the key of its own it would have been given: from then on it is never a rival of the
    user's own facts. Nothing for the user's own, or for tool output (kept apart as it is)."""
    about = holder_of(memory.content)
    if about == memory.about or memory.source is Source.tool:
        return {}
    keyed = is_keyed(memory.mtype) and memory.about == SELF
    return {"about": about, **({"key": held_key(memory.key, about)} if keyed else {})}
