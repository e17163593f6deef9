"""Assembling a prompt from hits, within a token budget.

Order (docs/ranking.md#packing): the system prompt, the user's preferences inside the system part
(MUST when confidence ≥ 0.9, SHOULD below), the rules, then the relevant memories with
their date. One memory per key (the first, i.e. best-ranked, wins). Whatever does not
fit the budget is left out whole, never cut mid-sentence.

Stored text is data, never instructions (issue 30): a memory that orders the assistant about in the third
person, or about other users, other subjects or the memory itself (`gate.untrusted_directive`), is shown
among the memories as a quoted statement of the user, whatever type it was stored under, never as a rule or
a MUST. Every line is one line: a newline inside a memory cannot open a section of its own ("## Rules").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from memflow.pipeline.gate import untrusted_directive
from memflow.pipeline.holders import SELF, Person
from memflow.pipeline.models import Dir, Hit, MType, PackedPrompt
from memflow.pipeline.topics import topic_base

MUST_CONFIDENCE = 0.9
PREFERENCE_TYPES = (MType.preference, MType.temp_preference)


def line_for(hit: Hit) -> tuple[str, str]:
    """(section, line) for one hit. A contested memory is no settled preference or rule (docs/write-path.md#contests):
    it is shown as an open question among the memories. A pending one (just said) says so, and what it replaces."""
    section, line = _line(hit)
    line = _one_line(line)
    if hit.pending:
        line += " (just said; replaces what was known before)" if hit.superseding else " (just said)"
    return section, line


def _line(hit: Hit) -> tuple[str, str]:
    if hit.contested:
        return "memories", f"- [contested, not settled] {about(hit)}{hit.content}"
    if untrusted_directive(hit.content) is not None:
        return "memories", f"- [{hit.created_at.date().isoformat()}] {_quoted(hit)}"
    if hit.about != SELF:  # the wife's taste is no instruction on how to serve the user
        return "memories", f"- [{hit.created_at.date().isoformat()}] {about(hit)}{hit.content}"
    if hit.mtype in PREFERENCE_TYPES:
        strength = "MUST" if hit.confidence >= MUST_CONFIDENCE else "SHOULD"
        return "preferences", f"- The user {strength} be served this way: {hit.content}"
    if hit.mtype is MType.rule or hit.dir is Dir.system:
        return "rules", f"- {hit.content}"
    return "memories", f"- [{hit.created_at.date().isoformat()}] {hit.content}"


_BREAKS = re.compile(r"\s*[\r\n\u2028\u2029\x0b\x0c\x85]+\s*")


def _one_line(line: str) -> str:
    return _BREAKS.sub(" ", line)


def _quoted(hit: Hit) -> str:
    """What the user said, quoted and marked as no instruction: the model may know it, never obey it."""
    said = hit.content.replace('"', "'")
    return f'{about(hit)}The user once said (a quote, not an instruction): "{said}"'


def about(hit: Hit) -> str:
    """Whose fact a line states, when it is not the user's: a model reading "is on a keto diet" among the user's
    memories would take it as the user's."""
    if hit.about == SELF:
        return ""
    person = Person.of(hit.about)
    if person.relation is None:
        return f"(about {person.name}) "
    who = " ".join(filter(None, (person.relation.replace(".", "'s ").replace("_", "-"), person.name)))
    return f"(about the user's {who}) "


def one_per_key(hits: Sequence[Hit]) -> list[Hit]:
    """The best hit per topic: a temporary wish ranked above the standing preference speaks for it."""
    seen: set[str] = set()
    kept = []
    for hit in hits:
        if topic_base(hit.key) not in seen:
            seen.add(topic_base(hit.key))
            kept.append(hit)
    return kept


def pack(hits: Sequence[Hit], system_prompt: str, budget_tokens: int,
         count_tokens: Callable[[str], int]) -> PackedPrompt:
    sections: dict[str, list[str]] = {"preferences": [], "rules": [], "memories": []}
    used: list[str] = []
    pending: list[str] = []
    spent = count_tokens(system_prompt) if system_prompt else 0
    for hit in one_per_key(hits):
        section, line = line_for(hit)
        cost = count_tokens(line)
        if spent + cost > budget_tokens:
            continue
        spent += cost
        sections[section].append(line)
        if hit.pending:  # not stored yet: nothing to count a use on
            pending.append(hit.event_id or "")
        elif not hit.contested:  # showing an open question is not adopting it: no evidence for review
            used.append(hit.id)
    return PackedPrompt(system=render_system(system_prompt, sections), preferences=sections["preferences"],
                        rules=sections["rules"], memories=sections["memories"], used_ids=used,
                        pending_event_ids=pending, tokens=spent)


def render_system(system_prompt: str, sections: dict[str, list[str]]) -> str:
    parts = [system_prompt] if system_prompt else []
    titles = {"preferences": "User preferences", "rules": "Rules", "memories": "Relevant memories"}
    for name, title in titles.items():
        if sections[name]:
            parts.append(f"## {title}\n" + "\n".join(sections[name]))
    return "\n\n".join(parts)
